"""Wall seconds of one heavy label's device compile under each device-optimization setting.

A label whose dispatch stamps out hundreds of instantiations (mamba's selective_scan_bwd: 3 input
types x 2 weight types x 5 thread shapes x 32 switch settings = 960 kernels) takes longer to build
than a device call lasts, and its test builds it again for every wrong variant. A wrong variant is
only ever compared with the reference, never timed, so it may be built with less device
optimization, if that is where the time goes. This measures it: the label compiled with `nvcc -c`
(toolchain.extension_flags: what cpp_extension passes, the machine's one arch) once per setting, the
settings side by side on the machine's cores (`--split-compile` shares them out), each with nvcc's
`--time` phase log, and prints the wall times and their ratios to the default in one JSON object
(also written to --out). A setting not done within --limit seconds says so.

    python3 benchmarks/heavy_label_flags.py LABEL.cu --limit 540 --out result.json \
        [--settings cicc_O0,debug_G]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from miner import toolchain  # noqa: E402

SETTINGS = {
    "default": [],
    "ptxas_O0": ["-Xptxas", "-O0"],
    "ptxas_O1": ["-Xptxas", "-O1"],
    "cicc_O0": ["-Xcicc", "-O0", "-Xptxas", "-O0"],  # NVVM's optimizer off too (the cicc phase)
    "cicc_O1": ["-Xcicc", "-O1"],
    "debug_G": ["-G"],  # device debug: every device optimization off
}


def compile_once(label: Path, extra: list[str], threads: int, limit: float, tmp: Path) -> dict:
    """One compile of `label` with `extra` flags: its wall seconds and nvcc's phase times."""
    timing = tmp / "time.csv"
    argv = [
        toolchain.nvcc_path() or "nvcc", "-c", str(label), "-o", str(tmp / "label.o"),
        *toolchain.extension_flags(), "-DTORCH_EXTENSION_NAME=heavy",
        f"--split-compile={threads}", "--time", str(timing), *extra,
    ]  # fmt: skip
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=limit)
        ok, log = done.returncode == 0, (done.stdout + done.stderr)[-600:]
    except subprocess.TimeoutExpired:
        ok, log = False, f"not done within {limit:g}s"
    wall = time.perf_counter() - start
    phases = timing.read_text()[-3000:] if timing.is_file() else ""  # nvcc's CSV, as written
    return {"ok": ok, "wall_s": round(wall, 1), "phases_csv": phases, "log": "" if ok else log}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("label", type=Path)
    parser.add_argument("--limit", type=float, default=540)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--settings", default="default,ptxas_O0,ptxas_O1", help="comma-separated")
    args = parser.parse_args()
    chosen = {n: SETTINGS[n] for n in dict.fromkeys(["default", *args.settings.split(",")])}
    threads = max(1, (os.cpu_count() or 1) // len(chosen))
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(len(chosen)) as pool:
        dirs = {name: Path(tmp) / name for name in chosen}
        for d in dirs.values():
            d.mkdir()
        futures = {
            name: pool.submit(compile_once, args.label, extra, threads, args.limit, dirs[name])
            for name, extra in chosen.items()
        }
        results = {name: f.result() for name, f in futures.items()}
    base = results["default"]["wall_s"] if results["default"]["ok"] else None
    for r in results.values():
        r["ratio_to_default"] = round(r["wall_s"] / base, 3) if base and r["ok"] else None
    report = {"label": args.label.name, "threads_each": threads, "nvcc": toolchain.nvcc_version(),
              "settings": chosen, "results": results}  # fmt: skip
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
