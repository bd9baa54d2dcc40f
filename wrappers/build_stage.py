"""The build stage: every label compiled as a torch extension would be, many per nvcc call.

A verdict is keyed by the label's text, the compiler, its flags and the batching code
(verdicts.build_key) and kept in the store's compile cache, which the LLM reflection loop shares:
a label the loop already built is not built again here, and a rerun builds nothing it judged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed

from miner import toolchain
from miner.candidate import Candidate, Reason, StageName, StageResult, Status
from miner.stage import RunContext, Stage
from miner.unit import explain_missing
from wrappers.build import BuildResult, build_batch
from wrappers.verdicts import build_key, recalled, remember

GB_PER_BUILD = 5.0  # one batch unit with torch headers: ~3 GB for 8 labels, ~4-5 GB for 16


class Build(Stage):
    name = StageName.BUILD
    needs = (StageName.WRAP,)

    def key(self, cand: Candidate, ctx: RunContext) -> str | None:
        if not (cand.wrapper.label_path and (ctx.workdir / cand.wrapper.label_path).is_file()):
            return None
        return build_key(cand.wrapper.label_hash)

    def run(self, batch: list[Candidate], ctx: RunContext) -> Iterator[Candidate]:
        todo: list[tuple[Candidate, str]] = []
        for cand in batch:
            hit = None if ctx.cfg.redo else recalled(ctx.store, self.key(cand, ctx))
            if hit is not None:
                _apply(ctx, cand, hit)
                yield cand
            else:
                todo.append((cand, (ctx.workdir / cand.wrapper.label_path).read_text("latin-1")))
        ctx.counters["built"] = len(todo)
        if not todo:
            return
        if toolchain.nvcc_path() is None:
            for cand, _ in todo:
                result = StageResult(status=Status.SKIPPED, reason=Reason.NO_COMPILER)
                cand.set_stage(self.name, result)
                yield cand
            return
        size = max(1, ctx.cfg.batch_size)
        batches = [todo[i : i + size] for i in range(0, len(todo), size)]
        by_id = {cand.id: cand for cand, _ in todo}
        start = time.perf_counter()
        workers = build_workers(ctx.cfg.build_jobs, len(batches))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [
                pool.submit(build_batch, [(c.id, text) for c, text in part], ctx.cfg.build_timeout)
                for part in batches
            ]
            for fut in as_completed(futures):
                for cid, result in fut.result().items():
                    cand = by_id[cid]
                    remember(ctx.store, self.key(cand, ctx), result)
                    _apply(ctx, cand, result)
                    yield cand
        ctx.counters["build_wall_ms"] = int((time.perf_counter() - start) * 1000)


def _apply(ctx: RunContext, cand: Candidate, result: BuildResult) -> None:
    if result.log:
        logs = ctx.workdir / "logs"
        logs.mkdir(exist_ok=True)
        (logs / f"{cand.id}.build.log").write_text(result.log, encoding="utf-8")
    reason, detail = None, result.detail
    if not result.ok:
        reason = Reason.BUILD_TIMEOUT if "timed out" in result.detail else Reason.BUILD_ERROR
        reason, detail = explain_missing(cand.unit.missing_headers, reason, detail)
    cand.set_stage(
        StageName.BUILD,
        StageResult(
            status=Status.OK if result.ok else Status.ERROR,
            reason=reason,
            detail=detail,
            seconds=result.seconds,
        ),
    )


def build_workers(wanted: int, batches: int) -> int:
    """Parallel batch builds, capped by the memory available (never below one)."""
    try:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        available_gb = int(info["MemAvailable"].split()[0]) / 1024 / 1024
    except (OSError, KeyError, ValueError):
        available_gb = GB_PER_BUILD * wanted
    return max(1, min(wanted, batches, int(available_gb // GB_PER_BUILD)))
