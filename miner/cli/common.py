"""What every command shares: the consoles, one-line errors, the common options and the checks
they carry, the store, the log file, progress bars and the funnel table.

Commands take these; none of them imports the app (app.py registers them), so a command module
can be read, imported and tested on its own. Every option is checked while the command line is
parsed (the callbacks below), before any work: a bad value is one line and exit 2, and a
workdir it was aimed at is left exactly as it was.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TimeElapsedColumn
from rich.progress import Progress as Bars
from rich.table import Table
from rich.text import Text

from miner.clone import unfetched_submodules
from miner.errors import KminerError, SetupError
from miner.stage import RunContext
from miner.stats import funnel
from miner.store import DB_NAME, Store

err = Console(stderr=True)
out = Console()
log = logging.getLogger("miner.cli")


def bounded(low: float, high: float | None = None, *, above: bool = False) -> Callable:
    """A typer callback refusing a number under `low` (or equal to it, with `above`) or over
    `high`: counts, sizes, timeouts and ports that would mean nothing stop the parse."""
    if high is not None:
        want = f"between {low} and {high}"
    else:
        want = f"greater than {low}" if above else f"at least {low}"

    def check(value):
        if (value <= low if above else value < low) or (high is not None and value > high):
            raise typer.BadParameter(f"must be {want}, not {value}")
        return value

    return check


def path_problem(path: Path, *, directory: bool) -> str | None:
    """Why `path` cannot be used (or made) as a directory (`directory`) or a file; None if it can.

    Only what is already on disk is looked at: the path itself, else its nearest existing parent.
    """
    path = path.absolute()
    if path.exists():
        if directory and not path.is_dir():
            return f"{path} exists and is not a directory"
        if not directory and path.is_dir():
            return f"{path} is a directory"
        return None
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        return f"{parent} is not a directory, so {path} cannot be made"
    return None


def _usable_workdir(value: Path | None) -> Path | None:
    if value is not None and (problem := path_problem(value, directory=True)):
        raise typer.BadParameter(problem)
    return value


def usable_file(value: Path | None) -> Path | None:
    """A typer callback for a file to write: not a directory, its folder makeable."""
    if value is not None and (problem := path_problem(value, directory=False)):
        raise typer.BadParameter(problem)
    return value


def _nonempty_glob(value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise typer.BadParameter("empty; give a glob such as '*softmax*', or leave it out")
    return value


def _database_url(value: str | None) -> str | None:
    """An SQLAlchemy URL whose dialect exists; the URL is never echoed (it may hold a password)."""
    if value is None:
        return None
    from sqlalchemy.engine import make_url

    try:
        url = make_url(value)
    except Exception:
        raise typer.BadParameter("not an SQLAlchemy URL (e.g. postgresql://user@host/db)") from None
    try:
        url.get_dialect()
    except Exception:
        raise typer.BadParameter(f"no database dialect {url.drivername!r}") from None
    return value


WorkdirOpt = Annotated[
    Path | None, typer.Option("--workdir", "-w", help="Run directory.", callback=_usable_workdir)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="SQLAlchemy URL instead of the workdir's SQLite file (e.g. postgresql://...).",
        callback=_database_url,
    ),
]
FilterOpt = Annotated[
    str | None,
    typer.Option("--filter", help="Glob on file or kernel.", callback=_nonempty_glob),
]
RedoOpt = Annotated[bool, typer.Option(help="Redo finished work.")]
LlmOpt = Annotated[
    str | None,
    typer.Option(
        "--llm", help="none | openai (default: openai when OPENAI_BASE_URL is set, else none)."
    ),
]
ModelOpt = Annotated[str | None, typer.Option("--model", help="LLM model name.")]
BaseUrlOpt = Annotated[str | None, typer.Option("--llm-base-url", help="OpenAI-compatible URL.")]
AttemptsOpt = Annotated[
    int, typer.Option("--max-attempts", help="LLM attempts per kernel.", callback=bounded(1))
]
BatchOpt = Annotated[
    int, typer.Option("--batch-size", help="Labels per build unit.", callback=bounded(1))
]
BuildJobsOpt = Annotated[
    int,
    typer.Option("--build-jobs", help="Build units at once (~3 GB each).", callback=bounded(1)),
]


def fail(message: str, code: int = 1) -> typer.Exit:
    """One red line on stderr; raise what this returns.

    The message is plain text, never markup: it quotes paths, ids and URLs as the user typed
    them, and a `[/x]` in one must print as it is, not end the run in a markup error."""
    err.print(Text.assemble(("error:", "red"), " ", message), highlight=False, soft_wrap=True)
    return typer.Exit(code)


def say(text: str) -> None:
    """One line of plain text: paths and ids stay whole (no wrapping, no markup)."""
    out.print(text, highlight=False, markup=False, soft_wrap=True)


def setup_logging(workdir: Path) -> None:
    """One log file per workdir; the console only gets the final table or one error line."""
    try:
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(workdir / "logs" / "kminer.log", encoding="utf-8")
    except OSError as exc:  # read-only, full, or a file where a folder should be
        raise fail(f"cannot write the log under {workdir}: {exc.strerror or exc}") from None
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "kminer", False)]:
        root.removeHandler(old)
        old.close()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.kminer = True  # type: ignore[attr-defined]
    root.setLevel(logging.INFO)
    root.addHandler(handler)


def open_store(workdir: Path | None, db: str | None) -> Store:
    """The store of a workdir `kminer mine` made (or the one at `--db`)."""
    if db:
        try:
            return Store(db)
        except Exception as exc:  # no server there, wrong credentials, no driver installed
            from sqlalchemy.engine import make_url

            shown = make_url(db).render_as_string(hide_password=True)
            raise fail(f"cannot open the store {shown}: {first_line(exc)}") from None
    workdir = workdir or Path(".")
    if not (workdir / DB_NAME).exists():
        raise fail(f"no kminer store in {workdir} (run `kminer mine` first)")
    return Store.open(workdir)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port for the review server, or one line saying why not.

    Why: uvicorn reports a failed bind as a log line and exit 3; binding here first gives kminer's
    one line, with exit 2 for an address this machine does not have and 1 for a taken port."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise fail(
            f"cannot listen on --host {host!r}: {getattr(exc, 'strerror', None) or exc}", 2
        ) from None
    found.sort(key=lambda info: info[0] != socket.AF_INET)  # as uvicorn: IPv4 for "localhost"
    family, kind, proto, _, address = found[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        code = 1 if exc.errno in (errno.EADDRINUSE, errno.EACCES) else 2
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", code) from None
    return sock


NO_ENDPOINT = "--llm openai needs an endpoint: set OPENAI_BASE_URL or --llm-base-url"


def llm_mode(llm: str | None, base_url: str | None = None) -> str:
    """none | openai; a broken LLM setup stops before any work starts."""
    has_endpoint = bool(
        base_url or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY")
    )
    mode = llm or ("openai" if os.environ.get("OPENAI_BASE_URL") else "none")
    if mode not in ("none", "openai"):
        raise fail(f"unknown --llm {mode!r}; choose none or openai", 2)
    if mode == "openai" and not has_endpoint:
        raise fail(NO_ENDPOINT, 2)
    return mode


def llm_factory(mode: str, base_url: str | None, model: str | None) -> Callable | None:
    """What makes the LLM client over a store, for the stages that can use one; None: no LLM."""
    if mode == "none":
        return None
    from wrappers.llm.client import client_from_env

    def make(store: Store):
        client = client_from_env(store, base_url=base_url, model=model)
        if client is None:
            raise SetupError(NO_ENDPOINT)
        return client

    return make


class RichProgress:
    """Live bars, one per stage, driven by the runner's Progress protocol.

    The display starts with the first stage: a run that fails before one (a refused clone)
    prints its one error line and nothing else, not an empty display."""

    def __init__(self, console: Console) -> None:
        self.bar = Bars(
            "[bold]{task.description:<9}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> RichProgress:
        return self

    def __exit__(self, *exc) -> None:
        if self.tasks:
            self.bar.stop()

    def start(self, stage: str, total: int) -> None:
        if not self.tasks:
            self.bar.start()
        self.tasks[stage] = self.bar.add_task(stage, total=total)

    def advance(self, stage: str, n: int = 1) -> None:
        self.bar.advance(self.tasks[stage], n)

    def end(self, stage: str) -> None:
        task = self.tasks.get(stage)
        if task is not None:
            self.bar.update(task, completed=self.bar.tasks[task].total)


INTERRUPTED = "interrupted; finished work is saved, rerun the same command to resume"


def run_guarded(workdir: Path, call: Callable, interrupted: str = INTERRUPTED) -> RunContext:
    """Run a pipeline call under progress bars, turning failures into one red line."""
    try:
        with RichProgress(err) as progress:
            return call(progress)
    except KminerError as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        raise fail(interrupted, 130) from None
    except Exception as exc:  # a bug: one line here, the traceback in the log
        log.exception("kminer failed")
        raise fail(
            f"{type(exc).__name__}: {first_line(exc)} (see {workdir}/logs/kminer.log)"
        ) from None


def first_line(exc: BaseException) -> str:
    """An exception's message as one line (a database driver's can run to a paragraph)."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_and_report(workdir: Path, call: Callable, as_json: bool) -> RunContext:
    """`run_guarded`, then the funnel."""
    ctx = run_guarded(workdir, call)
    stats = funnel(ctx.store, ctx.repo_id)
    if as_json:
        out.print_json(json.dumps(stats))
        return ctx
    print_funnel(stats)
    if stats["found"] == 0:
        out.print("0 kernels: no CUDA __global__ definitions in this repository.")
    missing = unfetched_submodules(Path(ctx.src.root)) if ctx.src is not None else []
    if missing:
        out.print(
            f"{len(missing)} git submodules not fetched ({', '.join(missing[:3])}): code that "
            "includes them (a CPU reference) does not build; mine again with --submodules."
        )
    waiting = ctx.counters.get("waiting_for_llm", 0)
    if waiting:
        out.print(
            f"{waiting} kernels wait for an LLM wrapper (--llm openai with "
            "OPENAI_BASE_URL or --llm-base-url)."
        )
    return ctx


