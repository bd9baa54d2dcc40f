"""The curation server's application: who is asking, the JSON API, and its errors.

Scripts send `Authorization: Bearer TOKEN`; browsers log in once with the token and carry a
session cookie (HttpOnly, SameSite=Lax), and every write they make must also carry the session's
CSRF token (a form field `csrf` or the `X-CSRF-Token` header): a cookie is sent by the browser on
its own, a bearer token never is. Reading needs a curator unless the server was started with
`--public-read`. Every error is JSON with a `message` (401 no valid token, 403 revoked or bad
CSRF, 404 unknown candidate, 409 a write based on an old version, 422 a bad body).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from curation import curators, queue
from curation.store import Decision, Store, VersionConflict
from miner.candidate import Stage

COOKIE = "kminer_session"
REJECT_REASONS = (
    "wrong_reference",
    "weak_test",
    "trivial_kernel",
    "duplicate",
    "broken_label",
    "bad_instruction",
    "license",
    "other",
)
DECISIONS = {
    "accept": Decision.ACCEPTED,
    "reject": Decision.REJECTED,
    "needs_edit": Decision.NEEDS_EDIT,
}


class ReviewBody(BaseModel):
    decision: Literal["accept", "reject", "needs_edit"]
    reason: str = ""
    note: str = Field(default="", max_length=4000)
    version: int = Field(ge=0)
    override: bool = False  # accept what the checks do not allow; flagged on the row, audited


class InstructionBody(BaseModel):
    instruction: str = Field(min_length=1, max_length=20000)
    instruction_complete: str | None = Field(default=None, max_length=100000)
    version: int = Field(ge=0)


def acceptable(cand) -> str:
    """'' when the checks allow accepting the candidate, else why not."""
    verify = cand.stage(Stage.VERIFY)
    outcome = verify.metrics.get("outcome") if verify else None
    if outcome != "pass":
        return f"its verify outcome is {outcome or 'missing'}, not pass"
    if verify.metrics.get("kill_rate") != 1.0:
        return f"its test kills {verify.metrics.get('kill_rate')} of the wrong variants, not all"
    return ""


def create_app(store: Store, public_read: bool = False, workdir: Path | None = None) -> FastAPI:
    """The server on `store`; `workdir` holds the files the candidate pages show (labels,
    references, tests)."""
    from curation import ui

    queue.ensure(store)
    app = FastAPI(title="kminer review", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.store, app.state.public_read, app.state.workdir = store, public_read, workdir

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

    app.get("/api/candidates")(api_candidates)
    app.get("/api/candidates/{cand_id}")(api_candidate)
    app.post("/api/candidates/{cand_id}/review")(api_review)
    app.put("/api/candidates/{cand_id}/instruction")(api_instruction)
    app.put("/api/candidates/{cand_id}/label")(api_label)
    app.get("/api/stats")(api_stats)
    app.post("/login")(login)
    app.post("/logout")(logout)
    ui.install(app)
    return app


async def login(request: Request):
    """A browser trades the token for a session cookie (HttpOnly, SameSite=Lax)."""
    store = request.app.state.store
    found = curators.by_token(store, str((await request.form()).get("token", "")).strip())
    _known(found)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        COOKIE,
        curators.open_session(store, found.name),
        max_age=curators.SESSION_DAYS * 86400,
        httponly=True,
        samesite="lax",
    )
    return response


async def logout(request: Request, by: Writer):
    curators.close_session(request.app.state.store, request.cookies.get(COOKIE, ""))
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(COOKIE)
    return response


def who(request: Request) -> curators.Who | None:
    store = request.app.state.store
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return curators.by_token(store, auth[7:].strip()) or curators.Who("", revoked=False)
    return curators.by_session(store, request.cookies.get(COOKIE, ""))


def _known(found: curators.Who | None) -> curators.Who:
    if found is None or not found.name:
        raise HTTPException(401, "log in: this needs a curator's token (Authorization: Bearer)")
    if found.revoked:
        raise HTTPException(403, f"curator {found.name!r} is revoked")
    return found


def reader(request: Request) -> curators.Who | None:
    if request.app.state.public_read:
        return who(request)
    return _known(who(request))


async def writer(request: Request) -> curators.Who:
    """A curator allowed to write; a browser session must also echo its CSRF token."""
    found = _known(who(request))
    if found.csrf:
        sent = request.headers.get("x-csrf-token", "")
        if not sent and "form" in request.headers.get("content-type", ""):
            sent = str((await request.form()).get("csrf", ""))
        if sent != found.csrf:
            raise HTTPException(403, "the form's CSRF token is missing or wrong: reload the page")
    return found


Reader = Annotated[curators.Who | None, Depends(reader)]
Writer = Annotated[curators.Who, Depends(writer)]


def _candidate(request: Request, cand_id: str):
    cand = request.app.state.store.get(cand_id)
    if cand is None:
        raise HTTPException(404, f"no candidate {cand_id!r}")
    return cand


def api_candidates(
    request: Request,
    _: Reader,
    status: str = "",
    outcome: str = "",
    op: str = "",
    repo: str = "",
    strategy: str = "",
    reference_kind: str = "",
    sort: str = "kernel",
    page: int = 1,
):
    filters = dict(status=status, outcome=outcome, op=op, repo=repo, strategy=strategy)
    filters["reference_kind"] = reference_kind
    return queue.listing(request.app.state.store, filters, sort, page)


def instructions(store: Store, cand, review: dict, workdir) -> dict:
    """The instructions a row would get now: a curator's edit, else the generated text."""
    from curation.describe import generated
    from curation.instructions import derive_instruction

    made_complete, _ = generated(store, cand, workdir)
    complete = review["instruction_complete"] or made_complete
    return {
        "instruction": review["instruction"] or derive_instruction(complete),
        "instruction_complete": complete,
        "edited": bool(review["instruction"] or review["instruction_complete"]),
    }


