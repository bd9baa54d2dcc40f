"""The review UI: server-rendered pages (Jinja2, prompts/ui/) with plain forms, no build step.

The pages call the same functions as the JSON API, so a form and a script are refused for the
same reasons. A refused form re-renders the candidate page with the reason and the state now in
the store, under the same status code the API would give (409 shows who wrote first).

Everything a page shows came from a repository or a curator, so it goes out escaped (Jinja's
autoescape; source through Pygments, whose lexers run in time linear in the text: the
hand-written patterns before them took 45 s on a 120 KB kernel of unclosed comments). The
pages hold no inline script or style: /static/review.js (the keys) and /static/review.css are
the only ones the Content-Security-Policy (server.py) lets a page run or apply.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlencode

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from pydantic import ValidationError
from pygments import highlight as pygmentize
from pygments.formatters import HtmlFormatter
from pygments.lexers import CudaLexer, PythonLexer
from sqlalchemy import select
from sqlalchemy.orm import Session

from curation import api, auth, queue
from curation.reviews import Decision
from miner.candidate import StageName
from miner.store import QueueRow, RepoRow
from prompts import HERE as PROMPTS
from testgen.testcode import TOLERANCES

TEMPLATES = PROMPTS / "ui"
COLUMNS = [("kernel", "kernel"), ("op", "op"), ("outcome", "outcome")]
COLUMNS += [("kill_rate", "kill rate"), ("kernel_time_us", "time (µs)")]
_FORMATTER = HtmlFormatter(nowrap=True)  # spans with classes (review.css), no wrapper
_UNSHOWABLE = re.compile("[\x00\ud800-\udfff]")  # NUL, and what UTF-8 cannot encode
STATIC = {"review.css": "text/css", "review.js": "text/javascript"}


def highlight(code: str, path: str = "") -> Markup:
    """Escaped source, its tokens in spans classed by Pygments (Python for a .py path, else
    CUDA C++); linear in the length of `code`, whatever it holds."""
    lexer = PythonLexer() if path.endswith(".py") else CudaLexer()
    return Markup(pygmentize(code, lexer, _FORMATTER))


_env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["j2"]))


def _render(name: str, request: Request, status: int = 200, **ctx) -> HTMLResponse:
    found = auth.who(request)
    ctx.setdefault("who", found.name if found and not found.revoked else "")
    ctx.setdefault("csrf", found.csrf if found else "")
    page = _UNSHOWABLE.sub("\ufffd", _env.get_template(name).render(**ctx))
    return HTMLResponse(page.encode("utf-8"), status_code=status)


def _static_files() -> dict[str, bytes]:
    return {name: _env.get_template(f"{name}.j2").render().encode() for name in STATIC}


def static_file(request: Request, name: str):
    """The pages' one script and one stylesheet (templates without variables)."""
    if name not in STATIC:
        raise HTTPException(404, f"no static file {name!r}")
    return Response(request.app.state.static[name], media_type=STATIC[name])


def _reader(request: Request):
    """The curator reading, or a redirect to the login page (None when reading is public)."""
    found = auth.who(request)
    if request.app.state.public_read:
        return found
    if found is None or not found.name or found.revoked:
        return RedirectResponse("/login", status_code=303)
    return found


def login_page(request: Request):
    return _render("login.html.j2", request)


def queue_page(request: Request, sort: str = "kernel", page: int = 1):
    found = _reader(request)
    if isinstance(found, RedirectResponse):
        return found
    store = request.app.state.store
    chosen = {k: request.query_params.get(k, "") for k in queue.FILTERS}
    listing = queue.listing(store, chosen, sort, page)
    filters = [{"name": k, "value": v, "choices": _choices(store, k)} for k, v in chosen.items()]

    def url(**change) -> str:
        params = {k: v for k, v in {**chosen, "sort": sort, "page": page, **change}.items() if v}
        return "/?" + urlencode(params)

    def sort_url(col: str) -> str:
        return url(sort=f"-{col}" if sort == col else col, page=1)

    return _render(
        "queue.html.j2",
        request,
        listing=listing,
        filters=filters,
        sort=sort,
        columns=COLUMNS,
        sort_url=sort_url,
        page_url=lambda p: url(page=p),
    )


