"""The verify stage, on a machine with a GPU: the candidates' bundle, its run.py, the results.

The same bundle that travels to a GPU box (`kminer bundle`, `python run.py`, `kminer ingest`)
is unpacked under DIR/verify and run in place, so both ways give one verdict. An unpacked bundle
keeps its `.build/` extension cache across runs: re-verifying builds nothing it built before.
A candidate is verified again when its label, test or reference changed, or with `--redo`.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from miner.candidate import Candidate, StageName
from miner.errors import KminerError
from miner.stage import RunContext, Stage
from testgen.bundle import BundleInfo, ingest, verify_key, write_bundle

log = logging.getLogger(__name__)
VERIFY_DIR = "verify"  # under the workdir: bundle.tar.gz, bundle/ (with its .build cache), results


@dataclass
class Verify(Stage):
    """run.py's options; `only`: candidate ids (the others are not this run's business)."""

    jobs: int = 0
    gpu_jobs: int = 0
    resume: bool = False
    rebuild: bool = False
    build_timeout: float = 900.0
    run_timeout: float = 180.0
    only: tuple[str, ...] = ()
    echo: Callable[[str], None] = print  # run.py's progress lines
    summary: dict = field(default_factory=dict)  # what the last run ingested

    name = StageName.VERIFY
    needs = (StageName.TESTGEN,)

    def key(self, cand: Candidate, ctx: RunContext) -> str | None:
        if not cand.tests.path or (self.only and cand.id not in self.only):
            return None
        return verify_key(cand)  # the same key as a bundle's results read by `kminer ingest`

    def run(self, batch: list[Candidate], ctx: RunContext) -> Iterator[Candidate]:
        base = ctx.workdir / VERIFY_DIR
        with ctx.timed("bundle"):
            info = write_bundle(ctx.workdir, batch, base / "bundle.tar.gz")
            self.summary = {"ingested": 0, "unknown": [], "outcomes": {}, "skipped": info.skipped}
            if not info.ids:
                return
            _unpack(info.path, base / "bundle")
        results = base / "results.json"
        if not self.resume:
            results.unlink(missing_ok=True)
        try:
            with ctx.timed("run"):
                rc = self._run_py(base / "bundle", results)
        except KeyboardInterrupt:
            if results.is_file():  # what run.py wrote before it stopped is kept
                yield from self._ingest(ctx, info, batch, results)
            raise
        if rc != 0 or not results.is_file():
            raise KminerError(f"run.py exited with {rc} (see {ctx.workdir}/logs/kminer.log)")
        yield from self._ingest(ctx, info, batch, results)

    def _argv(self, results: Path) -> list[str]:
        argv = ["--out", str(results), "--build-timeout", str(self.build_timeout)]
        argv += ["--run-timeout", str(self.run_timeout), "--jobs", str(self.jobs)]
        argv += ["--gpu-jobs", str(self.gpu_jobs)] + (["--resume"] if self.resume else [])
        return argv + (["--rebuild"] if self.rebuild else [])

    def _run_py(self, folder: Path, results: Path) -> int:
        """run.py as a subprocess, its progress lines echoed and logged; Ctrl-C stops it
        cleanly (it writes what it did and exits 130)."""
        cmd = [sys.executable, str(folder / "run.py"), *self._argv(results)]
        log.info("verify: %s (in %s)", " ".join(cmd), folder)
        proc = subprocess.Popen(
            cmd, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            for line in proc.stdout:
                log.info("run.py: %s", line.rstrip())
                self.echo(line.rstrip())
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(2)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise

    def _ingest(self, ctx: RunContext, info: BundleInfo, batch: list[Candidate], results: Path):
        try:
            done = ingest(results, batch)
        except ValueError as exc:
            raise KminerError(str(exc)) from None
        entries = json.loads(results.read_text())["entries"]
        outcomes = Counter(c.stage(StageName.VERIFY).metrics["outcome"] for c in done)
        ctx.counters.update(outcomes)
        known = {c.id for c in ctx.store.candidates(ctx.repo_id)}
        self.summary.update(
            ingested=len(done),
            unknown=sorted(set(entries) - known),
            outcomes=dict(sorted(outcomes.items())),
        )
        yield from done


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
