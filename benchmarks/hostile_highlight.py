"""How the review pages' time grows with a hostile kernel source (target: linear).

The hand-written highlighter the pages had before Pygments took 1.1 s on 30 KB of unclosed
`/*` comments, 4.5 s on 60 KB and 45 s for a whole page at 120 KB: quadratic, and every other
request waited. This prints, for each kind of hostile source at 30, 60 and 120 KB, the time of
`curation.ui.highlight` alone and of the candidate page over HTTP (uvicorn on 127.0.0.1, the
best of --repeat), and the 120 KB time over the 30 KB one: about 4 when the time is linear,
about 16 when it is quadratic. Usage: python benchmarks/hostile_highlight.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_server_api import Served, make_candidate

from curation import curators
from curation.ui import highlight
from miner.store import Store

SIZES_KB = (30, 60, 120)
KINDS = {  # name: one unit, repeated up to the size
    "unclosed /* comments": "/* x ",
    "unterminated strings": 'const char* s = "' + "a\\" * 500 + "\n",
    "nested parentheses": "(" * 10_000 + ")" * 10_000,
    "long single line": "x" * 1000,
}


def source(unit: str, kb: int) -> str:
    return (unit * (kb * 1000 // len(unit) + 1))[: kb * 1000]


def best(repeat: int, work, *args) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work(*args)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp))
        repo = store.upsert_repo("https://x/r", "ab" * 20, license="MIT")
        token = curators.add(store, "bench")
        ids = {}
        for k, (kind, unit) in enumerate(KINDS.items()):
            for j, kb in enumerate(SIZES_KB):
                cand = make_candidate(100 * k + j, "pass")
                cand.kernel.source = source(unit, kb)
                store.save(cand, repo)
                ids[kind, kb] = cand.id
        header = "  ".join(f"{kb:>4} KB" for kb in SIZES_KB)
        print(f"{'':24}{'':10}{header}   120/30")
        with Served(store) as srv, srv.client(token) as client:
            for kind, unit in KINDS.items():
                times = {"highlight": [], "page": []}
                for kb in SIZES_KB:
                    text, url = source(unit, kb), f"/c/{ids[kind, kb]}"
                    times["highlight"].append(best(args.repeat, highlight, text))
                    times["page"].append(best(args.repeat, client.get, url))
                for what, row in times.items():
                    cells = "  ".join(f"{t:6.3f}s" for t in row)
                    print(f"{kind:24}{what:10}{cells}   {row[-1] / row[0]:5.1f}")
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
