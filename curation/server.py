"""The review server: the app that serves the JSON API (api.py) and the pages (ui.py).

`create_app` is what `kminer serve` runs and what the tests build; it is handed the store and the
workdir whose files (labels, references, tests) the candidate pages show.

The server shows text mined from strangers' repositories and written by curators, so every
response carries headers that keep a page from running anything but the server's own files
(`Guard`): a Content-Security-Policy with no inline script or style (the pages load
/static/review.js and /static/review.css), no framing, no MIME sniffing, no Referer to other
sites. CORS is not enabled: another site's page can send a request but never read the answer.
A request body is read whole before any route sees it and refused (422) past `MAX_BODY` bytes,
and whatever fails (a body that is not JSON, one nested too deep, a bug) is a one-line JSON
error, never a stack trace.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException  # also the router's 404 and 405
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from curation import api, auth, ui
from curation.reviews import Reviews
from miner.store import Store

MAX_BODY = 8 * 1024 * 1024  # a 2,000,000-character label as JSON, with room for its escapes
_DRAIN = 4 * MAX_BODY  # past this a refused upload is cut off instead of read to its end
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
# same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with the
# server's own form posts, and the login's Origin check (auth.py) would refuse them.
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
_RAW_HEADERS = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
_NAMES = {k for k, _ in _RAW_HEADERS}


class SafeJSON(JSONResponse):
    """JSON in ASCII: text that cannot be UTF-8 (a lone surrogate) is escaped, not a 500."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False).encode("ascii")


def error(message: str, status: int, headers: dict | None = None) -> SafeJSON:
    return SafeJSON({"message": message}, status_code=status, headers=headers)


class Guard:
    """ASGI middleware: the security headers on every response; the body read whole and
    refused (422) past `max_body` bytes; a NUL in the URL refused (no database stores it)."""

    def __init__(self, app: ASGIApp, max_body: int = MAX_BODY) -> None:
        self.app, self.max_body = app, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k not in _NAMES]
                message = {**message, "headers": kept + _RAW_HEADERS}
            await send(message)

        if "\x00" in scope["path"] or b"%00" in scope.get("query_string", b""):
            await error("bad request: a NUL byte in the URL", 422)(scope, receive, send_secured)
            return
        body, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
            if size <= self.max_body:
                body.append(message.get("body", b""))
            elif not more or size > _DRAIN:
                why = f"bad request: the body has more than {self.max_body} bytes"
                await error(why, 422)(scope, receive, send_secured)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(body), "more_body": False}

        await self.app(scope, replay, send_secured)


def create_app(store: Store, public_read: bool = False, workdir: Path | None = None) -> FastAPI:
    """The server on `store`; `workdir` holds the files the candidate pages show (labels,
    references, tests)."""
    store.fill_summaries()
    app = FastAPI(
        title="kminer review",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        default_response_class=SafeJSON,
    )
    app.state.store, app.state.reviews = store, Reviews(store)
    app.state.public_read, app.state.workdir = public_read, workdir

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        if exc.status_code == 400:  # FastAPI's "error parsing the body": not UTF-8, too deep
            return error("bad request: the body could not be parsed", 422)
        body = exc.detail if isinstance(exc.detail, dict) else {"message": str(exc.detail)}
        return SafeJSON(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _bad_body(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error(f"bad request: {where}: {first.get('msg', 'invalid')}", 422)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        # Starlette answers this one outside every middleware (the headers go on here), then
        # raises the exception again for the server to log with its traceback.
        return error("internal error: see the server's log", 500, SECURITY_HEADERS)

    app.add_middleware(Guard)
    auth.install(app)
    api.install(app)
    ui.install(app)
    return app
