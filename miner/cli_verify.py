"""`kminer testgen | bundle | ingest | verify`: tests against a CPU reference, run on a GPU.

Registered on miner.cli's app. A machine with a GPU verifies in place (`verify`: a bundle unpacked
under DIR/verify, its run.py as a subprocess, the results read back); anywhere else the same
bundle travels: `bundle` here, `python run.py` on a GPU box, `ingest` of its results.json here.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from miner.cli import (
    DbOpt,
    JsonOpt,
    WorkdirOpt,
    _fail,
    _open_store,
    _run,
    _setup_logging,
    app,
    err,
    out,
)

log = logging.getLogger(__name__)
FilterOpt = Annotated[str | None, typer.Option("--filter", help="Glob on file or kernel.")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="The .tar.gz to write.")]
VERIFY_DIR = "verify"  # under the workdir: bundle.tar.gz, bundle/ (with its .build cache), results


@app.command()
def testgen(
    workdir: WorkdirOpt = None,
    filter: FilterOpt = None,
    redo: Annotated[bool, typer.Option(help="Redo finished work.")] = False,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Give built labels a CPU reference, test cases, wrong variants and a standalone test."""
    from miner.pipeline import MineConfig, run_stages

    workdir = workdir or Path(".")
    _setup_logging(workdir)
    cfg = MineConfig(
        repo="", workdir=workdir, stages=("testgen",), filter=filter, redo=redo, db_url=db
    )
    _run(workdir, lambda progress: run_stages(cfg, progress), as_json)


def _say(text: str) -> None:
    """One line of plain text: paths and ids stay whole (no wrapping, no markup)."""
    out.print(text, highlight=False, markup=False, soft_wrap=True)


def _store_and_candidates(workdir: Path | None, db: str | None, filter: str | None = None):
    """The store, its repository id and its candidates (those matching `filter`)."""
    from miner.stages import matches

    store = _open_store(workdir, db)
    if workdir is not None or not db:
        _setup_logging(workdir or Path("."))
    repo = store.repo()
    repo_id = repo.id if repo else None
    return store, repo_id, [c for c in store.candidates(repo_id) if matches(c, filter)]


def _write(workdir: Path, cands: list, path: Path):
    """The bundle of the candidates that have tests; an error when there is nothing to bundle."""
    from testgen.bundle import write_bundle

    with_tests = [c for c in cands if c.tests.path]
    if not with_tests:
        raise _fail(f"no candidate in {workdir} has tests: run `kminer testgen` first")
    info = write_bundle(workdir, with_tests, path)
    if not info.ids:
        path.unlink(missing_ok=True)
        why = "; ".join(f"{k}: {v}" for k, v in sorted(info.skipped.items())[:3])
        raise _fail(f"none of the {len(with_tests)} candidates with tests could be bundled ({why})")
    return info


@app.command()
def bundle(
    workdir: WorkdirOpt = None,
    out_path: OutOpt = None,
    filter: FilterOpt = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write the tests of the candidates into one tar.gz for `python run.py` on a GPU box."""
    if out_path is None:
        raise _fail("missing --out B.tar.gz", 2)
    workdir = workdir or Path(".")
    _, _, cands = _store_and_candidates(workdir, db, filter)
    info = _write(workdir, cands, out_path)
    if as_json:
        data = {"path": str(info.path), "ids": info.ids, "skipped": info.skipped}
        out.print_json(json.dumps(data))
        return
    _say(f"{len(info.ids)} candidates in {info.path}")
    if info.skipped:
        _say(f"{len(info.skipped)} skipped:")
        for cid, why in sorted(info.skipped.items()):
            _say(f"  {cid}: {why}")
    _say(
        f"on a GPU box: tar xzf {info.path.name}, then `python run.py --out results.json`; "
        f"then `kminer ingest --workdir {workdir} results.json` here",
    )


def _ingest(store, repo_id, cands: list, results: Path) -> dict:
    """Read results.json into the candidates' verify stages and save them in one write."""
    from miner.candidate import Stage
    from testgen.bundle import ingest

    try:
        done = ingest(results, cands)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    store.save(done, repo_id)
    entries = json.loads(results.read_text())["entries"]
    outcomes = Counter(c.stage(Stage.VERIFY).metrics["outcome"] for c in done)
    return {
        "ingested": len(done),
        "unknown": sorted(set(entries) - {c.id for c in done}),
        "outcomes": dict(sorted(outcomes.items())),
    }


def _report(summary: dict, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps(summary))
        return
    counts = ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items())
    _say(f"{summary['ingested']} results: {counts or 'none'}")
    for cid, why in sorted(summary.get("skipped", {}).items()):
        _say(f"not bundled: {cid}: {why}")
    if summary["unknown"]:
        _say(
            f"{len(summary['unknown'])} ids match no candidate: {', '.join(summary['unknown'])}",
        )


