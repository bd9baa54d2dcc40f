"""How fast the review UI serves a store of 10,000 candidates (target: queue page < 300 ms).

Fills a fresh SQLite store (or --db URL) with synthetic candidates the size of real ones (a
verify stage with 10 cases, a kernel source of ~1.5 KB), starts the server on 127.0.0.1 and
times each page over HTTP: the median and the slowest of --repeat requests, and the median's
ratio to the target. Usage: python benchmarks/review_queue.py [--n 10000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_server_api import Served

from curation import curators
from miner.candidate import Candidate, Kernel, Provenance, StageName, StageResult, Status
from miner.store import Store

TARGET_MS = 300.0
OUTCOMES = ("pass", "pass", "pass", "mismatch", "weak_test", "build_error", "timeout")
OPS = [f"op_{i}" for i in range(60)]


def synthetic(i: int) -> Candidate:
    source = "__global__ void k(const float* x, float* y, int n) {\n" + "  y[0] = x[0];\n" * 100
    k = Kernel(name=f"kernel_{i:05d}", file=f"ops/csrc/k{i % 300}.cuh", line=i % 900 + 1,
               start_line=i % 900 + 1, end_line=i % 900 + 40, source=source + "}\n")  # fmt: skip
    c = Candidate(id=f"{i:016x}", provenance=Provenance(repo_url=f"https://github.com/o/r{i % 5}",
                  commit="ab" * 20, license="Apache-2.0"), kernel=k)  # fmt: skip
    c.wrapper.strategy = ("mined", "rule", "llm")[i % 3]
    c.wrapper.op_map = {"python_name": OPS[i % len(OPS)]}
    c.reference.kind = ("cpp", "python", "llm")[i % 3]
    case = {"shape": [[64, 3, 8, 8], [16, 5]], "dtype": "float32", "max_abs": 1e-6, "ok": True}
    cases = [{"id": f"case_{j}", **case} for j in range(10)]
    metrics = {"outcome": OUTCOMES[i % len(OUTCOMES)], "kill_rate": 1.0 if i % 4 else 0.67}
    metrics.update(kernel_time_us=5.0 + (i % 997) / 7, cases=cases, gpu="NVIDIA H100")
    c.set_stage(StageName.VERIFY, StageResult(status=Status.OK, metrics=metrics))
    return c


def timed(client: httpx.Client, url: str, repeat: int) -> tuple[float, float]:
    client.get(url).raise_for_status()  # warm
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        client.get(url).raise_for_status()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--db", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(args.db) if args.db else Store.open(Path(tmp))
        start = time.perf_counter()
        repo = store.upsert_repo("https://github.com/o/r", "ab" * 20, license="Apache-2.0")
        for lo in range(0, args.n, 1000):
            store.save([synthetic(i) for i in range(lo, min(args.n, lo + 1000))], repo)
        print(f"filled {args.n} candidates in {time.perf_counter() - start:.1f} s")
        token = curators.add(store, "bench")
        with Served(store) as srv:
            client = srv.client(token)
            pages = {
                "queue page /": "/",
                "queue filtered + sorted, page 20": "/?outcome=pass&sort=-kernel_time_us&page=20",
                "queue by op": f"/?op={OPS[7]}",
                "API /api/candidates": "/api/candidates?status=pending&page=50",
                "candidate page": f"/c/{5000 % args.n:016x}",
                "API /api/stats": "/api/stats",
            }
            for name, url in pages.items():
                median, worst = timed(client, url, args.repeat)
                ratio = median / TARGET_MS
                print(f"{name:36} median {median:7.1f} ms  max {worst:7.1f} ms  "
                      f"median/target {ratio:.2f}")  # fmt: skip
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
