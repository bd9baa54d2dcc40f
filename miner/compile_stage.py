"""The compile stage: nvcc checks every unit, in parallel, each verdict cached by content.

The verdict is keyed by the unit's text, the compiler and its flags (compile.cache_key), so two
candidates with the same unit, or a rerun, compile nothing twice; the store's compile cache holds
the verdict, the compiler's log and the unit as finally compiled (stubs of dtypes the template
does not allow removed).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed

from miner.candidate import Candidate, Reason, StageName, StageResult, Status
from miner.compile import CompileResult, cache_key, compile_unit
from miner.stage import Done, Failed, RunContext, Stage
from miner.unit import explain_missing


class Compile(Stage):
    name = StageName.COMPILE
    needs = (StageName.CLOSURE,)
    upstream_reason = Reason.UPSTREAM_FAILED
    tools = ("nvcc", "torch", "arch")

    def key(self, cand: Candidate, ctx: RunContext) -> str | None:
        if not (ctx.workdir / cand.unit.path).is_file():
            return None
        return cache_key(cand.unit.hash, cand.unit.needs_torch, self.version())

    def run(self, batch: list[Candidate], ctx: RunContext) -> Iterator[Done]:
        todo = []
        for cand in batch:
            key = self.key(cand, ctx)
            hit = None if ctx.cfg.redo else ctx.store.cached_compile(key)
            if hit is None:
                todo.append(cand)
                continue
            reason = Reason(hit.reason) if hit.reason else None
            result = CompileResult(Status(hit.status), reason, hit.detail, hit.text,
                                   hit.compiled_types, hit.log, hit.seconds)  # fmt: skip
            _apply(ctx, cand, result)
            yield cand
        ctx.counters["compiled"] = len(todo)
        if not todo:
            return
        with ThreadPoolExecutor(max_workers=max(1, ctx.cfg.jobs)) as pool:
            futures = {
                pool.submit(
                    compile_unit,
                    (ctx.workdir / cand.unit.path).read_bytes().decode("latin-1"),
                    cand.unit.needs_torch,
                    cand.unit.instantiations,
                    ctx.cfg.compile_timeout,
                ): cand
                for cand in todo
            }
            for fut in as_completed(futures):
                cand = futures[fut]
                try:
                    result = fut.result()
                except Exception as exc:  # a bug of ours on this unit
                    yield Failed(cand, exc)
                    continue
                ctx.store.put_compile(
                    self.key(cand, ctx),
                    status=result.status.value,
                    reason=result.reason.value if result.reason else None,
                    detail=result.detail,
                    compiled_types=result.compiled_types,
                    text=result.text,
                    log=result.log,
                    seconds=result.seconds,
                )
                _apply(ctx, cand, result)
                yield cand


def _apply(ctx: RunContext, cand: Candidate, result: CompileResult) -> None:
    """The verdict on the candidate; the unit as compiled and the compiler's log in the workdir."""
    path = ctx.workdir / cand.unit.path
    data = result.text.encode("latin-1", errors="replace")
    if result.text and path.read_bytes() != data:
        path.write_bytes(data)
    logs = ctx.workdir / "logs"
    logs.mkdir(exist_ok=True)
    (logs / f"{cand.id}.compile.log").write_text(result.log, encoding="utf-8")
    cand.unit.compiled_types = result.compiled_types
    reason, detail = explain_missing(cand.unit.missing_headers, result.reason, result.detail)
    if result.status == Status.OK and cand.kernel.templated and not cand.unit.instantiations:
        detail = "the template itself: no concrete arguments (a traits parameter) instantiate it"
    cand.set_stage(
        StageName.COMPILE,
        StageResult(status=result.status, reason=reason, detail=detail, seconds=result.seconds),
    )
