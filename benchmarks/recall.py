"""Recall and precision of kernel discovery against a ground-truth CSV.

    python benchmarks/recall.py --repo PATH --truth ../shared/data/ground-truth/open-mmlab__mmcv.csv
    python benchmarks/recall.py --workdir runs/mmcv --truth ...   # read a mined workdir instead

Kernels are matched on (file, kernel name) as a multiset (specializations share a name), then
line numbers are compared for the matched ones. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import Counter
from pathlib import Path


def found_from_repo(repo: Path) -> tuple[list[tuple[str, str, int]], float]:
    from miner.discover import discover

    start = time.perf_counter()
    disc = discover(repo)
    return [(k.file, k.kdef.name, k.line) for k in disc.kernels], time.perf_counter() - start


def found_from_workdir(workdir: Path) -> list[tuple[str, str, int]]:
    from miner.store import Store

    store = Store.open(workdir)
    repo = store.repo()
    return [(c.kernel.file, c.kernel.name, c.kernel.line) for c in store.candidates(repo.id)]


def score(found: list[tuple[str, str, int]], truth_csv: Path) -> dict:
    rows = list(csv.DictReader(truth_csv.open()))
    truth = Counter((r["file"], r["kernel"]) for r in rows)
    got = Counter((f, k) for f, k, _ in found)
    hit = sum((truth & got).values())
    truth_lines = {(r["file"], r["kernel"], int(r["line"])) for r in rows}
    line_ok = sum(1 for f in found if f in truth_lines)
    return {
        "truth": sum(truth.values()),
        "found": sum(got.values()),
        "matched": hit,
        "recall": round(hit / max(1, sum(truth.values())), 4),
        "precision": round(hit / max(1, sum(got.values())), 4),
        "line_exact": line_ok,
        "missing": sorted((truth - got).elements()),
        "extra": sorted((got - truth).elements()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--repo", type=Path)
    src.add_argument("--workdir", type=Path)
    ap.add_argument("--truth", type=Path, required=True)
    args = ap.parse_args()
    result: dict = {"truth_file": args.truth.name}
    if args.repo:
        found, seconds = found_from_repo(args.repo)
        result["discover_s"] = round(seconds, 3)
    else:
        found = found_from_workdir(args.workdir)
    result.update(score(found, args.truth))
    print(json.dumps(result, indent=1))
    return 0 if result["recall"] == 1.0 and result["precision"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
