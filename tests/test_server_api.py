"""The review server's JSON API over real HTTP (uvicorn on 127.0.0.1), on SQLite and on a
PostgreSQL server the test starts: every status code, the audit trail, versions and CSRF."""

from __future__ import annotations

import hashlib
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest
import uvicorn

from curation import curators
from curation.auth import COOKIE
from curation.reviews import Reviews
from curation.server import create_app
from miner.candidate import Candidate, Kernel, Provenance, Reason, StageName, StageResult, Status
from miner.store import Store


def make_candidate(i: int, outcome: str | None, kill: float = 1.0, op: str = "roi_align"):
    k = Kernel(
        name=f"kern{i}",
        file=f"ops/k{i}.cu",
        line=10 * i,
        start_line=10 * i,
        end_line=10 * i + 5,
        source="__global__ void k() {}",
    )
    c = Candidate(
        id=f"c{i:04d}", provenance=Provenance(repo_url="https://x/r", commit="ab" * 20), kernel=k
    )
    c.wrapper.strategy, c.wrapper.op_map = "mined", {"python_name": op}
    c.reference.kind = "cpp" if outcome else ""
    if outcome:
        metrics = {"outcome": outcome, "kill_rate": kill, "kernel_time_us": 10.0 + i}
        c.set_stage(StageName.VERIFY, StageResult(status=Status.OK, metrics=metrics))
    else:
        c.set_stage(
            StageName.TESTGEN, StageResult(status=Status.SKIPPED, reason=Reason.NO_REFERENCE)
        )
    return c


def fill(store: Store) -> None:
    repo = store.upsert_repo("https://x/r", "ab" * 20, license="MIT")
    cands = [make_candidate(0, "pass"), make_candidate(1, "weak_test", 0.67)]
    cands += [make_candidate(2, None, op="nms"), make_candidate(3, "pass", op="nms")]
    store.save(cands, repo)


