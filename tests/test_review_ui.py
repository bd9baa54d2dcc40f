"""The review UI in headless Chromium (Debian's package, driven by Playwright) against a server
on 127.0.0.1, on SQLite and on PostgreSQL: log in, filter, open a candidate, accept, reject with a
reason, edit an instruction, the conflict case and a write without login. Screenshots of the
queue and of a candidate page are kept under tests/artifacts/ (gitignored)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
from test_server_api import Served, fill, fresh_database

from curation import curators
from curation.store import Store
from miner.candidate import Stage

_PLACES = ("/usr/lib/chromium/chromium", shutil.which("chromium") or "")
CHROMIUM = next((p for p in _PLACES if Path(p).is_file()), "")
ARTIFACTS = Path(__file__).parent / "artifacts"
pytestmark = pytest.mark.skipif(not CHROMIUM, reason="Debian's chromium package is not installed")


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


@pytest.fixture(params=["sqlite", "postgres"])
def served(request, tmp_path):
    if request.param == "sqlite":
        store = Store.open(tmp_path / "w")
    else:
        store = Store(fresh_database(request.getfixturevalue("postgres_url")))
    fill(store)
    (tmp_path / "w" / "labels").mkdir(parents=True)
    (tmp_path / "w" / "labels" / "c0000.cu").write_text("__global__ void kern0(float* x) {}\n")
    cand = store.get("c0000")
    cand.wrapper.label_path = "labels/c0000.cu"
    case = {"id": "recorded_0", "shape": [[4, 7]], "dtype": "float32", "max_abs": 2e-7}
    cand.stage(Stage.VERIFY).metrics["cases"] = [{**case, "max_rel": 1e-7, "ok": True}]
    store.save(cand)
    store.add_attempt(
        "c0000",
        attempt=1,
        step="inputs",
        prompt="[kminer:inputs] kernel=kern0: write make_calls",
        answer='{"strategy": "three sizes", "code": "def make_calls(): ..."}',
        strategy="three sizes",
        passed=True,
    )
    tokens = {name: curators.add(store, name) for name in ("ann", "bob")}
    with Served(store, workdir=tmp_path / "w") as srv:
        yield srv, store, tokens
    store.close()


def login(browser, srv, token: str):
    page = browser.new_page()
    page.goto(srv.base + "/")
    assert page.url.endswith("/login")
    page.fill("#token", token)
    page.click("#login")
    page.wait_for_url(srv.base + "/")
    return page


def test_curator_reviews_in_the_browser(browser, served):
    srv, store, tokens = served
    page = login(browser, srv, tokens["ann"])
    assert page.inner_text("#who") == "ann" and page.inner_text("#total") == "4"
    page.select_option("#f-outcome", "pass")
    page.click("#apply")
    page.wait_for_url("**outcome=pass**")
    assert page.locator("#queue tbody tr").count() == 2
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "queue.png"), full_page=True)
    page.keyboard.press("j")  # keyboard: first row, then open it
    page.keyboard.press("Enter")
    page.wait_for_url("**/c/c0000")
    assert page.inner_text("#kernel") == "kern0" and "kern0(float* x)" in page.inner_text("main")
    assert page.locator("pre span.kw", has_text="__global__").count() >= 1  # highlighted
    assert "(0.0001, 0.0001)" in page.inner_text("#cases")  # the dtype's tolerance
    page.click("details.attempt summary")
    assert "[kminer:inputs] kernel=kern0" in page.inner_text("details.attempt")
    page.screenshot(path=str(ARTIFACTS / "candidate.png"), full_page=True)
    page.keyboard.press("a")  # accept
    page.wait_for_url("**/c/c0000?saved=1")
    assert page.inner_text("#decision") == "accepted" and page.inner_text("#version") == "1"
    page.fill("#instruction", "Write the ROI Align forward kernel in CUDA.")
    page.click("#save-instruction")
    page.wait_for_url("**saved=2")
    assert page.input_value("#instruction") == "Write the ROI Align forward kernel in CUDA."
    page.click("#label-edit summary")  # a label edit: a new revision, back to pending
    page.fill("#label", "__global__ void kern0(float* x) { x[0] = 1.f; }")
    page.click("#save-label")
    page.wait_for_url("**saved=3")
    assert page.inner_text("#decision") == "pending" and "x[0] = 1.f" in page.inner_text("main")
    assert store.get("c0000").wrapper.label_path == "labels/c0000.r1.cu"
    page.goto(srv.base + "/c/c0003")
    page.keyboard.press("r")  # focuses the reason: rejecting needs one
    page.select_option("#reject-reason", "duplicate")
    page.fill("#reject-note", "same body as c0000")
    page.click("#reject")
    page.wait_for_url("**/c/c0003?saved=1")
    assert page.inner_text("#decision") == "rejected" and page.inner_text("#reason") == "duplicate"
    assert "decision: 'pending' → 'rejected'" in page.inner_text("#history")
    actions = [(a["curator"], a["cand_id"], a["action"]) for a in store.audit()]
    assert actions == [
        ("ann", "c0000", "accept"),
        ("ann", "c0000", "edit_instruction"),
        ("ann", "c0000", "edit_label"),
        ("ann", "c0003", "reject"),
    ]


def test_the_second_of_two_curators_sees_the_conflict_and_the_newer_state(browser, served):
    srv, store, tokens = served
    ann, bob = login(browser, srv, tokens["ann"]), login(browser, srv, tokens["bob"])
    for page in (ann, bob):
        page.goto(srv.base + "/c/c0003")
    ann.click("#needs-edit")
    ann.wait_for_url("**saved=1")
    bob.select_option("#reject-reason", "other")
    with bob.expect_response(lambda r: r.request.method == "POST") as posted:
        bob.click("#reject")
    assert posted.value.status == 409
    assert "conflict" in bob.inner_text("#flash") and "by ann" in bob.inner_text("#flash")
    assert bob.inner_text("#decision") == "needs_edit" and bob.inner_text("#version") == "1"
    assert store.review("c0003")["decision"] == "needs_edit"


def test_a_weak_test_is_accepted_only_by_override_and_flagged(browser, served):
    srv, store, tokens = served
    page = login(browser, srv, tokens["ann"])
    page.goto(srv.base + "/c/c0001")
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        page.click("#accept")
    assert posted.value.status == 422 and "cannot accept" in page.inner_text("#flash")
    page.check("#override-box")
    page.click("#accept")
    page.wait_for_url("**saved=1")
    assert page.is_visible("#override") and store.review("c0001")["override"] is True


def test_writes_without_login_or_csrf_are_refused(browser, served):
    srv, store, _ = served
    page = browser.new_page()
    page.goto(srv.base + "/c/c0000")
    assert page.url.endswith("/login")  # reading needs a curator too
    r = httpx.post(srv.base + "/c/c0000/review", data={"decision": "accept", "version": "0"})
    assert r.status_code == 401
    page = login(browser, srv, served[2]["ann"])
    status = page.evaluate(  # the session cookie alone, without the form's CSRF token
        """async () => (await fetch('/c/c0000/review', {method: 'POST',
            headers: {'Content-Type': 'application/x-www-form-urlencoded'},
            body: 'decision=accept&version=0'})).status"""
    )
    assert status == 403 and store.audit() == []
