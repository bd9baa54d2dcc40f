"""CPU-seconds per built label: one extension per kernel (the baseline) against kminer's batches.

    # on the GPU machine (a CUDA build of torch): real cpp_extension builds + import
    python3 benchmarks/label_build.py --labels DIR --mode extension --limit 48 --per-batch 12
    # here (CPU torch wheel): the same comparison for compile-only nvcc checks
    python benchmarks/label_build.py --labels runs/mmcv/labels --mode compile --limit 16

Baseline: each of `--baseline` labels built alone (`cpp_extension.load(sources=[label])` or one
`nvcc -c`), as KernelBench-style harnesses do. kminer: the labels split into units of
`--per-batch` (one torch-header parse per unit), units built in parallel by ninja and linked into
one extension whose submodule `c_<id>` holds each label's functions; the extension is imported
and every function checked. CPU time is read from the children's rusage (ninja, nvcc, gcc).
Prints one JSON object (and writes it to --out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from wrappers.batching import batch_source, exposed_names, module_source  # noqa: E402

SHIM = ROOT / "miner" / "stubs" / "torch_shim"
LIBS_SHIM = ROOT / "miner" / "stubs" / "cuda_libs_shim"
LOAD = """
import json, sys, torch.utils.cpp_extension as ce
name, build_dir, shims = sys.argv[1], sys.argv[2], sys.argv[3].split(":")
sources = sys.argv[4:]
mod = ce.load(name=name, sources=sources, build_directory=build_dir, extra_include_paths=shims,
              extra_cuda_cflags=["-w"], extra_cflags=["-w"], verbose=False)
print("KMINER_LOADED", json.dumps(sorted(n for n in dir(mod) if not n.startswith("_"))))
"""


def run_child(cmd: list[str], env: dict | None = None) -> tuple[int, float, float, str]:
    """(returncode, CPU seconds of the child and everything it waited for, wall, output)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    out = proc.stdout.read().decode("utf-8", errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime, time.perf_counter() - start, out


def build_extension(
    name: str, sources: list[Path], tmp: Path, jobs: int
) -> tuple[bool, float, float, str]:
    bdir = tmp / f"build_{name}"
    bdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MAX_JOBS=str(jobs))
    code, cpu, wall, out = run_child(
        [sys.executable, "-c", LOAD, name, str(bdir), str(SHIM), *map(str, sources)], env
    )
    return code == 0 and "KMINER_LOADED" in out, cpu, wall, out


def _has_cuda_libs() -> bool:
    """cuBLAS headers (ATen/cuda/CUDAContext.h needs them): CUDA_HOME or pip's nvidia dirs."""
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    if any(root and Path(root, "include", "cublas_v2.h").exists() for root in roots):
        return True
    return any(Path(p).glob("nvidia/*/include/cublas_v2.h") for p in sys.path if p)


def build_compile(sources: list[Path], tmp: Path, jobs: int) -> tuple[bool, float, float, str]:
    from miner.toolchain import extension_flags

    def one(src: Path):
        return run_child(["nvcc", "-c", *extension_flags(), str(src), "-o", str(src) + ".o"])

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(one, sources))
    ok = all(r[0] == 0 for r in results)
    return (
        ok,
        sum(r[1] for r in results),
        time.perf_counter() - start,
        "\n".join(r[3] for r in results),
    )


def blamed(output: str) -> set[str]:
    return set(re.findall(r"kminer_(\w+?)\.cu\(\d+\): (?:catastrophic )?error", output))


