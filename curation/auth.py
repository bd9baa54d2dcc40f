"""Who is asking the review server: a curator's bearer token, or a browser's session.

Scripts send `Authorization: Bearer TOKEN`; browsers log in once with the token and carry a
session cookie (HttpOnly, SameSite=Lax), and every write they make must also carry the session's
CSRF token (a form field `csrf` or the `X-CSRF-Token` header): a cookie is sent by the browser on
its own, a bearer token never is. Reading needs a curator unless the server was started with
`--public-read`.

Cross-origin requests are refused by their Origin (its Referer when a browser sent no Origin): a
browser adds `Origin` to every POST, and a page cannot forge it. That is the one scheme for the
login (`POST /login` from another site is a login CSRF: it would sign the victim's browser in as
the attacker, whose name their reviews would then carry) and a second wall for every cookie
write, beside the session's CSRF token. It was chosen over a double-submit token for the login
form because it needs no state before anyone is logged in and cannot be planted: a sibling
host can toss a cookie into the victim's browser, never an Origin header. A request with
neither header is no browser's (a script, curl): it is let through, and it proves nothing it
does not already hold. A bearer-token write from any origin is a script's and is allowed: no
browser attaches a bearer token by itself, and CORS is not enabled (server.py), so another
site's page cannot send one or read an answer.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import RedirectResponse

from curation import curators

COOKIE = "kminer_session"


def own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.headers.get('host', '')}".lower()


def foreign_origin(request: Request) -> str | None:
    """The origin a browser says this request comes from, when it is not this server's (an
    opaque origin is the string `null`); None for this server's own pages and for requests
    that name no origin at all (not a browser's)."""
    sent = request.headers.get("origin")
    if sent is None:
        referer = request.headers.get("referer")
        if referer is None:
            return None
        try:
            parts = urlsplit(referer)
        except ValueError:  # not a URL (e.g. `http://[`): from nowhere this server knows
            return referer
        sent = f"{parts.scheme}://{parts.netloc}"
    return None if sent.strip().lower() == own_origin(request) else sent


def refuse_cross_origin(request: Request, what: str) -> None:
    """403 when a browser sends this request from another origin's page."""
    foreign = foreign_origin(request)
    if foreign is not None:
        here = own_origin(request)
        message = f"{what} from another origin ({foreign[:200]!r}, not {here!r}) is refused"
        raise HTTPException(403, message)


async def login(request: Request):
    """A browser trades the token for a session cookie (HttpOnly, SameSite=Lax), from this
    server's own login page only."""
    refuse_cross_origin(request, "a login")
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
    """A curator allowed to write; a browser session must write from this server's pages and
    echo its CSRF token."""
    found = known(who(request))
    if found.csrf:
        refuse_cross_origin(request, "a browser's write")
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
