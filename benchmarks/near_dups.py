"""How many kernels repositories share: exact and near duplicates across the repositories given.

Discovers every __global__ kernel of each PATH (no compile) and runs export's duplicate search
(curation/dedup.py) over all of them together. Prints the pairs of kernels from different
repositories at Jaccard >= 0.5, the count of pairs at each threshold (across repositories and
within one), and what export would drop with its default thresholds, and the time it took.
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
    parser.add_argument("--cross", type=float, default=dedup.CROSS_REPO_THRESHOLD)
    args = parser.parse_args()
    kernels = []  # (repo, file, name, source)
    for path in args.paths:
        found = discover(path).kernels
        kernels += [(str(path), k.file, k.kdef.name, k.source) for k in found]
        print(f"{path}: {len(found)} kernels")
    t0 = time.perf_counter()
    rows = [
        {"id": f"{i:06d}", "num_cases": 0, "num_shapes": 0, "repo": k[0], "name": k[2]}
        for i, k in enumerate(kernels)
    ]
    dropped = dedup.find_duplicates(rows, [k[3] for k in kernels], args.threshold, args.cross)
    seconds = time.perf_counter() - t0
    toks = [dedup.tokens(k[3]) for k in kernels]
    pairs = dedup.near_pairs(toks, 0.5)
    across = [p for p in pairs if kernels[p[0]][0] != kernels[p[1]][0]]
    for i, j, s in sorted(across, key=lambda p: -p[2]):
        a, b = kernels[i], kernels[j]
        print(f"{s:.2f}  {a[0]}:{a[1]}:{a[2]}  ~  {b[0]}:{b[1]}:{b[2]}")
    for t in (0.5, 0.7, 0.85, 1.0):
        n_across = sum(1 for p in across if p[2] >= t)
        print(
            f"pairs >= {t:.2f}: {n_across} across repositories, "
            f"{sum(1 for p in pairs if p[2] >= t) - n_across} within one"
        )
    print("export would drop:")
    for i, (keep, kind, s) in sorted(dropped.items(), key=lambda d: -d[1][2]):
        a, b = kernels[i], kernels[keep]
        where = "across" if a[0] != b[0] else "within"
        print(f"  {kind} {s:.2f} {where}: {a[0]}:{a[2]}  (kept {b[0]}:{b[2]})")
    n = len(kernels)
    print(f"{n} kernels, {len(dropped)} dropped; duplicate search {seconds:.2f} s")


if __name__ == "__main__":
    main()
