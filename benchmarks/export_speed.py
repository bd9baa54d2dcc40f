"""How fast `kminer export` writes 10,000 rows (target: < 60 s on this 2-core machine).

Builds a workdir whose store holds --n accepted, verified candidates with files the size of
mmcv's (median label 20 KB, test 30 KB, reference 5 KB; each kernel a distinct ~1.5 KB source, so
the duplicate search compares them all and keeps all), plus --dupes near copies that it must
drop. Then times one export through the CLI's own function: reading the store, the license filter,
decontamination against --exclude (a 200-kernel benchmark file), exact and near duplicates,
instructions, Parquet shards, JSONL and the card. Prints the time, its ratio to the target, rows
per second and the peak memory. Usage: python benchmarks/export_speed.py [--n 10000]
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from curation.export import Options, export
from curation.reviews import Decision, Reviews
from miner.candidate import Candidate, Kernel, Param, Provenance, StageName, StageResult, Status
from miner.store import Store

TARGET_S = 60.0
WORDS = ["x", "y", "idx", "acc", "w", "h", "c", "n", "offset", "stride", "val", "tmp", "sum"]


def kernel_source(rng: random.Random, i: int) -> str:
    body = []
    for _ in range(24):
        a, b, c = rng.sample(WORDS, 3)
        op = rng.choice("+-*")
        body.append(f"  {a}{rng.randrange(99)} = {b}[{c} {op} {rng.randrange(1000)}] {op} {i};")
    head = f"__global__ void kernel_{i:05d}(const float* x, float* y, int n, float alpha) {{\n"
    return head + "\n".join(body) + "\n}\n"


def filler(rng: random.Random, size: int) -> str:
    lines, total = [], 0
    while total < size:
        line = f"    t{rng.randrange(10**6)} = torch.randn({rng.randrange(1, 999)}, generator=g)\n"
        lines.append(line)
        total += len(line)
    return "".join(lines)


def build(workdir: Path, n: int, dupes: int) -> None:
    rng = random.Random(20261124)
    label_pad, test_pad, ref_pad = filler(rng, 18_000), filler(rng, 29_000), filler(rng, 4_500)
    store = Store.open(workdir)
    repo = store.upsert_repo("https://github.com/o/r", "ab" * 20, license="Apache-2.0")
    for folder in ("labels", "tests", "references"):
        (workdir / folder).mkdir(parents=True, exist_ok=True)
    cands = []
    for i in range(n + dupes):
        source = (
            kernel_source(rng, i) if i < n else cands[i - n].kernel.source.replace(" = ", " += ", 1)
        )
        k = Kernel(
            name=f"kernel_{i:05d}",
            file=f"ops/k{i % 300}.cu",
            line=10,
            start_line=10,
            end_line=36,
            source=source,
            params=[
                Param(type="const float*", name="x", text="const float* x"),
                Param(type="float*", name="y", text="float* y"),
                Param(type="int", name="n", text="int n"),
            ],
        )
        c = Candidate(
            id=f"{i:016x}",
            kernel=k,
            provenance=Provenance(
                repo_url="https://github.com/o/r", commit="ab" * 20, license="Apache-2.0"
            ),
        )
        c.wrapper.strategy, c.wrapper.functions = "mined", [f"launch_{i}"]
        c.wrapper.label_path, c.tests.path = f"labels/{c.id}.cu", f"tests/{c.id}.py"
        c.reference.kind, c.reference.path = "cpp", f"references/{c.id}.cpp"
        c.tests.num_cases, c.tests.num_shapes, c.tests.dtypes = 10, 4, ["float32", "float16"]
        metrics = {
            "outcome": "pass",
            "kill_rate": 1.0,
            "kernel_time_us": 30.0,
            "gpu": "H100",
            "torch": "2.11.0+cu130",
            "cuda": "13.0",
            "cases": [{"shape": [[64], [64]]}],
        }
        c.set_stage(StageName.VERIFY, StageResult(status=Status.OK, metrics=metrics))
        label = f"{source}\nvoid launch_{i}(at::Tensor x, at::Tensor y) {{}}\n{label_pad}"
        (workdir / c.wrapper.label_path).write_text(label)
        (workdir / c.tests.path).write_text(f'FUNCTION = "launch_{i}"\n{test_pad}')
        (workdir / c.reference.path).write_text(f"// reference {i}\n{ref_pad}")
        cands.append(c)
    for start in range(0, len(cands), 1000):
        store.save(cands[start : start + 1000], repo)
    for c in cands:
        Reviews(store).write(c.id, 0, "bench", "accept", decision=Decision.ACCEPTED)
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--dupes", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir, out = Path(tmp) / "w", Path(tmp) / "out"
        t0 = time.perf_counter()
        build(workdir, args.n, args.dupes)
        rng = random.Random(7)
        bench = Path(tmp) / "benchmark.cu"
        bench.write_text("".join(kernel_source(rng, 900_000 + i) for i in range(200)))
        print(
            f"built {args.n + args.dupes} accepted candidates in {time.perf_counter() - t0:.1f} s"
        )
        t0 = time.perf_counter()
        report = export(Options(workdirs=[workdir], out=out, exclude=[bench]))
        seconds = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in (out / "data").glob("*.parquet"))
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"exported {report['rows']} rows (dropped {report['dropped']}) in {seconds:.1f} s: "
            f"{seconds / TARGET_S:.2f} of the {TARGET_S:.0f} s target, "
            f"{report['rows'] / seconds:.0f} rows/s, Parquet {size / 2**20:.0f} MiB, "
            f"peak RSS {peak_mb:.0f} MiB"
        )


if __name__ == "__main__":
    main()