def _choices(store, key: str) -> list[str]:
    if key == "status":
        return [d.value for d in Decision]
    column = RepoRow.url if key == "repo" else getattr(QueueRow, key)
    with Session(store.engine) as s:
        return sorted(v for v in s.scalars(select(column).distinct()) if v)


def _file(workdir: Path | None, rel: str) -> str:
    if not workdir or not rel:
        return ""
    path = Path(workdir) / rel
    return path.read_text("utf-8", errors="replace") if path.is_file() else ""


def candidate_view(request: Request, cand_id: str, saved: int | None = None):
    flash = {"flash": f"saved (version {saved})"} if saved is not None else {}
    return candidate_page(request, cand_id, 200, flash)


def candidate_page(request: Request, cand_id: str, status: int, flash: dict):
    found = _reader(request)
    if isinstance(found, RedirectResponse):
        return found
    state = request.app.state
    store, workdir = state.store, state.workdir
    cand = api.candidate(request, cand_id)
    data = api.detail(state, cand)
    verify = {"kernel_time_us": None, "kill_rate": None, "cases": [], "variants": [], "gpu": ""}
    verify.update(data["stages"].get(StageName.VERIFY.value, {}))  # none yet: unverified
    files = []
    for title, rel in (
        ("Label", cand.wrapper.label_path),
        ("Reference", cand.reference.path),
        ("test_code", cand.tests.path),
    ):
        text = _file(workdir, rel)
        if text:
            files.append((f"{title} ({rel})", highlight(text, rel)))
    history = [
        {
            "at": f"{a['at']:%Y-%m-%d %H:%M:%S}",
            "curator": a["curator"],
            "action": a["action"],
            "change": _change(a["before"], a["after"]),
        }
        for a in state.reviews.audit(cand_id)
    ]
    prev_id, next_id = queue.neighbours(store, cand_id)
    return _render(
        "candidate.html.j2",
        request,
        status=status,
        c=data,
        c_closure=cand.closure,
        review=data["review"],
        outcome=verify.get("status", ""),
        verify=verify,
        why_not=data["why_not_acceptable"],
        reasons=api.REJECT_REASONS,
        tolerances=TOLERANCES,
        instructions=data["instructions"],
        source_html=highlight(cand.kernel.source),
        files=files,
        label_text=_file(workdir, cand.wrapper.label_path),
        attempts=store.attempts(cand_id),
        history=history,
        prev_id=prev_id,
        next_id=next_id,
        **flash,
    )


def _change(before: dict, after: dict) -> str:
    keys = [k for k in after if k not in ("version", "reviewed_at") and before.get(k) != after[k]]
    return "; ".join(f"{k}: {before.get(k)!r} → {after[k]!r}" for k in keys)


async def form_write(request: Request, cand_id: str, action: str, by: auth.Writer):
    """A form's write (review, instruction, label) through the API's own function for it."""
    if action not in api.WRITES:
        raise HTTPException(404, f"no action {action!r}")
    body_type, write = api.WRITES[action]
    fields = dict(await request.form())
    fields["override"] = bool(fields.get("override"))  # a checkbox: present or not
    return _apply(request, cand_id, lambda cand: write(request, cand, body_type(**fields), by.name))


def _apply(request: Request, cand_id: str, write) -> HTMLResponse | RedirectResponse:
    cand = api.candidate(request, cand_id)
    try:
        after = write(cand)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = f"bad form: {'.'.join(map(str, first['loc']))}: {first['msg']}"
        return candidate_page(request, cand_id, 422, {"flash": message, "flash_kind": "error"})
    except HTTPException as exc:
        detail = exc.detail if isinstance(exc.detail, dict) else {"message": exc.detail}
        flash = {"flash": detail["message"], "flash_kind": "error"}
        return candidate_page(request, cand_id, exc.status_code, flash)
    return RedirectResponse(f"/c/{cand_id}?saved={after['version']}", status_code=303)


def install(app: FastAPI) -> None:
    app.state.static = _static_files()
    app.get("/static/{name}")(static_file)
    app.get("/", response_class=HTMLResponse)(queue_page)
    app.get("/login", response_class=HTMLResponse)(login_page)
    app.get("/c/{cand_id}", response_class=HTMLResponse)(candidate_view)
    app.post("/c/{cand_id}/{action}")(form_write)
