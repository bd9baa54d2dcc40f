"""The figures of a verification run, from run.py's results.json files.

    python benchmarks/verify_summary.py benchmarks/results/h100_verify_mmcv.json [...]

Per file: the outcomes, and for every `pass` its valid cases and shapes and kill rate (the bar a
dataset row must clear: >= 5 cases over >= 3 shapes, every kind of wrong variant killed), the
wrong variants that survived and were stood in for by the next of their kind, and the median
kernel time of the typical case. Standard library only.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from pathlib import Path


def summary(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    entries = data["entries"]
    outcomes = Counter(e["outcome"] for e in entries.values())
    lines = [f"{path.name}: {data['gpu']}, torch {data['torch']}, CUDA {data['cuda']}"]
    lines.append("  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    passed = {k: e for k, e in entries.items() if e["outcome"] == "pass"}
    below, stood_in, times = [], 0, []
    for eid, e in passed.items():
        valid = [c for c in e["cases"] if c.get("ok") is not None]
        shapes = len({json.dumps(c["shape"]) for c in valid})
        if len(valid) < 5 or shapes < 3 or e["kill_rate"] != 1.0:
            below.append(eid)
        kinds = [v["kind"] for v in e["variants"]]
        stood_in += len(kinds) - len(set(kinds))  # each variant before the last of its kind
        if e.get("kernel_time_us"):
            times.append(e["kernel_time_us"])
    if passed:
        cases = [sum(c.get("ok") is not None for c in e["cases"]) for e in passed.values()]
        lines.append(
            f"  pass: {len(passed)}/{len(entries)}; valid cases per pass min {min(cases)}, "
            f"median {statistics.median(cases):g}; below 5 cases / 3 shapes / kill 1.0: "
            f"{len(below)} {below if below else ''}"
        )
        lines.append(
            f"  wrong variants that survived or did not build, stood in for: {stood_in}; "
            f"kernel time of the typical case: median {statistics.median(times):.1f} us"
        )
    for eid, e in entries.items():
        if e["outcome"] != "pass":
            lines.append(f"  {eid} {e['outcome']}: {e['detail']}")
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    for arg in argv:
        print("\n".join(summary(Path(arg))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
