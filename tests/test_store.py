"""The store on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import pytest

from curation.reviews import Decision, Reviews, VersionConflict
from miner.candidate import Candidate, Kernel, Provenance, Reason, StageName, StageResult, Status
from miner.store import Store


def _candidate(i: int) -> Candidate:
    k = Kernel(
        name=f"k{i}",
        file="a.cu",
        line=i,
        start_line=i,
        end_line=i + 3,
        source="__global__ void k() {}",
    )
    return Candidate(id=f"id{i:03d}", provenance=Provenance(repo_url="r", commit="c"), kernel=k)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = Store.open(tmp_path)
    else:
        s = Store(request.getfixturevalue("postgres_url"))
        for table in ("candidates", "queue", "repos", "file_skips", "compile_cache", "runs"):
            s.engine.dispose()
            with s.engine.begin() as conn:
                conn.exec_driver_sql(f"DELETE FROM {table}")
    yield s
    s.close()


def test_candidates_round_trip_and_update(store):
    repo_id = store.upsert_repo("r", "c", license="MIT")
    store.save([_candidate(i) for i in (3, 1, 2)], repo_id)
    got = store.candidates(repo_id)
    assert [c.id for c in got] == ["id001", "id002", "id003"]
    c = got[0]
    c.set_stage(
        StageName.COMPILE,
        StageResult(status=Status.ERROR, reason=Reason.COMPILE_ERROR, detail="line 3: boom"),
    )
    store.save(c, repo_id)
    again = store.get("id001")
    assert again.stage(StageName.COMPILE).reason == Reason.COMPILE_ERROR
    assert again.stage(StageName.COMPILE).detail == "line 3: boom"
    assert store.repo(repo_id).license == "MIT"


def test_compile_cache_skips_and_runs(store):
    assert store.cached_compile("k1") is None
    store.put_compile(
        "k1",
        status="ok",
        reason=None,
        detail="",
        compiled_types=["float"],
        text="unit",
        log="",
        seconds=1.5,
    )
    hit = store.cached_compile("k1")
    assert hit.status == "ok" and hit.compiled_types == ["float"] and hit.text == "unit"
    repo_id = store.upsert_repo("r", "c")
    store.replace_file_skips(repo_id, [("x.mu", "non_cuda_backend")])
    store.replace_file_skips(repo_id, [("y.mlu", "non_cuda_backend")])
    assert store.file_skips(repo_id) == [("y.mlu", "non_cuda_backend")]
    run = store.start_run("mine r")
    store.finish_run(run, "ok", repo_id, {"discover": 1.0}, {"compiled": 2})
    assert store.last_run().counts == {"compiled": 2}


def test_review_writes_are_versioned_and_audited(store):
    assert Reviews(store).get("k1") == {
        **Reviews(store).get("k1"),
        "decision": "pending",
        "version": 0,
    }
    first = Reviews(store).write("k1", 0, "ann", "review", decision=Decision.ACCEPTED, note="ok")
    assert (first["decision"], first["curator"], first["version"]) == ("accepted", "ann", 1)
    assert first["reviewed_at"]
    # bob acted on version 0 too: his write is refused and he sees ann's state
    with pytest.raises(VersionConflict) as conflict:
        Reviews(store).write("k1", 0, "bob", "review", decision=Decision.REJECTED)
    assert conflict.value.current["curator"] == "ann" and conflict.value.current["version"] == 1
    second = Reviews(store).write("k1", 1, "bob", "edit_instruction", instruction="Write it.")
    assert (second["decision"], second["instruction"], second["version"]) == (
        "accepted",
        "Write it.",
        2,
    )
    assert second["reviewed_at"] == first["reviewed_at"]  # an edit is not a new verdict
    assert Reviews(store).get("k1") == second
    assert (
        list(Reviews(store).all(Decision.ACCEPTED)) == ["k1"]
        and Reviews(store).all("rejected") == {}
    )
    trail = Reviews(store).audit("k1")
    assert [(a["curator"], a["action"]) for a in trail] == [
        ("ann", "review"),
        ("bob", "edit_instruction"),
    ]
    assert trail[1]["before"] == first and trail[1]["after"] == second
    with pytest.raises(ValueError, match="not a review field"):
        Reviews(store).write("k1", 2, "ann", "review", version=7)


def test_a_store_from_before_a_column_existed_gets_it(tmp_path):
    import sqlite3

    Store.open(tmp_path).close()
    with sqlite3.connect(tmp_path / "kminer.db") as db:  # as an older kminer left it
        db.execute("ALTER TABLE wrap_attempts DROP COLUMN prompt")
    store = Store.open(tmp_path)
    store.add_attempt("k1", attempt=1, step="code", prompt="Write the host code.")
    assert store.attempts("k1")[0]["prompt"] == "Write the host code."
    store.close()