class Served:
    def __init__(self, store: Store, public_read: bool = False, workdir=None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(
            create_app(store, public_read=public_read, workdir=workdir),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.base = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started and time.time() < deadline:
            time.sleep(0.05)
        assert self.server.started
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def client(self, token: str | None = None, **kw) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base, headers=headers, timeout=10, **kw)


def fresh_database(server_url: str) -> str:
    """The URL of a new, empty database on the test's PostgreSQL server."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = Store(server_url)
    with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.close()
    return server_url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = Store.open(tmp_path)
    else:
        s = Store(fresh_database(request.getfixturevalue("postgres_url")))
    fill(s)
    yield s
    s.close()


def test_reads_need_a_curator_and_a_revoked_one_is_refused(store):
    ann = curators.add(store, "ann")
    with Served(store) as srv:
        r = srv.client().get("/api/candidates")
        assert r.status_code == 401 and "Bearer" in r.json()["message"]
        assert srv.client("kmc_wrong").get("/api/stats").status_code == 401
        r = srv.client(ann).get("/api/candidates")
        assert r.status_code == 200 and r.json()["total"] == 4
        curators.revoke(store, "ann")
        r = srv.client(ann).get("/api/candidates")
        assert r.status_code == 403 and "revoked" in r.json()["message"]


def test_public_read_still_needs_a_curator_to_write(store):
    with Served(store, public_read=True) as srv:
        anyone = srv.client()
        assert anyone.get("/api/candidates/c0000").json()["version"] == 0
        r = anyone.post("/api/candidates/c0000/review", json={"decision": "accept", "version": 0})
        assert r.status_code == 401
    assert Reviews(store).audit() == [] and Reviews(store).get("c0000")["decision"] == "pending"


def test_accept_then_a_stale_write_is_a_conflict_showing_the_newer_state(store):
    ann, bob = curators.add(store, "ann"), curators.add(store, "bob")
    with Served(store) as srv:
        body = {"decision": "accept", "note": "clean", "version": 0}
        r = srv.client(ann).post("/api/candidates/c0000/review", json=body)
        assert r.status_code == 200 and r.json()["version"] == 1
        r = srv.client(bob).post(
            "/api/candidates/c0000/review",
            json={"decision": "reject", "reason": "other", "version": 0},
        )
        assert r.status_code == 409
        assert r.json()["current"]["decision"] == "accepted" and "by ann" in r.json()["message"]
        got = srv.client(bob).get("/api/candidates/c0000").json()
        assert (got["version"], got["review"]["decision"]) == (1, "accepted")
    (row,) = Reviews(store).audit("c0000")
    assert (row["curator"], row["action"]) == ("ann", "accept")
    assert row["before"]["decision"] == "pending" and row["after"]["decision"] == "accepted"
    assert row["after"]["note"] == "clean" and row["after"]["override"] is False


def test_only_a_passing_strong_test_is_accepted_unless_overridden(store):
    ann = curators.add(store, "ann")
    with Served(store) as srv:
        c = srv.client(ann)
        for cid in ("c0001", "c0002"):  # weak test; no reference at all
            r = c.post(f"/api/candidates/{cid}/review", json={"decision": "accept", "version": 0})
            assert r.status_code == 422 and "cannot accept" in r.json()["message"]
        r = c.post(
            "/api/candidates/c0001/review",
            json={"decision": "accept", "version": 0, "override": True, "note": "checked by hand"},
        )
        assert r.status_code == 200 and r.json()["override"] is True
    (row,) = Reviews(store).audit("c0001")
    assert row["action"] == "override_accept" and row["after"]["override"] is True
    assert Reviews(store).audit("c0002") == []


def test_bad_bodies_and_unknown_candidates(store):
    ann = curators.add(store, "ann")
    with Served(store) as srv:
        c = srv.client(ann)
        bad = [
            {"decision": "accept"},  # no version
            {"decision": "maybe", "version": 0},
            {"decision": "reject", "version": 0},  # no reason
            {"decision": "reject", "reason": "looks odd", "version": 0},  # not a listed reason
            {"decision": "accept", "version": -1},
        ]
        for body in bad:
            r = c.post("/api/candidates/c0000/review", json=body)
            assert r.status_code == 422 and r.json()["message"], body
        r = c.post("/api/candidates/nope/review", json={"decision": "accept", "version": 0})
        assert r.status_code == 404 and "nope" in r.json()["message"]
        assert c.get("/api/candidates/nope").status_code == 404
        r = c.post(
            "/api/candidates/c0003/review",
            json={"decision": "reject", "reason": "duplicate", "note": "as c0000", "version": 0},
        )
        assert r.status_code == 200 and r.json()["reason"] == "duplicate"
    assert [a["action"] for a in Reviews(store).audit()] == ["reject"]


def test_instruction_edits_are_versioned_and_audited(store):
    ann = curators.add(store, "ann")
    with Served(store) as srv:
        c = srv.client(ann)
        body = {"instruction": "Write the ROI Align forward kernel.", "version": 0}
        r = c.put("/api/candidates/c0000/instruction", json=body)
        assert r.status_code == 200 and r.json()["instruction"] == body["instruction"]
        assert c.put("/api/candidates/c0000/instruction", json=body).status_code == 409
        assert c.put("/api/candidates/c0000/instruction", json={"version": 1}).status_code == 422
    (row,) = Reviews(store).audit("c0000")
    assert row["action"] == "edit_instruction" and row["before"]["instruction"] is None
    assert Reviews(store).get("c0000")["decision"] == "pending"  # an edit is no verdict


def test_generated_instructions_are_shown_and_only_real_edits_are_kept(store):
    from curation.instructions import derive_instruction

    ann = curators.add(store, "ann")
    with Served(store) as srv:
        c = srv.client(ann)
        made = c.get("/api/candidates/c0000").json()["instructions"]
        assert made["edited"] is False
        assert made["instruction_complete"].startswith("Write the CUDA kernel `kern0`")
        assert made["instruction"] == derive_instruction(made["instruction_complete"])
        body = {**made, "version": 0}  # sent back unchanged: nothing is an edit
        assert c.put("/api/candidates/c0000/instruction", json=body).status_code == 200
        review = Reviews(store).get("c0000")
        assert (review["instruction"], review["instruction_complete"]) == (None, None)
        complete = "Write kern0.\n\n## What it computes\nSums the rows of `x`.\n"
        body = {"instruction": made["instruction"], "instruction_complete": complete, "version": 1}
        assert c.put("/api/candidates/c0000/instruction", json=body).status_code == 200
        now = c.get("/api/candidates/c0000").json()["instructions"]
    review = Reviews(store).get("c0000")
    assert (review["instruction"], review["instruction_complete"]) == (None, complete)
    assert now == {
        "instruction": "Write kern0. It sums the rows of `x`.",
        "instruction_complete": complete,
        "edited": True,
    }


def test_filters_sorting_paging_and_stats(store):
    ann = curators.add(store, "ann")
    with Served(store) as srv:
        c = srv.client(ann)
        assert [i["id"] for i in c.get("/api/candidates?outcome=pass").json()["items"]] == [
            "c0000",
            "c0003",
        ]
        got = c.get("/api/candidates?op=nms&sort=-kernel").json()["items"]
        assert [i["id"] for i in got] == ["c0003", "c0002"]
        assert c.get("/api/candidates?outcome=no_reference").json()["total"] == 1
        assert c.get("/api/candidates?repo=x/r&reference_kind=cpp").json()["total"] == 3
        c.post("/api/candidates/c0003/review", json={"decision": "needs_edit", "version": 0})
        listing = c.get("/api/candidates?status=needs_edit&page=9").json()
        assert [i["id"] for i in listing["items"]] == ["c0003"] and listing["page"] == 1
        assert listing["counts"] == {"pending": 3, "accepted": 0, "rejected": 0, "needs_edit": 1}
        stats = c.get("/api/stats").json()
        assert stats["candidates"] == 4 and stats["outcomes"]["pass"] == 2
        assert stats["decisions"]["needs_edit"] == 1


def test_a_browser_session_must_echo_its_csrf_token(store):
    curators.add(store, "ann")
    session = curators.open_session(store, "ann")
    csrf = curators.by_session(store, session).csrf
    with Served(store) as srv:
        browser = srv.client(cookies={COOKIE: session})
        assert browser.get("/api/candidates").status_code == 200
        body = {"decision": "accept", "version": 0}
        r = browser.post("/api/candidates/c0000/review", json=body)
        assert r.status_code == 403 and "CSRF" in r.json()["message"]
        r = browser.post(
            "/api/candidates/c0000/review", json=body, headers={"X-CSRF-Token": "forged"}
        )
        assert r.status_code == 403
        r = browser.post("/api/candidates/c0000/review", json=body, headers={"X-CSRF-Token": csrf})
        assert r.status_code == 200 and r.json()["curator"] == "ann"
        curators.revoke(store, "ann")  # ends the session too
        assert browser.get("/api/candidates").status_code == 401


def test_curator_commands_print_the_token_once_and_keep_only_its_hash(tmp_path):
    work = tmp_path / "w"
    store = Store.open(work)
    fill(store)
    cli = [sys.executable, "-m", "miner.cli", "curator"]

    def run(*args):
        return subprocess.run([*cli, *args, "--workdir", str(work)], capture_output=True, text=True)

    added = run("add", "ann")
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip().splitlines()[-1].split()[-1]
    assert token.startswith("kmc_") and curators.by_token(store, token).name == "ann"
    with sqlite3.connect(work / "kminer.db") as raw:  # (not open(): closing it would drop
        dump = "\n".join(raw.iterdump())  # this process's SQLite locks on the file)
    assert token not in dump and hashlib.sha256(token.encode()).hexdigest() in dump
    again = run("add", "ann")
    assert again.returncode != 0 and "exists" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert "ann" in run("list").stdout and "active" in run("list").stdout
    revoked = run("revoke", "ann")
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked" in run("list").stdout, run("list").stdout
    assert curators.by_token(store, token).revoked
    missing = run("revoke", "zed")
    assert missing.returncode != 0 and "no curator 'zed'" in missing.stderr
    store.close()


def test_login_sets_an_httponly_samesite_session_and_logout_ends_it(store):
    ann = curators.add(store, "ann")
    with Served(store) as srv:
        browser = srv.client()
        assert browser.post("/login", data={"token": "kmc_wrong"}).status_code == 401
        r = browser.post("/login", data={"token": ann})
        assert r.status_code == 303
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(COOKIE) and "HttpOnly" in cookie and "SameSite=lax" in cookie
        assert ann not in cookie  # the cookie is a session id, never the token
        assert browser.get("/api/candidates").status_code == 200
        session = browser.cookies[COOKIE]
        csrf = curators.by_session(store, session).csrf
        assert browser.post("/logout").status_code == 403  # a write: the CSRF token is needed
        assert browser.post("/logout", headers={"X-CSRF-Token": csrf}).status_code == 303
        assert curators.by_session(store, session) is None  # ended in the store, not only here
        stale = srv.client(cookies={COOKIE: session})
        assert stale.get("/api/candidates").status_code == 401


def test_a_label_edit_is_a_new_revision_that_must_be_verified_again(store, tmp_path):
    ann = curators.add(store, "ann")
    work = tmp_path / "work"
    (work / "labels").mkdir(parents=True)
    (work / "labels" / "c0000.cu").write_text("__global__ void kern0() {}\n")
    cand = store.get("c0000")
    cand.wrapper.label_path, cand.wrapper.label_hash = "labels/c0000.cu", "old"
    store.save(cand)
    with Served(store, workdir=work) as srv:
        c = srv.client(ann)
        assert c.post("/api/candidates/c0000/review", json={"decision": "accept", "version": 0})
        body = {"label": "__global__ void kern0() { /* fixed */ }", "version": 1}
        r = c.put("/api/candidates/c0000/label", json=body)
        assert r.status_code == 200 and r.json()["label_path"] == "labels/c0000.r1.cu"
        assert r.json()["decision"] == "pending" and r.json()["version"] == 2
        assert c.put("/api/candidates/c0000/label", json=body).status_code == 409  # stale
        r = c.post("/api/candidates/c0000/review", json={"decision": "accept", "version": 2})
        assert r.status_code == 422 and "verify outcome is missing" in r.json()["message"]
    edited = store.get("c0000")
    assert (
        edited.wrapper.label_path == "labels/c0000.r1.cu" and edited.stage(StageName.VERIFY) is None
    )
    assert edited.wrapper.label_hash != "old"
    assert "fixed" in (work / edited.wrapper.label_path).read_text()
    assert (work / "labels" / "c0000.cu").read_text() == "__global__ void kern0() {}\n"  # kept
    row = Reviews(store).audit("c0000")[-1]
    assert row["action"] == "edit_label" and row["before"]["label_path"] == "labels/c0000.cu"
    assert row["after"]["label_path"] == "labels/c0000.r1.cu"
    assert (row["before"]["decision"], row["after"]["decision"]) == ("accepted", "pending")
