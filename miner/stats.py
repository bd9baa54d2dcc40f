"""The funnel of a workdir: how many kernels each stage kept, and why the others stopped."""

from __future__ import annotations

from collections import Counter

from miner.candidate import Candidate, StageName, Status


def funnel(store, repo_id: int | None = None) -> dict:
    repo = store.repo(repo_id)
    if repo is None:
        return {"repo": None, "found": 0}
    cands: list[Candidate] = store.candidates(repo.id)
    info = (repo.discovery or {}).get("info", {})
    skips = Counter(reason for _, reason in store.file_skips(repo.id))
    out: dict = {
        "repo": {"url": repo.url, "commit": repo.commit, "license": repo.license},
        "files_scanned": info.get("files", 0),
        "files_skipped": dict(sorted(skips.items())),
        "invalid_utf8_files": info.get("invalid_utf8", 0),
        "excluded": {
            "declarations": info.get("declarations", 0),
            "explicit_instantiations": info.get("instantiations", 0),
        },
        "found": len(cands),
        "templated": sum(c.kernel.templated for c in cands),
        "specializations": sum(bool(c.kernel.specialization) for c in cands),
        "from_macro": sum(bool(c.kernel.from_macro) for c in cands),
        "parse_fallback": sum(c.kernel.parse_fallback for c in cands),
        "launched": sum(c.launched for c in cands),
        "not_launched": sum(not c.launched for c in cands),
    }
    for stage in (
        StageName.CLOSURE,
        StageName.COMPILE,
        StageName.WRAP,
        StageName.BUILD,
        StageName.TESTGEN,
    ):
        results = [c.stage(stage) for c in cands]
        results = [r for r in results if r is not None]
        if not results:
            continue
        out[stage.value] = {
            "status": dict(Counter(r.status.value for r in results)),
            "reasons": dict(Counter(r.reason.value for r in results if r.reason)),
        }
    comp = [c for c in cands if (r := c.stage(StageName.COMPILE)) and r.status.value == "ok"]
    out["unit_compiles"] = len(comp)
    out["compile_rate"] = round(len(comp) / len(cands), 4) if cands else 0.0
    out["needs_torch"] = sum(c.unit.needs_torch for c in cands)
    out["strategies"] = dict(Counter(c.wrapper.strategy for c in cands if c.wrapper.strategy))
    out["label_builds"] = sum(
        1 for c in cands if (r := c.stage(StageName.BUILD)) and r.status.value == "ok"
    )
    out.update(_verification(cands))
    run = store.last_run()
    if run is not None:
        out["last_run"] = {"status": run.status, "timings_s": run.timings, "counts": run.counts}
    return out


def _verification(cands: list[Candidate]) -> dict:
    """The funnel's tail: label builds → reference → tests → pass, with the reasons and outcomes
    (a verify outcome is `pass` or a reason; the kill rate is over the labels whose test ran)."""
    testgen = [r for c in cands if (r := c.stage(StageName.TESTGEN))]
    verify = [r for c in cands if (r := c.stage(StageName.VERIFY))]
    outcomes = Counter(str(r.metrics.get("outcome") or r.status.value) for r in verify)
    rates = [r.metrics["kill_rate"] for r in verify if r.metrics.get("kill_rate") is not None]
    out: dict = {
        "references": sum(bool(c.reference.path) for c in cands),
        "tests": sum(r.status == Status.OK for r in testgen),
        "passes": outcomes.get("pass", 0),
        "testgen_reasons": dict(Counter(r.reason.value for r in testgen if r.reason)),
        "reference_kinds": dict(Counter(c.reference.kind for c in cands if c.reference.path)),
        "verify_outcomes": dict(sorted(outcomes.items())),
        "mean_kill_rate": round(sum(rates) / len(rates), 4) if rates else None,
    }
    if verify:
        out["verify"] = {
            "status": dict(Counter(r.status.value for r in verify)),
            "reasons": dict(Counter(r.reason.value for r in verify if r.reason)),
        }
    return out


def failures(store, repo_id: int | None = None) -> list[dict]:
    repo = store.repo(repo_id)
    rows = []
    for c in store.candidates(repo.id if repo else None):
        for name, r in c.stages.items():
            if r.status.value == "error":
                rows.append(
                    {
                        "id": c.id,
                        "kernel": c.kernel.name,
                        "file": c.kernel.file,
                        "stage": name,
                        "reason": r.reason.value if r.reason else "",
                        "detail": r.detail,
                    }
                )
    return rows