def print_funnel(stats: dict) -> None:
    table = Table(
        title=f"kminer: {stats['repo']['url']} @ {stats['repo']['commit'][:12]}"
        if stats.get("repo")
        else "kminer"
    )
    table.add_column("stage")
    table.add_column("count", justify="right")
    table.add_column("notes")
    skipped = sum(stats.get("files_skipped", {}).values())
    table.add_row(
        "files scanned",
        str(stats.get("files_scanned", 0)),
        f"{skipped} skipped: "
        + ", ".join(f"{k} {v}" for k, v in stats.get("files_skipped", {}).items()),
    )
    table.add_row(
        "kernels found",
        str(stats["found"]),
        f"{stats.get('templated', 0)} templated, {stats.get('not_launched', 0)} never "
        f"launched, {stats.get('from_macro', 0)} from macros",
    )
    for stage in ("closure", "compile", "wrap", "build"):
        if stage in stats:
            st = stats[stage]
            notes = ", ".join(f"{k} {v}" for k, v in st["reasons"].items())
            table.add_row(
                stage,
                str(st["status"].get("ok", 0)),
                " ".join(f"{k}={v}" for k, v in st["status"].items() if k != "ok")
                + (f" ({notes})" if notes else ""),
            )
    if "compile" in stats:
        table.add_row(
            "unit compiles",
            f"{stats['unit_compiles']}/{stats['found']}",
            f"{stats['compile_rate']:.1%}, {stats['needs_torch']} need torch headers",
        )
    if "build" in stats:
        strategies = ", ".join(f"{k} {v}" for k, v in stats.get("strategies", {}).items())
        table.add_row(
            "labels build", f"{stats['label_builds']}/{stats['found']}", f"wrappers: {strategies}"
        )
    if "testgen" in stats or "verify" in stats:
        _verification_rows(table, stats)
    timings = (stats.get("last_run") or {}).get("timings_s", {})
    if timings:
        table.add_row("time (s)", "", ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    out.print(table)


def _verification_rows(table: Table, stats: dict) -> None:
    """reference → tests → pass, each out of the kernels found."""

    def counts(d: dict) -> str:
        return ", ".join(f"{k} {v}" for k, v in d.items())

    found = stats["found"]
    kill = stats.get("mean_kill_rate")
    table.add_row(
        "reference", f"{stats['references']}/{found}", counts(stats.get("reference_kinds", {}))
    )
    table.add_row("tests", f"{stats['tests']}/{found}", counts(stats.get("testgen_reasons", {})))
    table.add_row(
        "pass",
        f"{stats['passes']}/{found}",
        counts(stats.get("verify_outcomes", {}))
        + ("" if kill is None else f"; mean kill rate {kill:.2f}"),
    )


def print_failures(failures: dict) -> None:
    """Where and why the kernels that are not rows stopped: counts by repository, stage and
    reason, then each kernel."""
    table = Table(title="kernels that are not rows")
    for col in ("repository", "stage", "reason", "kernels"):
        table.add_column(col)
    for g in failures["by_reason"]:
        table.add_row(g["repo"], g["stage"], g["reason"], str(g["kernels"]))
    out.print(table)
    for k in failures["kernels"]:
        detail = " ".join((k["detail"] or "").split())[:160]
        out.print(
            f"{k['stage']:8} {k['reason']:18} {k['file']} {k['kernel']}: {detail}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
