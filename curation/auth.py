"""Who is asking the review server: a curator's bearer token, or a browser's session.

Scripts send `Authorization: Bearer TOKEN`; browsers log in once with the token and carry a
session cookie (HttpOnly, SameSite=Lax), and every write they make must also carry the session's
CSRF token (a form field `csrf` or the `X-CSRF-Token` header): a cookie is sent by the browser on
its own, a bearer token never is. Reading needs a curator unless the server was started with
`--public-read`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import RedirectResponse

from curation import curators

COOKIE = "kminer_session"


async def login(request: Request):
    """A browser trades the token for a session cookie (HttpOnly, SameSite=Lax)."""
    store = request.app.state.store
    found = curators.by_token(store, str((await request.form()).get("token", "")).strip())
    known(found)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        COOKIE,
        curators.open_session(store, found.name),
        max_age=curators.SESSION_DAYS * 86400,
        httponly=True,
        samesite="lax",
    )
    return response


def who(request: Request) -> curators.Who | None:
    store = request.app.state.store
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return curators.by_token(store, auth[7:].strip()) or curators.Who("", revoked=False)
    return curators.by_session(store, request.cookies.get(COOKIE, ""))


def known(found: curators.Who | None) -> curators.Who:
    """The curator, or 401 (nobody) / 403 (revoked)."""
    if found is None or not found.name:
        raise HTTPException(401, "log in: this needs a curator's token (Authorization: Bearer)")
    if found.revoked:
        raise HTTPException(403, f"curator {found.name!r} is revoked")
    return found


def reader(request: Request) -> curators.Who | None:
    if request.app.state.public_read:
        return who(request)
    return known(who(request))


async def writer(request: Request) -> curators.Who:
    """A curator allowed to write; a browser session must also echo its CSRF token."""
    found = known(who(request))
    if found.csrf:
        sent = request.headers.get("x-csrf-token", "")
        if not sent and "form" in request.headers.get("content-type", ""):
            sent = str((await request.form()).get("csrf", ""))
        if sent != found.csrf:
            raise HTTPException(403, "the form's CSRF token is missing or wrong: reload the page")
    return found


Reader = Annotated[curators.Who | None, Depends(reader)]
Writer = Annotated[curators.Who, Depends(writer)]


async def logout(request: Request, by: Writer):
    curators.close_session(request.app.state.store, request.cookies.get(COOKIE, ""))
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(COOKIE)
    return response


def install(app: FastAPI) -> None:
    app.post("/login")(login)
    app.post("/logout")(logout)
