"""The `kminer` command line: one subcommand per job, one red line per user error."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup


class _OneLineErrors(TyperGroup):
    """Usage errors as one red line too, like every other error of kminer.

    typer vendors its own click, so exceptions are recognised by name and shape."""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except Exception as exc:
            kind = type(exc).__name__
            if kind == "Exit":
                sys.exit(exc.exit_code)
            if kind == "NoArgsIsHelp":
                ctx = getattr(exc, "ctx", None)
                out.print(ctx.get_help() if ctx else str(exc))
                sys.exit(0)
            if kind == "Abort":
                err.print("[red]error:[/red] aborted", highlight=False)
                sys.exit(130)
            if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
                message = " ".join(exc.format_message().split())
                err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
                sys.exit(exc.exit_code)
            raise
        # without standalone mode click hands back the code of typer.Exit instead of exiting
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    help="Mine CUDA kernels from a repository into standalone, tested dataset rows.",
)
err = Console(stderr=True)
out = Console()

WorkdirOpt = Annotated[Path | None, typer.Option("--workdir", "-w", help="Run directory.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db", help="SQLAlchemy URL instead of the workdir's SQLite file (e.g. postgresql://...)."
    ),
]


def _default_workdir(repo: str) -> Path:
    name = re.sub(r"\.git$", "", repo.rstrip("/").split("/")[-1].split(":")[-1]) or "repo"
    return Path("runs") / re.sub(r"[^\w.-]", "_", name)


def _setup_logging(workdir: Path) -> None:
    """One log file per workdir; the console only gets the final table or one error line."""
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "kminer", False)]:
        root.removeHandler(old)
        old.close()
    handler = logging.FileHandler(workdir / "logs" / "kminer.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.kminer = True  # type: ignore[attr-defined]
    root.setLevel(logging.INFO)
    root.addHandler(handler)


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


class RichProgress:
    """Live bars, one per stage, driven by the pipeline's Progress protocol."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self.bar = Progress(
            "[bold]{task.description:<9}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def start(self, stage: str, total: int) -> None:
        self.tasks[stage] = self.bar.add_task(stage, total=total)

    def advance(self, stage: str, n: int = 1) -> None:
        self.bar.advance(self.tasks[stage], n)

    def end(self, stage: str) -> None:
        task = self.tasks.get(stage)
        if task is not None:
            self.bar.update(task, completed=self.bar.tasks[task].total)


def _print_funnel(stats: dict) -> None:
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


LlmOpt = Annotated[
    str | None,
    typer.Option(
        "--llm", help="none | openai (default: openai when OPENAI_BASE_URL is set, else none)."
    ),
]
ModelOpt = Annotated[str | None, typer.Option("--model", help="LLM model name.")]
BaseUrlOpt = Annotated[str | None, typer.Option("--llm-base-url", help="OpenAI-compatible URL.")]
AttemptsOpt = Annotated[int, typer.Option("--max-attempts", help="LLM attempts per kernel.")]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="Labels per build unit.")]
BuildJobsOpt = Annotated[
    int, typer.Option("--build-jobs", help="Build units at once (~3 GB each).")
]


def _llm_mode(llm: str | None, base_url: str | None = None) -> str:
    """none | openai; a broken LLM setup stops before any work starts."""
    has_endpoint = bool(
        base_url or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY")
    )
    mode = llm or ("openai" if os.environ.get("OPENAI_BASE_URL") else "none")
    if mode not in ("none", "openai"):
        raise _fail(f"unknown --llm {mode!r}; choose none or openai", 2)
    if mode == "openai" and not has_endpoint:
        raise _fail("--llm openai needs an endpoint: set OPENAI_BASE_URL or --llm-base-url", 2)
    return mode


