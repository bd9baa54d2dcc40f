"""The review server's JSON API and the writes its forms share.

Every error is JSON with a `message` (401 no valid token, 403 revoked or bad CSRF, 404 unknown
candidate, 409 a write based on an old version, 422 a bad body). A write is a function of
(request, candidate, body, curator) that returns the review after it, so the browser's forms
(ui.py) go through exactly the checks the API makes. Text a curator sends is bounded and must
be storable: a NUL byte (PostgreSQL refuses it) is a 422, not a failed write.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Annotated, Literal

from fastapi import FastAPI, HTTPException, Request
from pydantic import AfterValidator, BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from curation import queue
from curation.auth import Reader, Writer
from curation.describe import generated
from curation.instructions import derive_instruction
from curation.reviews import Decision, Reviews, VersionConflict
from miner.candidate import StageName
from miner.store import QueueRow

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


def _storable(text: str) -> str:
    if "\x00" in text:  # (a lone surrogate pydantic refuses already)
        raise ValueError("text must not hold a NUL byte")
    return text


Text = Annotated[str, AfterValidator(_storable)]


class ReviewBody(BaseModel):
    decision: Literal["accept", "reject", "needs_edit"]
    reason: str = Field(default="", max_length=64)
    note: Text = Field(default="", max_length=4000)
    version: int = Field(ge=0)
    override: bool = False  # accept what the checks do not allow; flagged on the row, audited


class InstructionBody(BaseModel):
    instruction: Text = Field(min_length=1, max_length=20000)
    instruction_complete: Text | None = Field(default=None, max_length=100000)
    version: int = Field(ge=0)


def acceptable(cand) -> str:
    """'' when the checks allow accepting the candidate, else why not."""
    verify = cand.stage(StageName.VERIFY)
    outcome = verify.metrics.get("outcome") if verify else None
    if outcome != "pass":
        return f"its verify outcome is {outcome or 'missing'}, not pass"
    if verify.metrics.get("kill_rate") != 1.0:
        return f"its test kills {verify.metrics.get('kill_rate')} of the wrong variants, not all"
    return ""


def candidate(request: Request, cand_id: str):
    """The candidate, or 404."""
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


def instructions(store, cand, review: dict, workdir) -> dict:
    """The instructions a row would get now: a curator's edit, else the generated text."""
    made_complete, _ = generated(store, cand, workdir)
    complete = review["instruction_complete"] or made_complete
    return {
        "instruction": review["instruction"] or derive_instruction(complete),
        "instruction_complete": complete,
        "edited": bool(review["instruction"] or review["instruction_complete"]),
    }


def detail(state, cand) -> dict:
    """A candidate as the API and the candidate page show it (`state`: the app's state)."""
    store, review = state.store, state.reviews.get(cand.id)
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
        "instructions": instructions(store, cand, review, state.workdir),
    }


def api_candidate(request: Request, cand_id: str, _: Reader):
    return detail(request.app.state, candidate(request, cand_id))


def _conflict(current: dict, base: int) -> HTTPException:
    message = (
        f"conflict: the candidate changed since version {base} "
        f"(now {current['version']}, by {current['curator'] or 'nobody'})"
    )
    return HTTPException(409, {"message": message, "current": current})


def _write(
    reviews: Reviews, cand_id: str, base: int, curator: str, action: str, changes=None, **fields
) -> dict:
    try:
        return reviews.write(cand_id, base, curator, action, changes, **fields)
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
        request.app.state.reviews,
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
    state = request.app.state
    made_complete, _ = generated(state.store, cand, state.workdir)
    review = state.reviews.get(cand.id)
    complete = shown = review["instruction_complete"]
    if body.instruction_complete is not None:  # a browser's form sends CRLF line ends
        text = body.instruction_complete.replace("\r\n", "\n")
        complete = None if text.strip() == made_complete.strip() else text
    derived = {derive_instruction(c or made_complete).strip() for c in (shown, complete)}
    short = body.instruction.replace("\r\n", "\n")
    short = None if short.strip() in derived else short
    fields = {"instruction": short, "instruction_complete": complete}
    return _write(state.reviews, cand.id, body.version, curator, "edit_instruction", **fields)


class LabelBody(BaseModel):
    label: Text = Field(min_length=1, max_length=2_000_000)
    version: int = Field(ge=0)


def apply_label(request: Request, cand, body: LabelBody, curator: str) -> dict:
    """A curator's label is a new revision beside the old one (`labels/<id>.r<N>.cu`): the
    candidate points at it, its verdict is forgotten (testgen derives new wrong variants from
    it, verify runs again) and an accepted candidate goes back to pending until it passes."""
    state = request.app.state
    store, workdir = state.store, state.workdir
    if workdir is None:
        raise HTTPException(422, "this server has no workdir to write a label revision to")
    review = state.reviews.get(cand.id)
    if review["version"] != body.version:
        raise _conflict(review, body.version)
    folder = Path(workdir) / "labels"
    revision = len(list(folder.glob(f"{cand.id}.r*.cu"))) + 1
    rel = f"labels/{cand.id}.r{revision}.cu"
    text = body.label if body.label.endswith("\n") else body.label + "\n"
    changes = {"label_path": (cand.wrapper.label_path, rel)}
    decision = {"decision": Decision.PENDING} if review["decision"] == "accepted" else {}
    after = _write(
        state.reviews, cand.id, body.version, curator, "edit_label", changes=changes, **decision
    )
    folder.mkdir(parents=True, exist_ok=True)
    (Path(workdir) / rel).write_text(text, encoding="utf-8")
    cand.wrapper.label_path = rel
    cand.wrapper.label_hash = hashlib.sha256(text.encode("latin-1", "replace")).hexdigest()[:20]
    cand.clear_stage(StageName.VERIFY)
    store.save(cand)
    return {**after, "label_path": rel}


WRITES = {  # what a form or an API call at .../{name} writes: (its body, the write)
    "review": (ReviewBody, apply_review),
    "instruction": (InstructionBody, apply_instruction),
    "label": (LabelBody, apply_label),
}


def api_review(request: Request, cand_id: str, body: ReviewBody, by: Writer):
    return apply_review(request, candidate(request, cand_id), body, by.name)


def api_instruction(request: Request, cand_id: str, body: InstructionBody, by: Writer):
    return apply_instruction(request, candidate(request, cand_id), body, by.name)


def api_label(request: Request, cand_id: str, body: LabelBody, by: Writer):
    return apply_label(request, candidate(request, cand_id), body, by.name)


def api_stats(request: Request, _: Reader):
    store = request.app.state.store
    with Session(store.engine) as s:
        rows = s.execute(select(QueueRow.outcome, QueueRow.strategy)).all()
    return {
        "candidates": len(rows),
        "decisions": queue.decision_counts(store),
        "outcomes": dict(Counter(o or "none" for o, _ in rows)),
        "strategies": dict(Counter(s or "none" for _, s in rows)),
    }


def install(app: FastAPI) -> None:
    app.get("/api/candidates")(api_candidates)
    app.get("/api/candidates/{cand_id}")(api_candidate)
    app.post("/api/candidates/{cand_id}/review")(api_review)
    app.put("/api/candidates/{cand_id}/instruction")(api_instruction)
    app.put("/api/candidates/{cand_id}/label")(api_label)
    app.get("/api/stats")(api_stats)
