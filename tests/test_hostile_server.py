"""The review server against hostile text and hostile sites, over real HTTP (uvicorn on
127.0.0.1, and `kminer serve` as a process of its own) and in headless Chromium: security
headers on every kind of response, logins and cookie writes from another origin refused,
no CORS, mined text that looks like markup shown as text and never run, a 120 KB hostile kernel
highlighted in linear time, and bad request bodies answered with a one-line 422."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from test_review_ui import CHROMIUM, login
from test_server_api import Served, fill, make_candidate

from curation import curators
from curation.auth import COOKIE
from curation.reviews import Decision, Reviews
from curation.server import MAX_BODY, SECURITY_HEADERS
from curation.ui import highlight
from miner.store import Store

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "<script>alert('kernel')</script>"
IMG = '"><img src=x onerror=alert(1) id=pwned>'
JS_URL = "javascript:alert(document.cookie)"
CLOSE = "</textarea></pre><svg onload=alert(2) id=pwned2>"
EVIL = "http://evil.example"
needs_chromium = pytest.mark.skipif(not CHROMIUM, reason="Debian's chromium is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def add_hostile(store: Store, work: Path) -> None:
    """c0666: markup, a javascript: URL, NUL bytes, invalid UTF-8 and a 200,000-character line
    in every place a page shows text from a repository or a curator."""
    c = make_candidate(666, "pass", op=IMG)
    c.kernel.name, c.kernel.file = SCRIPT + "\x00k", f"ops/{IMG}.cu"
    c.kernel.source = f"__global__ void k() {{ /* {CLOSE} */ }} // {SCRIPT}\n" + "x" * 50_000
    c.provenance.repo_url = JS_URL
    c.wrapper.label_path, c.tests.path = "labels/c0666.cu", "tests/test_c0666.py"
    c.reference.path = f"references/{IMG}.py"
    store.save(c, store.upsert_repo(JS_URL, "ab" * 20, license=SCRIPT))
    for rel, data in (
        (c.wrapper.label_path, f"// {CLOSE}\n__global__ void k() {{}}\n".encode() + b"\xff\xfe\0"),
        (c.reference.path, f'def ref():\n    return "{SCRIPT}"  # {IMG}\n'.encode()),
        (c.tests.path, b"x = '" + b"<" * 200_000 + b"'\n\0"),
    ):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
    store.add_attempt(
        "c0666", attempt=1, step="inputs", prompt=SCRIPT, answer=CLOSE, strategy=IMG, passed=False
    )
    Reviews(store).write(
        "c0666", 0, "ann", "reject", decision=Decision.REJECTED, reason=IMG, note=SCRIPT + "\x00"
    )


@pytest.fixture
def served(tmp_path):
    """A server on a SQLite store with c0000..c0003 (c0000 with a label) and the hostile c0666;
    yields (server, store, ann's token). It also has /boom, a route that fails."""
    work = tmp_path / "w"
    store = Store.open(work)
    fill(store)
    (work / "labels").mkdir()
    (work / "labels" / "c0000.cu").write_text("__global__ void kern0(float* x) {}\n")
    cand = store.get("c0000")
    cand.wrapper.label_path = "labels/c0000.cu"
    store.save(cand)
    add_hostile(store, work)
    token = curators.add(store, "ann")
    srv = Served(store, workdir=work)

    def boom():
        raise RuntimeError("a bug with a secret in its message: kmc_secret")

    srv.server.config.app.add_api_route("/boom", boom)
    with srv:
        yield srv, store, token
    store.close()


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


class Elsewhere:
    """Another origin (127.0.0.1 on another port) serving the given pages: an attacker's site."""

    def __init__(self, pages: dict[str, str]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = pages.get(self.path, "").encode()
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> Elsewhere:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# 1. `kminer serve` as a process of its own


def test_kminer_serve_shows_the_workdir_files_and_takes_a_label_edit(tmp_path):
    work = tmp_path / "w"
    store = Store.open(work)
    fill(store)
    cand = store.get("c0000")
    cand.wrapper.label_path, cand.reference.path = "labels/c0000.cu", "references/c0000.py"
    cand.tests.path = "tests/test_c0000.py"
    store.save(cand)
    store.close()
    texts = {
        cand.wrapper.label_path: "__global__ void kern0_label_text(float* x) {}\n",
        cand.reference.path: "def reference_text_of_kern0(x):\n    return x\n",
        cand.tests.path: "def test_code_text_of_kern0():\n    assert True\n",
    }
    for rel, text in texts.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    cli = [sys.executable, "-m", "miner.cli"]
    added = subprocess.run(
        [*cli, "curator", "add", "ann", "--workdir", str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert added.returncode == 0, added.stderr
    token = added.stdout.split()[-1]
    port = free_port()
    with (tmp_path / "serve.log").open("w") as log:
        proc = subprocess.Popen(
            [*cli, "serve", "--workdir", str(work), "--port", str(port)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=10,
            headers={"Authorization": f"Bearer {token}"},
        )
        deadline = time.time() + 90
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if client.get("/login").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "kminer serve did not answer in 90 s"
            time.sleep(0.2)
        page = client.get("/c/c0000")
        assert page.status_code == 200
        for word in ("kern0_label_text", "reference_text_of_kern0", "test_code_text_of_kern0"):
            assert word in page.text, word
        version = client.get("/api/candidates/c0000").json()["version"]
        body = {"label": "__global__ void kern0(float* x) { x[0] = 2.f; }", "version": version}
        r = client.put("/api/candidates/c0000/label", json=body)
        assert r.status_code == 200, r.text
        assert (work / r.json()["label_path"]).read_text().startswith(body["label"])
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# 2. security headers on every kind of response

RESPONSES = {  # name: (method, path, bearer token?, body, status)
    "page": ("GET", "/login", False, None, 200),
    "redirect": ("GET", "/", False, None, 303),
    "candidate page": ("GET", "/c/c0000", True, None, 200),
    "api": ("GET", "/api/candidates", True, None, 200),
    "api 401": ("GET", "/api/stats", False, None, 401),
    "unknown path": ("GET", "/no/such/page", True, None, 404),
    "bad body": ("POST", "/api/candidates/c0000/review", True, b"{", 422),
    "static script": ("GET", "/static/review.js", False, None, 200),
    "bug": ("GET", "/boom", False, None, 500),
}


@pytest.mark.parametrize("name", RESPONSES)
def test_every_response_carries_the_security_headers(served, name):
    srv, _, token = served
    method, path, bearer, body, status = RESPONSES[name]
    headers = {"Origin": EVIL, "Content-Type": "application/json"}
    r = srv.client(token if bearer else None).request(method, path, content=body, headers=headers)
    assert r.status_code == status, r.text
    for header, value in SECURITY_HEADERS.items():
        assert r.headers.get(header) == value, header
    csp = r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "style-src 'self'" in csp
    assert not [h for h in r.headers if h.lower().startswith("access-control-")]  # no CORS
    if status >= 400:
        assert r.headers["content-type"] == "application/json" and r.json()["message"]
        assert "Traceback" not in r.text and "kmc_secret" not in r.text


def test_no_cors_even_for_a_preflight(served):
    srv = served[0]
    preflight = srv.client().options(
        "/api/candidates/c0000/review",
        headers={
            "Origin": EVIL,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code in (404, 405)
    assert not [h for h in preflight.headers if h.lower().startswith("access-control-")]


# 3. the login refuses another origin


@pytest.mark.parametrize(
    "headers",
    [{"Origin": EVIL}, {"Referer": EVIL + "/attack.html"}, {"Origin": "null"}, {"Origin": ""}],
    ids=["origin", "referer", "opaque origin", "empty origin"],
)
def test_a_login_from_another_origin_is_refused(served, headers):
    srv, _, token = served
    r = srv.client().post("/login", data={"token": token}, headers=headers)
    assert r.status_code == 403 and "another origin" in r.json()["message"]
    assert "set-cookie" not in r.headers


def test_a_login_from_the_server_own_origin_works(served):
    srv, _, token = served
    referer_only = {"Referer": srv.base + "/login"}
    for headers in ({"Origin": srv.base}, referer_only):
        r = srv.client().post("/login", data={"token": token}, headers=headers)
        assert r.status_code == 303 and r.headers["set-cookie"].startswith(COOKIE)


@needs_chromium
def test_in_the_browser_a_cross_site_login_is_refused_and_the_real_one_works(browser, served):
    srv, _, token = served
    form = (
        f'<form id="f" method="post" action="{srv.base}/login">'
        f'<input name="token" value="{token}"></form>'
        "<script>document.getElementById('f').submit()</script>"
    )
    with Elsewhere({"/attack.html": form}) as evil:
        context = browser.new_context()
        page = context.new_page()
        with page.expect_response(lambda r: r.url == srv.base + "/login") as posted:
            page.goto(evil.base + "/attack.html")
        assert posted.value.status == 403 and "another origin" in posted.value.json()["message"]
        assert not [c for c in context.cookies() if c["name"] == COOKIE]
    page = login(browser, srv, token)  # the server's own login page
    assert page.inner_text("#who") == "ann"


# 4. the highlighter in linear time

HOSTILE_SOURCES = {
    "unclosed comments": "__global__ void k() {\n" + "/* x " * 24_000,
    "unterminated strings": ('const char* s = "' + "a\\" * 500 + "\n") * 120,
    "10,000 nested parentheses": ("(" * 10_000 + ")" * 10_000) * 6,
}


@pytest.mark.parametrize("kind", HOSTILE_SOURCES)
def test_a_120_kb_hostile_kernel_page_renders_in_seconds(served, kind):
    srv, store, token = served
    c = make_candidate(777, "pass")
    c.kernel.source = HOSTILE_SOURCES[kind]
    assert len(c.kernel.source) >= 120_000
    store.save(c, store.upsert_repo("https://x/r", "ab" * 20, license="MIT"))
    started = time.perf_counter()
    r = srv.client(token).get("/c/c0777", timeout=60)
    took = time.perf_counter() - started
    assert r.status_code == 200 and took < 10, f"{kind}: {took:.1f} s"
    assert srv.client(token).get("/api/candidates/c0777").status_code == 200


@pytest.mark.parametrize("text", [SCRIPT, IMG, CLOSE, "a & b < c > d \" '"])
def test_highlighted_source_is_escaped(text):
    for path in ("k.cu", "ref.py"):
        got = str(highlight(f"// {text}\nint x = 1; s = '{text}'\n", path))
        bare = re.sub(r'<span class="\w+">|</span>', "", got)  # the highlighter's own tags
        assert "<" not in bare and "&lt;" in bare  # every other one escaped


# 5. hostile text in the pages


@needs_chromium
def test_hostile_text_is_shown_as_text_and_never_runs(browser, served):
    srv, _, token = served
    body = {"instruction": CLOSE + SCRIPT, "version": 1}
    assert srv.client(token).put("/api/candidates/c0666/instruction", json=body).status_code == 200
    api = srv.client(token).get("/api/candidates/c0666")
    assert api.status_code == 200 and api.json()["kernel"] == SCRIPT + "\x00k"
    page = login(browser, srv, token)
    dialogs, csp_errors = [], []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("console", lambda m: "Content Security Policy" in m.text and csp_errors.append(m.text))
    for url in ("/", "/c/c0666"):
        assert page.goto(srv.base + url).status == 200
        page.wait_for_load_state("load")
        for injected in ("#pwned", "#pwned2", "img", "svg", "iframe", "a[href^='javascript']"):
            assert page.locator(injected).count() == 0, (url, injected)
        scripts = page.evaluate("Array.from(document.scripts).map(s => s.src)")
        assert scripts == [srv.base + "/static/review.js"], url
        assert SCRIPT in page.inner_text("main") and IMG in page.inner_text("main")
    assert page.inner_text("#kernel") == SCRIPT + "\ufffdk"  # the NUL shown, not dropped
    assert page.inner_text("#reason") == IMG and JS_URL in page.inner_text("#provenance")
    assert page.input_value("#instruction") == CLOSE + SCRIPT
    assert page.input_value("#label").startswith(f"// {CLOSE}\n")
    assert "\ufffd\ufffd" in page.input_value("#label")  # the invalid UTF-8, replaced
    assert "<" * 200_000 in page.inner_text("main")  # the 200,000-character line, whole
    page.keyboard.press("e")  # the page's own script still runs
    assert page.evaluate("document.activeElement.id") == "instruction"
    assert dialogs == [] and csp_errors == []


@needs_chromium
def test_the_pages_own_styles_and_keys_work_under_the_policy(browser, served):
    srv, _, token = served
    page = login(browser, srv, token)
    refused = []  # what the policy blocked (an inline script or style left in a page)
    page.on("console", lambda m: "Content Security Policy" in m.text and refused.append(m.text))
    page.goto(srv.base + "/c/c0000")
    color = page.eval_on_selector("pre span.kr", "e => getComputedStyle(e).color")
    assert color == "rgb(130, 80, 223)"  # review.css applied to the highlighted source
    page.keyboard.press("k")  # the previous candidate in the queue's order
    page.wait_for_url("**/c/c0666")
    assert refused == []


# 5. (and) bad request bodies: a one-line 422, nothing written


def review(**fields) -> str:
    return json.dumps({"decision": "accept", "version": 0, **fields})


BAD_BODIES = {  # name: (where, raw body, a word the message names)
    "not JSON": ("review", b'{"decision": ', "JSON"),
    "not UTF-8": ("review", b'{"decision": "accept", "note": "\xff\xfe", "version": 0}', "parsed"),
    "nested 100,000 deep": ("review", b"[" * 100_000 + b"]" * 100_000, "parsed"),
    "an array": ("review", b"[1, 2]", "object"),
    "a NUL in the note": ("review", review(note="a\0"), "NUL"),
    "a lone surrogate": (
        "review",
        b'{"decision": "accept", "note": "\\ud800", "version": 0}',
        "unicode",
    ),
    "a note too long": ("review", review(note="n" * 4001), "4000"),
    "a reason too long": ("review", review(decision="reject", reason="r" * 100_000), "64"),
    "a version not a number": ("review", review(version="x"), "version"),
    "a body over the limit": ("review", review(note="n" * MAX_BODY), f"{MAX_BODY} bytes"),
    "a label too long": ("label", json.dumps({"label": "x" * 2_000_001, "version": 0}), "2000000"),
    "a NUL in a label": ("label", json.dumps({"label": "__global__\0", "version": 0}), "NUL"),
    "a NUL in an instruction": (
        "instruction",
        json.dumps({"instruction": "\0", "version": 0}),
        "NUL",
    ),
}


@pytest.mark.parametrize("name", BAD_BODIES)
def test_a_bad_body_is_a_one_line_422(served, name):
    srv, store, token = served
    action, body, word = BAD_BODIES[name]
    method = "POST" if action == "review" else "PUT"
    r = srv.client(token).request(
        method,
        f"/api/candidates/c0000/{action}",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text[:300]
    message = r.json()["message"]
    assert message.startswith("bad request") and "\n" not in message and len(message) < 300
    assert word in message, message
    assert Reviews(store).audit("c0000") == []


def test_a_nul_in_the_url_or_a_form_is_refused_not_stored(served):
    srv, store, token = served
    r = srv.client(token).get("/api/candidates/c0000%00")
    assert r.status_code == 422 and "NUL" in r.json()["message"]
    assert srv.client(token).get("/api/candidates?op=nms%00").status_code == 422
    session = curators.open_session(store, "ann")
    csrf = curators.by_session(store, session).csrf
    form = {"csrf": csrf, "decision": "accept", "note": "a\0b", "version": "0"}
    r = srv.client(cookies={COOKIE: session}).post("/c/c0000/review", data=form)
    assert r.status_code == 422 and "NUL byte" in r.text  # the page, with the reason
    assert Reviews(store).audit("c0000") == []


# 6. writes from another origin

WRITES = {  # name: (bearer?, CSRF token?, extra headers, status, a word its message names)
    "cookie without CSRF token": (False, False, {}, 403, "CSRF"),
    "cookie from another origin": (False, True, {"Origin": EVIL}, 403, "another origin"),
    "cookie, Referer of another origin": (False, True, {"Referer": EVIL}, 403, "another origin"),
    "cookie from the server's origin": (False, True, {"Origin": "SELF"}, 200, ""),
    "bearer token from another origin": (True, False, {"Origin": EVIL}, 200, ""),
}


@pytest.mark.parametrize("name", WRITES)
def test_cookie_writes_need_the_server_origin_and_bearer_writes_do_not(served, name):
    srv, store, token = served
    bearer, with_csrf, headers, status, word = WRITES[name]
    headers = {k: srv.base if v == "SELF" else v for k, v in headers.items()}
    if bearer:
        client = srv.client(token)
    else:
        session = curators.open_session(store, "ann")
        client = srv.client(cookies={COOKIE: session})
        if with_csrf:
            headers["X-CSRF-Token"] = curators.by_session(store, session).csrf
    body = {"decision": "needs_edit", "version": 0}
    r = client.post("/api/candidates/c0000/review", json=body, headers=headers)
    assert r.status_code == status, r.text
    assert "access-control-allow-origin" not in r.headers
    assert word in r.json().get("message", "")
    assert len(Reviews(store).audit("c0000")) == (1 if status == 200 else 0)


@needs_chromium
def test_another_origin_page_can_neither_read_nor_write_with_the_curator_cookie(browser, served):
    srv, store, token = served
    page = login(browser, srv, token)
    form = (
        f'<form id="f" method="post" action="{srv.base}/c/c0000/review">'
        '<input name="decision" value="accept"><input name="version" value="0"></form>'
    )
    with Elsewhere({"/attack.html": form}) as evil:
        page.goto(evil.base + "/attack.html")
        read = page.evaluate(
            """async (url) => { try { await fetch(url, {credentials: 'include'});
                return 'read'; } catch (e) { return 'blocked'; } }""",
            srv.base + "/api/candidates",
        )
        assert read == "blocked"  # no CORS: the answer never reaches the other origin
        with page.expect_response(lambda r: r.request.method == "POST") as posted:
            page.evaluate("document.getElementById('f').submit()")
        assert posted.value.status == 403 and "another origin" in posted.value.json()["message"]
    assert Reviews(store).audit("c0000") == []
