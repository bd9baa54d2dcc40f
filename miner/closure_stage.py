"""The closure stage: each kernel's standalone unit (`units/<id>.cu`) and the list of what it
needed from the repository. The unit file is rewritten only when its text changed, so its mtime
says when it last did."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

from miner.candidate import Candidate, Dep, Reason, StageName, StageResult, Status
from miner.extract import Extracted, Extractor
from miner.includes import MAX_INCLUDE_DEPTH, include_problem
from miner.stage import Done, RunContext, Stage
from miner.unit import missing_headers


class Closure(Stage):
    name = StageName.CLOSURE
    needs = (StageName.DISCOVER,)
    tools = ("libclang",)  # with it, same-named helpers the kernel never reaches are pruned

    def key(self, cand: Candidate, ctx: RunContext) -> str:
        return hashlib.sha256(f"{self.version()}|{cand.id}".encode()).hexdigest()[:16]

    def fresh(self, cand: Candidate, ctx: RunContext) -> bool:
        done = cand.stage(self.name)
        return done.status != Status.OK or (ctx.workdir / cand.unit.path).is_file()

    def run(self, batch: list[Candidate], ctx: RunContext) -> Iterator[Done]:
        extractor = Extractor(ctx.ensure_discovery())
        (ctx.workdir / "units").mkdir(exist_ok=True)
        yield from self.each(batch, lambda cand: self._unit(cand, ctx, extractor))

    def _unit(self, cand: Candidate, ctx: RunContext, extractor: Extractor) -> None:
        start = time.perf_counter()
        fk = ctx.found[cand.id]
        header = (
            f"kminer unit {cand.id}: {cand.kernel.name} from {ctx.src.url}@"
            f"{ctx.src.commit[:12]} {cand.kernel.file}:{cand.kernel.line}"
        )
        result = extractor.extract(fk, header)
        refused = _refused(result)
        if refused is not None:
            cand.set_stage(self.name, refused)
            return
        path = ctx.workdir / "units" / f"{cand.id}.cu"
        data = result.unit.text.encode("latin-1")
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
        entries = [e for e in result.closure.entries if e.item is not fk.kdef.item]
        cand.closure = [
            Dep(
                kind=e.item.kind,
                name=(e.item.names or (e.item.target,))[0],
                file=e.item.file,
                line=e.item.line,
            )
            for e in entries
        ]
        cand.unit.path = str(path.relative_to(ctx.workdir))
        cand.unit.hash = result.unit.hash
        cand.unit.needs_torch = result.unit.needs_torch
        cand.unit.instantiations = result.unit.instantiations
        cand.unit.missing_headers = missing_headers(result.closure)
        cand.set_stage(
            self.name,
            StageResult(
                status=Status.OK,
                seconds=time.perf_counter() - start,
                detail=_detail(len(entries), result),
            ),
        )


def _refused(result: Extracted) -> StageResult | None:
    """A unit that would make the compiler read a file outside the checkout, or follow an
    include chain no compiler follows, is not written: the candidate stops here, said why."""
    problems = [include_problem(e.header, e.from_file) for e in result.closure.externals]
    problems = [p for p in problems if p]
    if problems:
        detail = problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        return StageResult(status=Status.ERROR, reason=Reason.INCLUDE_OUTSIDE, detail=detail)
    if result.too_deep:
        detail = f"includes nest deeper than {MAX_INCLUDE_DEPTH}: {result.too_deep}"[:300]
        return StageResult(status=Status.ERROR, reason=Reason.INCLUDE_TOO_DEEP, detail=detail)
    return None


def _detail(n_deps: int, result: Extracted) -> str:
    parts = [f"{n_deps} deps"]
    if result.closure.from_tu:
        parts.append(f"context from {result.closure.from_tu}")
    if result.pruned:
        parts.append(f"libclang dropped {result.pruned} unused same-named definitions")
    return ", ".join(parts)
