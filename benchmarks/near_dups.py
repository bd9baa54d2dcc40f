"""How many kernels repositories share: exact and near duplicates across the repositories given.

Discovers every __global__ kernel of each PATH (no compile) and runs export's duplicate search
(curation/dedup.py) over all of them together. Prints the pairs whose kernels come from different
repositories, with their Jaccard similarity, the count at each threshold (across repositories and
within one) and the time the search took.
Usage: python benchmarks/near_dups.py PATH PATH ... [--threshold 0.85]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from curation import dedup
from miner.discover import discover


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--threshold", type=float, default=dedup.DEFAULT_THRESHOLD)
    args = parser.parse_args()
    kernels = []  # (repo, file, name, source)
    for path in args.paths:
        found = discover(path).kernels
        kernels += [(path.name, k.file, k.kdef.name, k.source) for k in found]
        print(f"{path}: {len(found)} kernels")
    t0 = time.perf_counter()
    toks = [dedup.tokens(k[3]) for k in kernels]
    floor = min(0.5, args.threshold)
    pairs = dedup.near_pairs(toks, floor)
    seconds = time.perf_counter() - t0
    cross = [(i, j, s) for i, j, s in pairs if kernels[i][0] != kernels[j][0]]
    for i, j, s in sorted(cross, key=lambda p: -p[2]):
        a, b = kernels[i], kernels[j]
        print(f"{s:.2f}  {a[0]}:{a[1]}:{a[2]}  ~  {b[0]}:{b[1]}:{b[2]}")
    n = len(kernels)
    for t in sorted({0.5, 0.7, args.threshold, 1.0}):
        within = sum(1 for _, _, s in pairs if s >= t) - sum(1 for _, _, s in cross if s >= t)
        across = sum(1 for _, _, s in cross if s >= t)
        print(f"similarity >= {t:.2f}: {across} pairs across repositories, {within} within one")
    print(f"{n} kernels, {n * (n - 1) // 2} possible pairs; duplicate search {seconds:.2f} s")


if __name__ == "__main__":
    main()
