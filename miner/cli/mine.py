"""`kminer mine` and the stage commands (`wrap`, `build`, `testgen`), `candidates` and `stats`.

This is where the pipeline is assembled: the runner (miner/pipeline.py) is handed the stages in
order, each from the floor of the job it does. The stage modules are imported inside the
commands, so `kminer --help` does not load torch, nvcc probes or the LLM client.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from miner.candidate import StageName
from miner.cli.common import (
    AttemptsOpt,
    BaseUrlOpt,
    BatchOpt,
    BuildJobsOpt,
    DbOpt,
    FilterOpt,
    JsonOpt,
    LlmOpt,
    ModelOpt,
    RedoOpt,
    WorkdirOpt,
    bounded,
    fail,
    llm_factory,
    llm_mode,
    open_store,
    out,
    path_problem,
    print_failures,
    print_funnel,
    run_and_report,
    setup_logging,
)
from miner.clone import check_ref
from miner.errors import BadInput
from miner.gitsafe import redact, validate_source
from miner.pipeline import run
from miner.stage import MINE_STAGES, RunConfig, Stage
from miner.stats import failures as list_failures
from miner.stats import funnel


def pipeline(names: tuple[str, ...]) -> list[Stage]:
    """The stages `names` asks for, in pipeline order."""
    from miner.closure_stage import Closure
    from miner.compile_stage import Compile
    from miner.discover_stage import Discover
    from testgen.testgen_stage import Testgen
    from wrappers.build_stage import Build
    from wrappers.wrap_stage import Wrap

    every = {"discover": Discover, "closure": Closure, "compile": Compile, "wrap": Wrap}
    every |= {"build": Build, "testgen": Testgen}
    return [every[name]() for name in MINE_STAGES if name in names]


def _default_workdir(repo: str) -> Path:
    repo = redact(repo)  # a token must not become a folder name
    name = re.sub(r"\.git$", "", repo.rstrip("/").split("/")[-1].split(":")[-1]) or "repo"
    return Path("runs") / re.sub(r"[^\w.-]", "_", name)


def parse_stages(text: str) -> tuple[str, ...]:
    """`--stages` as names, each a known stage and named once; refused as a bad option value."""
    chosen = tuple(s.strip() for s in text.split(",") if s.strip())
    if not chosen:
        raise fail(f"--stages {text!r} names no stage; choose from {', '.join(MINE_STAGES)}", 2)
    unknown = [s for s in chosen if s not in MINE_STAGES]
    if unknown:
        raise fail(f"unknown stage {unknown[0]!r}; choose from {', '.join(MINE_STAGES)}", 2)
    twice = sorted({s for s in chosen if chosen.count(s) > 1})
    if twice:
        raise fail(f"--stages names {', '.join(twice)} more than once", 2)
    return chosen


def _run_stages(cfg: RunConfig, command: str, as_json: bool, clone: bool = False) -> None:
    make_llm = llm_factory(cfg.llm, cfg.llm_base_url, cfg.model)
    stages = pipeline(cfg.stages)

    def call(progress):
        return run(cfg, stages, command=command, progress=progress, clone=clone, make_llm=make_llm)

    run_and_report(cfg.workdir, call, as_json)


def mine(
    repo: Annotated[str | None, typer.Argument(help="URL, git dir or folder.")] = None,
    workdir: WorkdirOpt = None,
    ref: Annotated[str | None, typer.Option(help="Branch, tag or commit.")] = None,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs", "-j", help="Parallel compiles (0: one per CPU).", callback=bounded(0)
        ),
    ] = 0,
    filter: FilterOpt = None,
    stages: Annotated[
        str,
        typer.Option(help="Comma-separated subset of discover,closure,compile,wrap,build,testgen."),
    ] = ",".join(MINE_STAGES),
    redo: RedoOpt = False,
    submodules: Annotated[bool, typer.Option(help="Also fetch submodules.")] = False,
    max_file_kb: Annotated[
        int, typer.Option(help="Skip source files larger than this.", callback=bounded(1))
    ] = 2048,
    compile_timeout: Annotated[
        float, typer.Option(help="Seconds per nvcc call.", callback=bounded(0, above=True))
    ] = 600.0,
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
    if repo is None:
        raise fail("missing REPO (a git URL, a git dir or a folder)", 2)
    chosen = parse_stages(stages)
    try:  # refused before the workdir is touched; fetch_repo checks again
        validate_source(repo)
        check_ref(ref)
    except BadInput as exc:
        raise fail(str(exc)) from None
    if workdir is None:  # the option's own check has not seen this one
        workdir = _default_workdir(repo)
        if problem := path_problem(workdir, directory=True):
            raise fail(f"{problem}; pick a --workdir", 2)
    mode = llm_mode(llm, llm_base_url)
    setup_logging(workdir)
    cfg = RunConfig(
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
        llm=mode,
        model=model,
        llm_base_url=llm_base_url,
        max_attempts=max_attempts,
        batch_size=batch_size,
        build_jobs=build_jobs,
    )
    _run_stages(cfg, f"mine {redact(repo)}", as_json, clone=True)


def wrap(
    workdir: WorkdirOpt = None,
    llm: LlmOpt = None,
    model: ModelOpt = None,
    llm_base_url: BaseUrlOpt = None,
    max_attempts: AttemptsOpt = 3,
    filter: FilterOpt = None,
    redo: RedoOpt = False,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Give mined kernels a host wrapper + binding (mined launcher, rule, or LLM)."""
    llm_fields = _llm_fields(llm, model, llm_base_url, max_attempts)
    _one_stage("wrap", workdir, as_json, filter=filter, redo=redo, db_url=db, **llm_fields)


