"""Issue 17's table for one repository: what its kernels became, against the census.

    python benchmarks/dev_rows.py --workdir W --census benchmarks/census/OWNER__NAME.csv [--json]
        [--results R1.json R2.json ...]

Reads a workdir whose verify stage holds a GPU run (`kminer ingest`). A kernel passes when its
test passed on the GPU with every kind of wrong variant killed and enough cases and shapes (the
verify outcome is `weak_test` otherwise). The census's denominator is the kernels whose op has
a CPU or pure-PyTorch implementation in the repository; a census kernel counts as passing when
any candidate of it (a specialization) passed. Rows are counted as the export makes them: one
kernel-level row per passing candidate, and one op-level row per label that holds several
kernels (curation.ops) whose every kernel passed.

`--results`: GPU results files (run.py's output) for the candidates the workdir holds no verify
result for, by candidate id, the first file holding one winning (give the newest first): a
device session too short for a whole repository adds the earlier runs of the same tests (same
id), and says which.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter
from pathlib import Path


def table(workdir: Path, census: Path, results: list[Path] = ()) -> dict:
    from curation import ops
    from curation.instructions import read_label
    from miner.candidate import StageName, Status
    from miner.store import Store

    store = Store.open(workdir)
    try:
        cands = list(store.iter_candidates())
    finally:
        store.close()

    earlier: dict = {}  # id -> (file, outcome), the first file holding the id
    for path in results:
        for cid, entry in json.loads(path.read_text())["entries"].items():
            earlier.setdefault(cid, (path.name, entry.get("outcome", "")))
    sources: Counter = Counter()

    def outcome(c) -> str:
        v = c.stage(StageName.VERIFY)
        if v:
            return v.metrics.get("outcome") or v.status.value
        return earlier.get(c.id, ("", ""))[1]

    built = [c for c in cands if (b := c.stage(StageName.BUILD)) and b.status == Status.OK]
    passed = [c for c in cands if outcome(c) == "pass"]
    by_key: dict = {}  # the export's rule: an op row needs every kernel of the op to pass
    for c in cands:
        ops.collect(by_key, c, read_label(workdir, c))
    op_rows = sum(not op.incomplete() for op in by_key.values())
    rows = list(csv.DictReader(census.open()))
    with_ref = [r for r in rows if r["ref_level"]]
    ok = {(c.kernel.file, c.kernel.name) for c in passed}
    ref_pass = [r for r in with_ref if (r["file"], r["kernel"]) in ok]
    launched_ref = [r for r in with_ref if r["launched"] == "y"]
    tested = [c for c in cands if c.tests.path]
    for c in tested:
        if not c.stage(StageName.VERIFY) and c.id in earlier:
            sources[earlier[c.id][0]] += 1
    return {
        "repository": cands[0].provenance.repo_url if cands else str(workdir),
        "kernels": len(cands),
        "launched": sum(c.launched for c in cands),
        "labels_build": len(built),
        "tests": len(tested),
        "verified": sum(bool(outcome(c)) for c in cands),
        "outcomes": dict(Counter(outcome(c) for c in tested if outcome(c))),
        "census_with_reference": len(with_ref),
        "census_passing": len(ref_pass),
        "census_share": round(len(ref_pass) / len(with_ref), 3) if with_ref else None,
        "census_missing": sorted(r["kernel"] for r in with_ref if r not in ref_pass),
        # a kernel no code launches can never be a row: the share over the launched ones
        "census_launched": len(launched_ref),
        "census_launched_share": (
            round(len([r for r in launched_ref if r in ref_pass]) / len(launched_ref), 3)
            if launched_ref
            else None
        ),
        "kernel_rows": len(passed),
        "op_rows": op_rows,
        "outcomes_from_results": dict(sources),  # candidates not verified in this workdir
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--census", type=Path, required=True)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--results", type=Path, nargs="*", default=[])
    args = ap.parse_args(argv)
    t = table(args.workdir, args.census, args.results)
    if args.json:
        print(json.dumps(t))
        return 0
    launched = f"{t['labels_build']}/{t['launched']}"
    print(
        f"| {t['repository']} | {t['kernels']} | {launched} | {t['tests']} | "
        f"{t['census_passing']}/{t['census_with_reference']} "
        f"({t['census_launched']} launched) | {t['kernel_rows']} | "
        f"{t['op_rows']} |"
    )
    print(f"  outcomes: {t['outcomes']}; census kernels not passing: {t['census_missing']}")
    if t["outcomes_from_results"]:
        print(f"  outcomes read from earlier results: {t['outcomes_from_results']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