def batched(labels: list[tuple[str, str]], args, tmp: Path) -> dict:
    pending, failed, rounds = list(labels), {}, []
    while pending:
        batches = [pending[i : i + args.per_batch] for i in range(0, len(pending), args.per_batch)]
        sources = []
        for k, batch in enumerate(batches):
            register = f"kminer_register_{k}" if args.mode == "extension" else None
            text, _ = batch_source(
                batch, module=None if register else f"kminer_b{k}", register=register
            )
            src = tmp / f"round{len(rounds)}_batch{k}.cu"
            src.write_text(text, encoding="latin-1", errors="replace")
            sources.append(src)
        if args.mode == "extension":
            mod = tmp / f"round{len(rounds)}_module.cpp"
            mod.write_text(module_source([f"kminer_register_{k}" for k in range(len(batches))]))
            ok, cpu, wall, out = build_extension(
                f"kminer_batch{len(rounds)}", [*sources, mod], tmp, args.jobs
            )
        else:
            ok, cpu, wall, out = build_compile(sources, tmp, args.jobs)
        rounds.append(
            {
                "labels": len(pending),
                "units": len(batches),
                "ok": ok,
                "cpu_s": round(cpu, 1),
                "wall_s": round(wall, 1),
            }
        )
        if ok:
            break
        bad = blamed(out) & {cid for cid, _ in pending}
        if not bad:
            rounds[-1]["error"] = out[-3000:]
            failed.update({cid: "unattributed build failure" for cid, _ in pending})
            pending = []
            break
        failed.update({cid: "build error" for cid in bad})
        pending = [(cid, t) for cid, t in pending if cid not in bad]
    result = {
        "rounds": rounds,
        "built": len(pending),
        "failed": failed,
        "cpu_s": round(sum(r["cpu_s"] for r in rounds), 1),
        "wall_s": round(sum(r["wall_s"] for r in rounds), 1),
    }
    if args.mode == "extension" and pending and rounds[-1]["ok"]:
        result["import"] = check_import(
            pending, tmp / f"build_kminer_batch{len(rounds) - 1}", f"kminer_batch{len(rounds) - 1}"
        )
    return result


def check_import(labels: list[tuple[str, str]], build_dir: Path, name: str) -> dict:
    """Import the built extension in a fresh process and look up every label's functions."""
    want = {cid: exposed_names(text) for cid, text in labels}
    code = (
        f"import importlib.util, json, sys, torch\n"
        f"spec = importlib.util.spec_from_file_location({name!r}, "
        f"{str(build_dir / (name + '.so'))!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        f"want = {json.dumps(want)}\n"
        "missing = {c: [f for f in fs if not hasattr(getattr(m, 'c_' + c, None), f)]"
        " for c, fs in want.items()}\n"
        "print('KMINER_IMPORT', json.dumps({c: v for c, v in missing.items() if v}))\n"
    )
    rc, _, _, out = run_child([sys.executable, "-c", code])
    line = next((ln for ln in out.splitlines() if ln.startswith("KMINER_IMPORT")), "")
    missing = json.loads(line.split(" ", 1)[1]) if line else None
    return {
        "imported": rc == 0 and missing is not None,
        "labels_with_all_functions": len(labels) - len(missing or {}) if missing is not None else 0,
        "functions": sum(len(v) for v in want.values()),
        "error": "" if line else out[-1500:],
    }


def baseline(labels: list[tuple[str, str]], args, tmp: Path) -> dict:
    def one(item):
        cid, text = item
        src = tmp / f"single_{cid}.cu"
        src.write_text(text, encoding="latin-1", errors="replace")
        if args.mode == "extension":
            ok, cpu, wall, _ = build_extension(f"single_{cid}", [src], tmp, 1)
        else:
            ok, cpu, wall, _ = build_compile([src], tmp, 1)
        return {"id": cid, "ok": ok, "cpu_s": round(cpu, 1), "wall_s": round(wall, 1)}

    with ThreadPoolExecutor(max_workers=max(1, min(args.jobs, len(labels)))) as pool:
        rows = list(pool.map(one, labels))
    built = [r for r in rows if r["ok"]]
    per = sum(r["cpu_s"] for r in built) / len(built) if built else None
    return {"labels": rows, "cpu_s_per_built_label": round(per, 1) if per else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labels", type=Path, required=True)
    ap.add_argument("--mode", choices=["extension", "compile"], default="extension")
    ap.add_argument("--limit", type=int, default=48)
    ap.add_argument("--per-batch", type=int, default=12)
    ap.add_argument("--baseline", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    files = sorted(args.labels.glob("*.cu"))[: args.limit]
    labels = [(f.stem, f.read_text("latin-1")) for f in files]
    with tempfile.TemporaryDirectory(prefix="kminer-bench-") as tmp_name:
        tmp = Path(tmp_name)
        base = baseline(labels[: args.baseline], args, tmp)
        batch = batched(labels, args, tmp)
    result = {
        "mode": args.mode,
        "labels": len(labels),
        "per_batch": args.per_batch,
        "baseline": base,
        "batched": batch,
    }
    per_label = batch["cpu_s"] / batch["built"] if batch["built"] else None
    result["batched"]["cpu_s_per_built_label"] = round(per_label, 1) if per_label else None
    if per_label and base["cpu_s_per_built_label"]:
        result["cpu_ratio_baseline_over_batched"] = round(
            base["cpu_s_per_built_label"] / per_label, 2
        )
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if batch["built"] else 1


if __name__ == "__main__":
    sys.exit(main())