def _run(workdir: Path, call, as_json: bool):
    """Run a pipeline call under a progress bar, turning failures into one red line."""
    from miner.errors import KminerError
    from miner.stats import funnel

    try:
        with RichProgress(err) as progress:
            ctx = call(progress)
    except KminerError as exc:
        raise _fail(str(exc)) from None
    except KeyboardInterrupt:
        raise _fail(
            "interrupted; finished work is saved, rerun the same command to resume", 130
        ) from None
    except Exception as exc:  # a bug: one line here, the traceback in the log
        logging.getLogger(__name__).exception("kminer failed")
        raise _fail(f"{type(exc).__name__}: {exc} (see {workdir}/logs/kminer.log)") from None
    stats = funnel(ctx.store, ctx.repo_id)
    if as_json:
        out.print_json(json.dumps(stats))
    else:
        _print_funnel(stats)
        if stats["found"] == 0:
            out.print("0 kernels: no CUDA __global__ definitions in this repository.")
        waiting = ctx.counters.get("waiting_for_llm", 0)
        if waiting:
            out.print(
                f"{waiting} kernels wait for an LLM wrapper (--llm openai with "
                "OPENAI_BASE_URL or --llm-base-url)."
            )
    return ctx


@app.command()
def mine(
    repo: Annotated[str | None, typer.Argument(help="URL, git dir or folder.")] = None,
    workdir: WorkdirOpt = None,
    ref: Annotated[str | None, typer.Option(help="Branch, tag or commit.")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Parallel compiles.")] = 0,
    filter: Annotated[str | None, typer.Option("--filter", help="Glob on file or kernel.")] = None,
    stages: Annotated[
        str,
        typer.Option(help="Comma-separated subset of discover,closure,compile,wrap,build,testgen."),
    ] = "discover,closure,compile,wrap,build,testgen",
    redo: Annotated[bool, typer.Option(help="Redo finished work.")] = False,
    submodules: Annotated[bool, typer.Option(help="Also fetch submodules.")] = False,
    max_file_kb: Annotated[int, typer.Option(help="Skip source files larger than this.")] = 2048,
    compile_timeout: Annotated[float, typer.Option(help="Seconds per nvcc call.")] = 600.0,
    llm: LlmOpt = None,
    model: ModelOpt = None,
    llm_base_url: BaseUrlOpt = None,
    max_attempts: AttemptsOpt = 3,
    batch_size: BatchOpt = 16,
    build_jobs: BuildJobsOpt = 2,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Mine every CUDA kernel of REPO into standalone compile units and built labels."""
    from miner.pipeline import MINE_STAGES, MineConfig, run_mine

    if repo is None:
        raise _fail("missing REPO (a git URL, a git dir or a folder)", 2)
    chosen = tuple(s.strip() for s in stages.split(",") if s.strip())
    unknown = [s for s in chosen if s not in MINE_STAGES]
    if unknown:
        raise _fail(f"unknown stage {unknown[0]!r}; choose from {', '.join(MINE_STAGES)}", 2)
    workdir = workdir or _default_workdir(repo)
    _setup_logging(workdir)
    cfg = MineConfig(
        repo=repo,
        workdir=workdir,
        ref=ref,
        jobs=jobs or (os.cpu_count() or 2),
        filter=filter,
        stages=chosen,
        redo=redo,
        submodules=submodules,
        db_url=db,
        max_file_bytes=max_file_kb * 1024,
        compile_timeout=compile_timeout,
        llm=_llm_mode(llm, llm_base_url),
        model=model,
        llm_base_url=llm_base_url,
        max_attempts=max_attempts,
        batch_size=batch_size,
        build_jobs=build_jobs,
    )
    _run(workdir, lambda progress: run_mine(cfg, progress), as_json)


@app.command()
def wrap(
    workdir: WorkdirOpt = None,
    llm: LlmOpt = None,
    model: ModelOpt = None,
    llm_base_url: BaseUrlOpt = None,
    max_attempts: AttemptsOpt = 3,
    filter: Annotated[str | None, typer.Option("--filter", help="Glob on file or kernel.")] = None,
    redo: Annotated[bool, typer.Option(help="Redo finished work.")] = False,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Give mined kernels a host wrapper + binding (mined launcher, rule, or LLM)."""
    from miner.pipeline import MineConfig, run_stages

    workdir = workdir or Path(".")
    _setup_logging(workdir)
    cfg = MineConfig(
        repo="",
        workdir=workdir,
        stages=("wrap",),
        filter=filter,
        redo=redo,
        db_url=db,
        llm=_llm_mode(llm, llm_base_url),
        model=model,
        llm_base_url=llm_base_url,
        max_attempts=max_attempts,
    )
    _run(workdir, lambda progress: run_stages(cfg, progress), as_json)


@app.command()
def build(
    workdir: WorkdirOpt = None,
    jobs: BuildJobsOpt = 2,
    batch_size: BatchOpt = 16,
    filter: Annotated[str | None, typer.Option("--filter", help="Glob on file or kernel.")] = None,
    redo: Annotated[bool, typer.Option(help="Redo finished work.")] = False,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Build-check every label (nvcc with cpp_extension's flags; many labels per unit)."""
    from miner.pipeline import MineConfig, run_stages

    workdir = workdir or Path(".")
    _setup_logging(workdir)
    cfg = MineConfig(
        repo="",
        workdir=workdir,
        stages=("build",),
        filter=filter,
        redo=redo,
        db_url=db,
        build_jobs=jobs,
        batch_size=batch_size,
    )
    _run(workdir, lambda progress: run_stages(cfg, progress), as_json)


def _open_store(workdir: Path | None, db: str | None):
    from curation.store import DB_NAME, Store

    if db:
        return Store(db)
    workdir = workdir or Path(".")
    if not (workdir / DB_NAME).exists():
        raise _fail(f"no kminer store in {workdir} (run `kminer mine` first)")
    return Store.open(workdir)


@app.command()
def candidates(
    workdir: WorkdirOpt = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
    filter: Annotated[str | None, typer.Option("--filter")] = None,
) -> None:
    """List the candidates (JSON Lines with --json)."""
    from miner.candidate import Stage
    from miner.stages import matches

    store = _open_store(workdir, db)
    repo = store.repo()
    rows = [c for c in store.iter_candidates(repo.id if repo else None) if matches(c, filter)]
    if as_json:
        for c in rows:
            sys.stdout.write(json.dumps(c.summary()) + "\n")
        return
    table = Table()
    for col in ("id", "kernel", "file:line", "compile", "reason"):
        table.add_column(col)
    for c in rows:
        r = c.stage(Stage.COMPILE)
        table.add_row(
            c.id,
            c.kernel.name,
            f"{c.kernel.file}:{c.kernel.line}",
            r.status.value if r else "-",
            (r.reason.value if r and r.reason else ""),
        )
    out.print(table)


@app.command()
def stats(
    workdir: WorkdirOpt = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
    failures: Annotated[bool, typer.Option(help="Also list every failure.")] = False,
) -> None:
    """The funnel: found, skipped by reason, unit compiles, timings."""
    from miner.stats import failures as list_failures
    from miner.stats import funnel

    store = _open_store(workdir, db)
    data = funnel(store)
    if failures:
        data["failures"] = list_failures(store)
    if as_json:
        out.print_json(json.dumps(data))
    else:
        _print_funnel(data)
        for f in data.get("failures", []):
            out.print(
                f"{f['stage']:8} {f['reason']:16} {f['file']} {f['kernel']}: {f['detail']}",
                highlight=False,
            )


# `python -m miner.cli`: cli_verify must register its commands on this very module's app
if __name__ == "__main__":  # pragma: no cover
    sys.modules.setdefault("miner.cli", sys.modules[__name__])
from curation import cli as curation_cli  # noqa: E402, F401  (curator, serve)
from miner import cli_verify  # noqa: E402, F401  (testgen, bundle, ingest, verify)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
