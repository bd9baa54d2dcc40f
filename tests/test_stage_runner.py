"""The stage runner (miner/pipeline.py) and the keys it decides by (miner/versions.py): a bug on
one candidate is `internal_error` for that candidate only and is tried again on the next run;
a batch-level bug leaves the unfinished candidates `internal_error`; a setup error stops the run;
keys follow each stage's own import closure."""

from __future__ import annotations

from pathlib import Path

import pytest

from miner.candidate import (
    Candidate,
    Kernel,
    Provenance,
    Reason,
    StageName,
    StageResult,
    Status,
)
from miner.errors import SetupError
from miner.pipeline import run
from miner.stage import RunConfig, Stage
from miner.store import Store
from miner.versions import code_version, import_closure

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def wd(tmp_path):
    """A workdir with three discovered candidates a, b, c."""
    wd = tmp_path / "run"
    (wd / "src").mkdir(parents=True)
    store = Store.open(wd)
    repo_id = store.upsert_repo("https://example.com/r", "0" * 40, root=str(wd / "src"))
    cands = []
    for cid in "abc":
        kernel = Kernel(name=f"{cid}_k", file=f"{cid}.cu", line=1, start_line=1, end_line=1,
                        source="")  # fmt: skip
        prov = Provenance(repo_url="https://example.com/r", commit="0" * 40)
        cand = Candidate(id=cid, provenance=prov, kernel=kernel)
        cand.set_stage(StageName.DISCOVER, StageResult(status=Status.OK))
        cands.append(cand)
    store.save(cands, repo_id)
    store.close()
    return wd


class Doubling(Stage):
    """Writes `detail = 2 * len(id)`; fails on the ids in `broken`."""

    name = StageName.CLOSURE
    needs = (StageName.DISCOVER,)

    def __init__(self, broken=()):
        self.broken, self.seen = set(broken), []

    def key(self, cand, ctx):
        return "k1"

    def run(self, batch, ctx):
        self.seen.append(sorted(c.id for c in batch))
        return self.each(batch, self._one)

    def _one(self, cand):
        if cand.id in self.broken:
            raise ZeroDivisionError(f"bug on {cand.id}")
        cand.set_stage(self.name, StageResult(status=Status.OK, detail=str(2 * len(cand.id))))


def results(wd: Path) -> dict[str, StageResult]:
    store = Store.open(wd)
    try:
        return {c.id: c.stage(StageName.CLOSURE) for c in store.candidates()}
    finally:
        store.close()


def test_a_bug_on_one_candidate_is_internal_error_for_it_only(wd, caplog):
    stage = Doubling(broken={"b"})
    run(RunConfig(repo="", workdir=wd), [stage], command="t")
    got = results(wd)
    assert (got["a"].status, got["a"].detail, got["a"].key) == (Status.OK, "2", "k1")
    assert (got["b"].status, got["b"].reason) == (Status.ERROR, Reason.INTERNAL_ERROR)
    assert got["b"].detail == "ZeroDivisionError: bug on b" and got["b"].key == ""
    assert "ZeroDivisionError: bug on b" in caplog.text and "Traceback" in caplog.text
    fixed = Doubling()
    run(RunConfig(repo="", workdir=wd), [fixed], command="t")
    assert fixed.seen == [["b"]]  # only the one that failed is tried again
    assert results(wd)["b"].status == Status.OK
    again = Doubling()
    run(RunConfig(repo="", workdir=wd, redo=True), [again], command="t")
    assert again.seen == [["a", "b", "c"]]


def test_a_batch_bug_marks_what_was_not_finished(wd):
    class HalfThenBoom(Doubling):
        def run(self, batch, ctx):
            self._one(batch[0])
            yield batch[0]
            raise RuntimeError("the batch broke")

    run(RunConfig(repo="", workdir=wd), [HalfThenBoom()], command="t")
    got = results(wd)
    assert got["a"].status == Status.OK
    assert {got[c].reason for c in "bc"} == {Reason.INTERNAL_ERROR}
    assert got["b"].detail == "RuntimeError: the batch broke"


def test_a_setup_error_stops_the_run_and_its_row_says_failed(wd):
    class NoTool(Doubling):
        def run(self, batch, ctx):
            raise SetupError("nvcc is gone")

    with pytest.raises(SetupError):
        run(RunConfig(repo="", workdir=wd), [NoTool()], command="t")
    store = Store.open(wd)
    assert store.last_run().status == "failed"
    store.close()
    assert all(r is None for r in results(wd).values())


def test_filter_needs_and_upstream_reason(wd):
    class Compile(Doubling):
        name = StageName.COMPILE
        needs = (StageName.CLOSURE,)
        upstream_reason = Reason.UPSTREAM_FAILED

    run(RunConfig(repo="", workdir=wd), [Doubling(broken={"c"})], command="t")
    compiled = Compile()
    run(RunConfig(repo="", workdir=wd, filter="[ab].cu"), [compiled], command="t")
    assert compiled.seen == [["a", "b"]]
    store = Store.open(wd)
    c = store.get("c")
    assert c.stage(StageName.COMPILE) is None  # outside the filter: untouched
    run(RunConfig(repo="", workdir=wd), [Compile()], command="t")
    c = store.get("c")
    assert (c.stage(StageName.COMPILE).status, c.stage(StageName.COMPILE).reason) == (
        Status.SKIPPED,
        Reason.UPSTREAM_FAILED,
    )
    store.close()


def test_the_import_closure_follows_imports_templates_and_scripts():
    closure = {p.relative_to(ROOT).as_posix() for p in import_closure("testgen.testgen_stage")}
    assert {"testgen/generate.py", "miner/stage.py", "wrappers/label.py"} <= closure
    assert {"prompts/test_code.py.j2", "testgen/standalone/recorder.py"} <= closure
    units = {p.relative_to(ROOT).as_posix() for p in import_closure("miner.compile_stage")}
    assert "miner/toolchain.py" in units and "miner/stubs/torch_shim/THC/THCAtomics.cuh" in units
    assert not any(p.startswith(("testgen/", "wrappers/", "curation/")) for p in units)
    assert code_version("miner.compile_stage") != code_version("miner.compile_stage", ("nvcc",))