def detail(store: Store, cand, workdir=None) -> dict:
    review = store.review(cand.id)
    return {
        **cand.summary(),
        "provenance": cand.provenance.model_dump(),
        "lines": [cand.kernel.start_line, cand.kernel.end_line],
        "op": cand.wrapper.op_map.get("python_name") or "",
        "reference": cand.reference.model_dump(),
        "tests": cand.tests.model_dump(),
        "review": review,
        "version": review["version"],
        "why_not_acceptable": acceptable(cand),
        "instructions": instructions(store, cand, review, workdir),
    }


def api_candidate(request: Request, cand_id: str, _: Reader):
    state = request.app.state
    return detail(state.store, _candidate(request, cand_id), state.workdir)


def _conflict(current: dict, base: int) -> HTTPException:
    message = (
        f"conflict: the candidate changed since version {base} "
        f"(now {current['version']}, by {current['curator'] or 'nobody'})"
    )
    return HTTPException(409, {"message": message, "current": current})


def _write(
    store: Store, cand_id: str, base: int, curator: str, action: str, changes=None, **fields
) -> dict:
    try:
        return store.write_review(cand_id, base, curator, action, changes, **fields)
    except VersionConflict as exc:
        raise _conflict(exc.current, base) from None


# The writes the API and the forms share: (request, candidate, body, curator) -> the review after.
# They raise HTTPException (409 a stale version, 422 a refused write).


def apply_review(request: Request, cand, body: ReviewBody, curator: str) -> dict:
    if body.decision == "reject" and body.reason not in REJECT_REASONS:
        raise HTTPException(422, f"a rejection needs a reason, one of {', '.join(REJECT_REASONS)}")
    override = False
    if body.decision == "accept":
        why = acceptable(cand)
        if why and not body.override:
            raise HTTPException(422, f"cannot accept: {why} (an override must be asked for)")
        override = bool(why)
    return _write(
        request.app.state.store,
        cand.id,
        body.version,
        curator,
        "override_accept" if override else body.decision,
        decision=DECISIONS[body.decision],
        reason=body.reason if body.decision == "reject" else "",
        note=body.note,
        override=override,
    )


