"""How many of a mined run's kernels get a CPU reference from their repository, and build.

    python benchmarks/references.py --workdir runs/mmcv --src /tmp/src/mmcv
    python benchmarks/references.py --workdir runs/pytorch_scatter --src /tmp/src/scatter

Reads the run's candidates (never writes them), writes each reference to a scratch folder
(`--out`, a temp dir by default) and compile-checks them with g++ and the flags
`torch.utils.cpp_extension` uses for a CPU extension, many references per translation unit
(`wrappers.batching`; the torch headers cost ~40 s per unit here). A failing unit is split by
the `#line` file names in g++'s errors, so one bad reference never fails the rest. Prints the
counts and every candidate without a reference or with one that does not compile, with why.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from miner.discover import discover  # noqa: E402
from miner.store import Store  # noqa: E402
from testgen.reference import RepoRefs, find_reference  # noqa: E402
from wrappers.batching import batch_source  # noqa: E402

_ERROR = re.compile(r":\d+:\d+: (?:fatal )?error: ")
_OWNER = re.compile(r"kminer_(\w+?)\.cu\b")


def gxx_flags() -> list[str]:
    """What cpp_extension.load passes to c++ for a CPU-only extension (compile step)."""
    import torch
    from torch.utils.cpp_extension import include_paths

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    incs = [*include_paths(), sysconfig.get_paths()["include"]]
    return [
        *[f"-isystem{d}" for d in incs],
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        "-DTORCH_EXTENSION_NAME=kminer_refs",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-fPIC",
        "-std=c++17",
        "-w",
    ]


def blame(log: str) -> dict[str, str]:
    """reference id → its first error line; g++ names the reference in the error line or in
    the instantiation context printed just before it."""
    out: dict[str, str] = {}
    context: set[str] = set()
    for line in log.splitlines():
        ids = set(_OWNER.findall(line))
        if _ERROR.search(line):
            for cid in ids or context:
                out.setdefault(cid, " ".join(_OWNER.sub("reference.cpp", line).split())[:300])
            context = set()
        else:
            context |= ids
    return out


def compile_check(refs: list[tuple[str, str]], timeout: float = 900) -> dict[str, str]:
    """id → "" (compiles) or its first error, for references built together."""
    results: dict[str, str] = {}
    pending = list(refs)
    while pending:
        source, _ = batch_source(pending, module="kminer_refs")
        with tempfile.TemporaryDirectory(prefix="kminer-ref-") as tmp:
            src = Path(tmp) / "batch.cpp"
            src.write_text(source, encoding="latin-1", errors="replace")
            cmd = ["g++", "-c", *gxx_flags(), str(src), "-o", str(Path(tmp) / "b.o")]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                return results | {cid: f"g++ timed out after {timeout:.0f} s" for cid, _ in pending}
        if proc.returncode == 0:
            return results | {cid: "" for cid, _ in pending}
        blamed = {k: v for k, v in blame(proc.stderr).items() if any(k == c for c, _ in pending)}
        if not blamed and len(pending) == 1:
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), "g++ failed")
            return results | {pending[0][0]: first[:300]}
        if not blamed:
            half = len(pending) // 2
            return results | compile_check(pending[:half]) | compile_check(pending[half:])
        results |= blamed
        pending = [(cid, text) for cid, text in pending if cid not in blamed]
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, required=True, help="a mined run (kminer.db)")
    ap.add_argument("--src", type=Path, required=True, help="the repository's source tree")
    ap.add_argument("--out", type=Path, help="scratch folder for references/ (default: temp)")
    ap.add_argument("--no-build", action="store_true", help="only find and extract")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="kminer-refs-"))
    cands = [c for c in Store.open(args.workdir).candidates() if c.wrapper.functions]
    start = time.perf_counter()
    refs = RepoRefs(discover(args.src))
    found, missing = {}, {}
    for cand in cands:
        r = find_reference(cand, args.src, out, refs)
        if isinstance(r, str):
            missing[cand.id] = r
        else:
            found[cand.id] = r
    expected = {c.id for c in cands if c.wrapper.op_map.get("cpu_fn")}
    names = {c.id: c.kernel.name for c in cands}
    print(f"{len(cands)} labelled kernels, {len(expected)} with a cpu_fn in their op map")
    print(f"reference found: {len(found)}")
    print(f"  of the op-map ones: {len(expected & found.keys())}/{len(expected)}")
    print(f"  by CPU function: {dict(Counter(r.function for r in found.values()))}")
    print(f"  found in {time.perf_counter() - start:.1f} s; references under {out}")
    print("not found, by reason:")
    for reason, n in Counter(_kind(r) for r in missing.values()).most_common():
        print(f"  {n:4d}  {reason}")
    for cid, reason in sorted(missing.items(), key=lambda kv: names[kv[0]]):
        if cid in expected or not reason.startswith("no CPU function"):
            print(f"  - {names[cid]} [{cid}]: {reason}")
    errors: dict[str, str] = {}
    if not args.no_build and found:
        start = time.perf_counter()
        texts = [(cid, (out / r.path).read_text("latin-1")) for cid, r in found.items()]
        errors = {k: v for k, v in compile_check(texts).items() if v}
        took = time.perf_counter() - start
        print(f"compiles: {len(found) - len(errors)}/{len(found)} (g++, {took:.0f} s)")
        for cid, err in sorted(errors.items(), key=lambda kv: names[kv[0]]):
            print(f"  - {names[cid]} [{cid}] {found[cid].function}: {err}")
    if args.json:
        figures = {
            "labelled": len(cands),
            "op_map_cpu": len(expected),
            "found": len(found),
            "compiles": None if args.no_build else len(found) - len(errors),
            "missing": {names[k]: v for k, v in missing.items() if k in expected},
            "errors": {names[k]: v for k, v in errors.items()},
        }
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


def _kind(reason: str) -> str:
    return reason.split(":")[0] if ":" in reason else re.sub(r"^\S+ ", "<fn> ", reason)


if __name__ == "__main__":
    sys.exit(main())
