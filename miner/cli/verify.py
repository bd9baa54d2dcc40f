"""`kminer bundle | ingest | verify`: the tests run on a GPU, here or on another machine.

A machine with a GPU verifies in place (`verify`: the verify stage, which writes the bundle
under DIR/verify, runs its run.py and reads the results back); anywhere else the same bundle
travels: `bundle` here, `python run.py` on a GPU box, `ingest` of its results.json here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from miner.candidate import StageName
from miner.cli.common import (
    DbOpt,
    FilterOpt,
    JsonOpt,
    RedoOpt,
    WorkdirOpt,
    bounded,
    err,
    fail,
    open_store,
    out,
    run_guarded,
    say,
    setup_logging,
    usable_file,
)
from miner.pipeline import run
from miner.stage import RunConfig

OutOpt = Annotated[
    Path | None, typer.Option("--out", "-o", help="The .tar.gz to write.", callback=usable_file)
]


def _candidates(workdir: Path | None, db: str | None, filter: str | None = None):
    """The store, its repository id and its candidates (those matching `filter`)."""
    store = open_store(workdir, db)
    if workdir is not None or not db:
        setup_logging(workdir or Path("."))
    repo = store.repo()
    repo_id = repo.id if repo else None
    return store, repo_id, [c for c in store.candidates(repo_id) if c.matches(filter)]


def _with_tests(workdir: Path, cands: list) -> list:
    found = [c for c in cands if c.tests.path]
    if not found:
        raise fail(f"no candidate in {workdir} has tests: run `kminer testgen` first")
    return found


def bundle(
    workdir: WorkdirOpt = None,
    out_path: OutOpt = None,
    filter: FilterOpt = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write the tests of the candidates into one tar.gz for `python run.py` on a GPU box."""
    from testgen.bundle import write_bundle

    if out_path is None:
        raise fail("missing --out B.tar.gz", 2)
    workdir = workdir or Path(".")
    _, _, cands = _candidates(workdir, db, filter)
    with_tests = _with_tests(workdir, cands)
    info = write_bundle(workdir, with_tests, out_path)
    if not info.ids:
        out_path.unlink(missing_ok=True)
        why = "; ".join(f"{k}: {v}" for k, v in sorted(info.skipped.items())[:3])
        raise fail(f"none of the {len(with_tests)} candidates with tests could be bundled ({why})")
    if as_json:
        data = {"path": str(info.path), "ids": info.ids, "skipped": info.skipped}
        out.print_json(json.dumps(data))
        return
    say(f"{len(info.ids)} candidates in {info.path}")
    if info.skipped:
        say(f"{len(info.skipped)} skipped:")
        for cid, why in sorted(info.skipped.items()):
            say(f"  {cid}: {why}")
    say(
        f"on a GPU box: tar xzf {info.path.name}, then `python run.py --out results.json`; "
        f"then `kminer ingest --workdir {workdir} results.json` here",
    )


def _report(summary: dict, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps({k: v for k, v in summary.items() if k != "skipped"}))
        return
    counts = ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items())
    say(f"{summary['ingested']} results: {counts or 'none'}")
    for cid, why in sorted(summary.get("skipped", {}).items()):
        say(f"not bundled: {cid}: {why}")
    if summary["unknown"]:
        say(f"{len(summary['unknown'])} ids match no candidate: {', '.join(summary['unknown'])}")


def ingest(
    results: Annotated[Path | None, typer.Argument(help="A run.py results.json.")] = None,
    workdir: WorkdirOpt = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Read a GPU box's results.json into the candidates' verify stage."""
    from testgen.bundle import ingest as read_results

    if results is None:
        raise fail("missing RESULTS (the results.json that run.py wrote)", 2)
    store, repo_id, cands = _candidates(workdir, db)
    try:
        done = read_results(results, cands)
    except ValueError as exc:
        raise fail(str(exc)) from None
    store.save(done, repo_id)
    entries = json.loads(results.read_text())["entries"]
    outcomes = Counter(c.stage(StageName.VERIFY).metrics["outcome"] for c in done)
    summary = {
        "ingested": len(done),
        "unknown": sorted(set(entries) - {c.id for c in done}),
        "outcomes": dict(sorted(outcomes.items())),
    }
    _report(summary, as_json)


def has_gpu() -> bool:
    """KMINER_ASSUME_GPU=1/0 decides; otherwise torch in a subprocess (CUDA stays out of here)."""
    assumed = os.environ.get("KMINER_ASSUME_GPU", "")
    if assumed in ("0", "1"):
        return assumed == "1"
    code = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def verify(
    workdir: WorkdirOpt = None,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="Parallel builds (0: auto).", callback=bounded(0))
    ] = 0,
    gpu_jobs: Annotated[
        int, typer.Option("--gpu-jobs", help="Parallel GPU runs (0: 4/GPU).", callback=bounded(0))
    ] = 0,
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Candidate ids (repeat or comma-separate).")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Keep the results of the last run.")] = False,
    rebuild: Annotated[bool, typer.Option(help="Ignore cached build verdicts.")] = False,
    build_timeout: Annotated[
        float, typer.Option(help="Seconds per build.", callback=bounded(0, above=True))
    ] = 900.0,
    run_timeout: Annotated[
        float, typer.Option(help="Seconds per GPU run.", callback=bounded(0, above=True))
    ] = 180.0,
    filter: FilterOpt = None,
    redo: RedoOpt = False,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the tests on this machine's GPU (bundle, run.py, ingest) into the verify stage."""
    from testgen.verify_stage import Verify

    workdir = (workdir or Path(".")).resolve()
    ids = tuple(i.strip() for item in only or [] for i in item.split(",") if i.strip())
    if only is not None and not ids:
        raise fail("--only names no candidate id", 2)
    _, _, every = _candidates(workdir, db)
    unknown = sorted(set(ids) - {c.id for c in every})
    if unknown:
        raise fail(f"--only: no candidate in {workdir} has the id {', '.join(unknown)}", 2)
    cands = [c for c in every if c.matches(filter)]
    _with_tests(workdir, cands)
    if not has_gpu():
        raise fail(
            f"no CUDA GPU on this machine: run `kminer bundle --workdir {workdir} --out "
            "B.tar.gz`, then `python run.py` on a GPU box and "
            f"`kminer ingest --workdir {workdir} results.json`",
            2,
        )
    stage = Verify(jobs, gpu_jobs, resume, rebuild, build_timeout, run_timeout, ids, echo=_echo)
    cfg = RunConfig(
        repo="", workdir=workdir, stages=("verify",), filter=filter, redo=redo, db_url=db
    )

    def call(progress):
        return run(cfg, [stage], command="verify", progress=progress)

    run_guarded(workdir, call, "interrupted; results so far are saved, rerun with --resume")
    _report(stage.summary or {"ingested": 0, "unknown": [], "outcomes": {}}, as_json)


def _echo(line: str) -> None:
    err.print(line, highlight=False, markup=False, soft_wrap=True)