@app.command()
def ingest(
    results: Annotated[Path | None, typer.Argument(help="A run.py results.json.")] = None,
    workdir: WorkdirOpt = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Read a GPU box's results.json into the candidates' verify stage."""
    if results is None:
        raise _fail("missing RESULTS (the results.json that run.py wrote)", 2)
    store, repo_id, cands = _store_and_candidates(workdir, db)
    _report(_ingest(store, repo_id, cands, results), as_json)


def _has_gpu() -> bool:
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


def _unpack(tar_path: Path, folder: Path) -> None:
    """Unpack over the previous bundle: its .build cache stays, its old files go."""
    if folder.is_dir():
        for child in folder.iterdir():
            if child.name == ".build":
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    with tarfile.open(tar_path) as tar:
        tar.extractall(folder.parent, filter="data")


def _run_py(folder: Path, argv: list[str]) -> int:
    """run.py as a subprocess, its progress lines to stderr and the log; Ctrl-C stops it cleanly
    (it writes what it did and exits 130)."""
    cmd = [sys.executable, str(folder / "run.py"), *argv]
    log.info("verify: %s (in %s)", " ".join(cmd), folder)
    proc = subprocess.Popen(
        cmd, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        for line in proc.stdout:
            log.info("run.py: %s", line.rstrip())
            err.print(line.rstrip(), highlight=False, markup=False, soft_wrap=True)
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(2)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise


@app.command()
def verify(
    workdir: WorkdirOpt = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Parallel builds (0: auto).")] = 0,
    gpu_jobs: Annotated[int, typer.Option("--gpu-jobs", help="Parallel GPU runs (0: 1/GPU).")] = 0,
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Candidate ids (repeat or comma-separate).")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Keep the results of the last run.")] = False,
    rebuild: Annotated[bool, typer.Option(help="Ignore cached build verdicts.")] = False,
    build_timeout: Annotated[float, typer.Option(help="Seconds per build.")] = 900.0,
    run_timeout: Annotated[float, typer.Option(help="Seconds per GPU run.")] = 180.0,
    filter: FilterOpt = None,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the tests on this machine's GPU (bundle, run.py, ingest) into the verify stage."""
    workdir = (workdir or Path(".")).resolve()
    store, repo_id, cands = _store_and_candidates(workdir, db, filter)
    if not any(c.tests.path for c in cands):
        raise _fail(f"no candidate in {workdir} has tests: run `kminer testgen` first")
    if not _has_gpu():
        raise _fail(
            f"no CUDA GPU on this machine: run `kminer bundle --workdir {workdir} --out "
            "B.tar.gz`, then `python run.py` on a GPU box and "
            f"`kminer ingest --workdir {workdir} results.json`",
            2,
        )
    timings: dict[str, float] = {}
    run_id = store.start_run("verify")
    status, summary = "failed", {"outcomes": {}}
    try:
        start = time.perf_counter()
        base = workdir / VERIFY_DIR
        info = _write(workdir, cands, base / "bundle.tar.gz")
        _unpack(info.path, base / "bundle")
        results = base / "results.json"
        if not resume:
            results.unlink(missing_ok=True)
        argv = ["--out", str(results), "--build-timeout", str(build_timeout)]
        argv += ["--run-timeout", str(run_timeout), "--jobs", str(jobs)]
        argv += ["--gpu-jobs", str(gpu_jobs)] + (["--resume"] if resume else [])
        argv += ["--rebuild"] if rebuild else []
        ids = [i for item in only or [] for i in item.split(",") if i]
        argv += ["--only", *ids] if ids else []
        timings["bundle"] = round(time.perf_counter() - start, 3)
        start = time.perf_counter()
        try:
            rc = _run_py(base / "bundle", argv)
        except KeyboardInterrupt:
            if results.is_file():
                _ingest(store, repo_id, cands, results)
            status = "interrupted"
            raise _fail("interrupted; results so far are saved, rerun with --resume", 130) from None
        timings["run"] = round(time.perf_counter() - start, 3)
        if rc != 0 or not results.is_file():
            raise _fail(f"run.py exited with {rc} (see {workdir}/logs/kminer.log)")
        summary = _ingest(store, repo_id, cands, results)
        status = "ok"
    finally:
        store.finish_run(run_id, status, repo_id, timings, summary["outcomes"])
    _report({**summary, "skipped": info.skipped}, as_json)
