"""Build check of labels: nvcc with the flags `torch.utils.cpp_extension` uses (toolchain.py),
many labels per translation unit.

A label includes <torch/extension.h>, whose parse costs ~90 s and ~3 GB per nvcc call here; one
call per kernel (what KernelBench-style harnesses do) pays that for every kernel. We instead put a
batch of labels into one translation unit, each body in its own namespace, so the torch headers
are parsed once per batch. Errors are attributed to labels through `#line` markers; failing labels
leave the batch and the rest is rebuilt, so one bad label never fails its neighbours.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from miner import toolchain
from wrappers.batching import batch_source, blame


@dataclass
class BuildResult:
    """One label's verdict."""

    ok: bool
    detail: str  # first error line, or "" when ok
    log: str
    seconds: float  # this label's share of the nvcc wall time


BuildFn = Callable[[str, str], BuildResult]  # (label id, label text) -> its verdict


def _nvcc(source: str, timeout: float) -> tuple[int | None, str, float]:
    flags = list(toolchain.extension_flags())
    return toolchain.compile_source(source, "batch.cu", flags, timeout, memory_mb=24 << 10)


def build_batch(
    labels: list[tuple[str, str]], timeout: float = 1800, module: str = "kminer_batch"
) -> dict[str, BuildResult]:
    """Compile-check labels together; return one verdict per label id."""
    results: dict[str, BuildResult] = {}
    pending = list(labels)
    while pending:
        source, owners = batch_source(pending, module)
        code, log, seconds = _nvcc(source, timeout)
        share = seconds / len(pending)
        if code == 0:
            for cid, _ in pending:
                results[cid] = BuildResult(True, "", "", share)
            break
        blamed = {} if code is None else blame(log, owners)
        blamed = {cid: d for cid, d in blamed.items() if any(cid == p for p, _ in pending)}
        if not blamed:
            if len(pending) == 1:
                cid = pending[0][0]
                first = next((ln for ln in log.splitlines() if "error" in ln), log[:300])
                results[cid] = BuildResult(False, " ".join(first.split())[:300], log, seconds)
                break
            half = len(pending) // 2
            for part in (pending[:half], pending[half:]):
                results.update(build_batch(part, timeout, module))
            break
        for cid, detail in blamed.items():
            results[cid] = BuildResult(False, detail, log, share)
        pending = [(cid, text) for cid, text in pending if cid not in blamed]
    return results


def main(argv: list[str]) -> int:  # pragma: no cover - a debugging aid
    labels = [(Path(p).stem.replace("-", "_"), Path(p).read_text("latin-1")) for p in argv]
    for cid, r in build_batch(labels).items():
        print(cid, "ok" if r.ok else f"error: {r.detail}", f"{r.seconds:.1f}s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