def build(
    workdir: WorkdirOpt = None,
    jobs: BuildJobsOpt = 2,
    batch_size: BatchOpt = 16,
    filter: FilterOpt = None,
    redo: RedoOpt = False,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Build-check every label (nvcc with cpp_extension's flags; many labels per unit)."""
    _one_stage(
        "build", workdir, as_json, filter=filter, redo=redo, db_url=db, build_jobs=jobs,
        batch_size=batch_size,
    )  # fmt: skip


def testgen(
    workdir: WorkdirOpt = None,
    filter: FilterOpt = None,
    redo: RedoOpt = False,
    llm: LlmOpt = None,
    model: ModelOpt = None,
    llm_base_url: BaseUrlOpt = None,
    max_attempts: AttemptsOpt = 3,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Give built labels a CPU reference, test cases, wrong variants and a standalone test."""
    llm_fields = _llm_fields(llm, model, llm_base_url, max_attempts)
    _one_stage("testgen", workdir, as_json, filter=filter, redo=redo, db_url=db, **llm_fields)


def _llm_fields(llm, model, llm_base_url, max_attempts) -> dict:
    """The run's model settings (a bad --llm is refused here, before anything runs)."""
    mode = llm_mode(llm, llm_base_url)
    return dict(llm=mode, model=model, llm_base_url=llm_base_url, max_attempts=max_attempts)


def _one_stage(stage: str, workdir: Path | None, as_json: bool, **fields) -> None:
    """One stage over an existing workdir (the repository comes from its store)."""
    workdir = workdir or Path(".")
    setup_logging(workdir)
    cfg = RunConfig(repo="", workdir=workdir, stages=(stage,), **fields)
    _run_stages(cfg, stage, as_json)


def candidates(
    workdir: WorkdirOpt = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
    filter: FilterOpt = None,
) -> None:
    """List the candidates (JSON Lines with --json)."""
    store = open_store(workdir, db)
    repo = store.repo()
    rows = [c for c in store.iter_candidates(repo.id if repo else None) if c.matches(filter)]
    if as_json:
        for c in rows:
            sys.stdout.write(json.dumps(c.summary()) + "\n")
        return
    table = Table()
    for col in ("id", "kernel", "file:line", "compile", "reason"):
        table.add_column(col)
    for c in rows:
        r = c.stage(StageName.COMPILE)
        table.add_row(
            c.id,
            c.kernel.name,
            f"{c.kernel.file}:{c.kernel.line}",
            r.status.value if r else "-",
            (r.reason.value if r and r.reason else ""),
        )
    out.print(table)


def stats(
    workdir: WorkdirOpt = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
    failures: Annotated[
        bool,
        typer.Option(help="Also every kernel that is not a row: where it stopped and why."),
    ] = False,
) -> None:
    """The funnel: found, skipped by reason, unit compiles, timings."""
    store = open_store(workdir, db)
    data = funnel(store)
    if failures:
        data["failures"] = list_failures(store)
    if as_json:
        out.print_json(json.dumps(data))
        return
    print_funnel(data)
    if failures:
        print_failures(data["failures"])
