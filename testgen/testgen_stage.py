"""The testgen stage: a test for every built label (testgen/generate.py does one candidate).

Before the candidates, once per run: the repository parsed for its CPU references, its extensions
built for the CPU (testgen/cpu_twin.py), and its own tests run by the recorder (in the sandbox,
with those extensions computing behind it) for the calls they make, limited to the test files
that can reach the ops at hand. A candidate is redone when its label or kminer's code changed,
or when a model is now set for one that waited for a model's reference or inputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from miner.candidate import Candidate, Reason, StageName, Status
from miner.stage import Done, RunContext, Stage
from testgen.carry import public_names
from testgen.cpu_twin import cpu_extensions
from testgen.generate import ModelHelp, generate_for
from testgen.inputs import Recorded, record_repo_calls
from testgen.python_branch import branch_twins
from testgen.reference import RepoRefs


class Testgen(Stage):
    name = StageName.TESTGEN
    needs = (StageName.BUILD,)
    uses_llm = True
    tools = ("torch",)  # the recorder runs the repository's tests with it

    def key(self, cand: Candidate, ctx: RunContext) -> str | None:
        if not (cand.wrapper.label_path and (ctx.workdir / cand.wrapper.label_path).is_file()):
            return None
        blob = f"{self.version()}|{cand.wrapper.label_hash}"
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def fresh(self, cand: Candidate, ctx: RunContext) -> bool:
        done = cand.stage(self.name)
        if ctx.llm is not None:  # a model may write what the repository lacks
            if done.reason == Reason.NO_REFERENCE and not done.metrics.get("llm_tried"):
                return False
            if done.reason == Reason.NO_CASES and not done.metrics.get("llm_inputs_tried"):
                return False
        return done.status != Status.OK or (ctx.workdir / cand.tests.path).is_file()

    def run(self, batch: list[Candidate], ctx: RunContext) -> Iterator[Done]:
        refs = RepoRefs(ctx.ensure_discovery())
        # the ops of every candidate of the repository, not only this batch's: a rerun of one
        # kernel (--filter) records with the same modules behind it (spmm needs ind2ptr's result)
        everyone = [*(ctx.store.candidates(ctx.repo_id) if ctx.repo_id else []), *batch]
        names = [public_names(c) for c in everyone if c.wrapper.label_path]
        # an unknown binding: every file
        wanted = None if not all(names) else {n for each in names for n in each}
        if wanted:  # the CPU bindings the Python calls instead on CPU tensors (python_branch)
            wanted |= {t.cpu_binding for n in wanted for t in branch_twins(ctx.src.root, n)}
        with ctx.timed("cpu_twin"):
            built = cpu_extensions(ctx.src.root, ctx.workdir / "cpu_twin", wanted, ctx.cfg.jobs)
        with ctx.timed("record"):
            recorded = record_repo_calls(ctx.src.root, ctx.workdir / "recorded", wanted, built)
        llm = ctx.llm and ModelHelp(ctx.llm, ctx.store, ctx.cfg.max_attempts)
        # a binding name that kernels of several files are reached by (chamfer_2D's and
        # chamfer_3D's `forward`): its calls are told apart by the module they went to
        files_of: dict[str, set[str]] = {}
        for c in everyone:
            for name in public_names(c):
                files_of.setdefault(name, set()).add(c.kernel.file)
        shared = {name for name, files in files_of.items() if len(files) > 1}
        kernel_files = sorted({c.kernel.file for c in everyone})

        def mine(c: Candidate) -> Recorded:
            return recorded.for_source(c.kernel.file, kernel_files, shared)

        yield from self.each(batch, lambda c: generate_for(c, refs, mine(c), ctx.workdir, llm))
