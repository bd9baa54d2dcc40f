"""The review server: the app that serves the JSON API (api.py) and the pages (ui.py).

`create_app` is what `kminer serve` runs and what the tests build; it is handed the store and the
workdir whose files (labels, references, tests) the candidate pages show.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from curation import api, auth, ui
from curation.reviews import Reviews
from miner.store import Store


def create_app(store: Store, public_read: bool = False, workdir: Path | None = None) -> FastAPI:
    """The server on `store`; `workdir` holds the files the candidate pages show (labels,
    references, tests)."""
    store.fill_summaries()
    app = FastAPI(title="kminer review", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store, app.state.reviews = store, Reviews(store)
    app.state.public_read, app.state.workdir = public_read, workdir

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        body = exc.detail if isinstance(exc.detail, dict) else {"message": str(exc.detail)}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _bad_body(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"bad request: {where}: {first.get('msg', 'invalid')}"
        return JSONResponse({"message": message}, status_code=422)

    auth.install(app)
    api.install(app)
    ui.install(app)
    return app
