"""Wall time of discovery + closure, and of a rerun on an unchanged repository.

    python benchmarks/mine_speed.py --repo /path/to/mmcv [--workdir runs/mmcv]

1. A fresh `kminer mine --stages discover,closure` in a temporary workdir (a new process, as a
   user would run it): the stage timings and the whole command's wall time. Target: <= 5 s.
2. With --workdir (a workdir already mined with compile): `kminer mine` again on the unchanged
   repository. Target: <= 10 s and zero compiles.
Prints one JSON object with the measured seconds and their ratio to the targets.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KMINER = [sys.executable, "-m", "miner.cli"]


def _mine(repo: str, workdir: Path, *extra: str) -> tuple[float, dict]:
    start = time.perf_counter()
    proc = subprocess.run(
        [*KMINER, "mine", repo, "--workdir", str(workdir), "--json", *extra],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"kminer mine failed: {proc.stderr.strip()[-500:]}")
    return wall, json.loads(proc.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--workdir", type=Path, help="an already mined (compiled) workdir")
    args = ap.parse_args()
    out: dict = {"repo": args.repo}
    with tempfile.TemporaryDirectory(prefix="kminer-bench-") as tmp:
        wall, stats = _mine(args.repo, Path(tmp), "--stages", "discover,closure")
        timings = stats["last_run"]["timings_s"]
        dc = timings.get("discover", 0) + timings.get("closure", 0)
        out["first_run"] = {
            "kernels": stats["found"],
            "command_wall_s": round(wall, 2),
            "discover_s": timings.get("discover"),
            "closure_s": timings.get("closure"),
            "discover_plus_closure_s": round(dc, 2),
            "ratio_to_5s_target": round(dc / 5.0, 3),
        }
    if args.workdir:
        wall, stats = _mine(args.repo, args.workdir)
        counts = stats["last_run"]["counts"]
        out["rerun"] = {
            "command_wall_s": round(wall, 2),
            "compiled": counts.get("compiled", 0),
            "unit_compiles": stats["unit_compiles"],
            "ratio_to_10s_target": round(wall / 10.0, 3),
        }
    print(json.dumps(out, indent=1))
    ok = out["first_run"]["discover_plus_closure_s"] <= 5.0 and (
        "rerun" not in out
        or (out["rerun"]["command_wall_s"] <= 10 and out["rerun"]["compiled"] == 0)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