def apply_instruction(request: Request, cand, body: InstructionBody, curator: str) -> dict:
    """Keep what differs from the generated text as the curator's edit; a text sent back
    unchanged stays generated (None), so a later change of the rules or of the complete text
    still reaches it: an unedited `instruction` is derived from the complete one in force."""
    from curation.describe import generated
    from curation.instructions import derive_instruction

    store = request.app.state.store
    made_complete, _ = generated(store, cand, request.app.state.workdir)
    review = store.review(cand.id)
    complete = shown = review["instruction_complete"]
    if body.instruction_complete is not None:  # a browser's form sends CRLF line ends
        text = body.instruction_complete.replace("\r\n", "\n")
        complete = None if text.strip() == made_complete.strip() else text
    derived = {derive_instruction(c or made_complete).strip() for c in (shown, complete)}
    short = body.instruction.replace("\r\n", "\n")
    short = None if short.strip() in derived else short
    fields = {"instruction": short, "instruction_complete": complete}
    return _write(store, cand.id, body.version, curator, "edit_instruction", **fields)


class LabelBody(BaseModel):
    label: str = Field(min_length=1, max_length=2_000_000)
    version: int = Field(ge=0)


def apply_label(request: Request, cand, body: LabelBody, curator: str) -> dict:
    """A curator's label is a new revision beside the old one (`labels/<id>.r<N>.cu`): the
    candidate points at it, its verdict is forgotten (testgen derives new wrong variants from
    it, verify runs again) and an accepted candidate goes back to pending until it passes."""
    store, workdir = request.app.state.store, request.app.state.workdir
    if workdir is None:
        raise HTTPException(422, "this server has no workdir to write a label revision to")
    review = store.review(cand.id)
    if review["version"] != body.version:
        raise _conflict(review, body.version)
    folder = Path(workdir) / "labels"
    revision = len(list(folder.glob(f"{cand.id}.r*.cu"))) + 1
    rel = f"labels/{cand.id}.r{revision}.cu"
    text = body.label if body.label.endswith("\n") else body.label + "\n"
    changes = {"label_path": (cand.wrapper.label_path, rel)}
    decision = {"decision": Decision.PENDING} if review["decision"] == "accepted" else {}
    after = _write(store, cand.id, body.version, curator, "edit_label", changes=changes, **decision)
    folder.mkdir(parents=True, exist_ok=True)
    (Path(workdir) / rel).write_text(text, encoding="utf-8")
    cand.wrapper.label_path = rel
    cand.wrapper.label_hash = hashlib.sha256(text.encode("latin-1", "replace")).hexdigest()[:20]
    cand.clear_stage(Stage.VERIFY)
    store.save(cand)
    return {**after, "label_path": rel}


WRITES = {  # what a form or an API call at .../{name} writes: (its body, the write)
    "review": (ReviewBody, apply_review),
    "instruction": (InstructionBody, apply_instruction),
    "label": (LabelBody, apply_label),
}


def api_review(request: Request, cand_id: str, body: ReviewBody, by: Writer):
    return apply_review(request, _candidate(request, cand_id), body, by.name)


def api_instruction(request: Request, cand_id: str, body: InstructionBody, by: Writer):
    return apply_instruction(request, _candidate(request, cand_id), body, by.name)


def api_label(request: Request, cand_id: str, body: LabelBody, by: Writer):
    return apply_label(request, _candidate(request, cand_id), body, by.name)


def api_stats(request: Request, _: Reader):
    store = request.app.state.store
    with Session(store.engine) as s:
        rows = s.execute(select(queue.QueueRow.outcome, queue.QueueRow.strategy)).all()
    return {
        "candidates": len(rows),
        "decisions": queue.decision_counts(store),
        "outcomes": dict(Counter(o or "none" for o, _ in rows)),
        "strategies": dict(Counter(s or "none" for _, s in rows)),
    }
