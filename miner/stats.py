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


# the stages a kernel passes on its way to a row (compile is a check beside it, not a gate)
ROW_PATH = (StageName.CLOSURE, StageName.WRAP, StageName.BUILD, StageName.TESTGEN, StageName.VERIFY)


def terminal(c: Candidate) -> tuple[str, str, str]:
    """(stage, reason, detail) where `c` stopped on its way to a row: the first stage of the
    row's path that did not end ok; ("row", "pass", "") for a verified pass with every wrong
    variant killed; ("<stage>", "not_run", "") where the work has not been done yet."""
    for name in ROW_PATH:
        r = c.stage(name)
        if r is None:
            return name.value, "not_run", ""
        if name == StageName.VERIFY and r.status == Status.OK:
            if r.metrics.get("kill_rate") == 1.0:
                return "row", "pass", ""
            return name.value, "weak_test", f"kill rate {r.metrics.get('kill_rate')}"
        if r.status != Status.OK:
            reason = r.reason.value if r.reason else r.status.value
            if name == StageName.WRAP and not c.launched:  # nothing of the repo runs it
                return StageName.DISCOVER.value, "not_launched", r.detail
            return name.value, reason, r.detail
    return "row", "pass", ""


def failures(store) -> dict:
    """Every kernel of every repository in the store that is not a row, by where and why it
    stopped (skips included): a summary by (repository, stage, reason) and the kernels."""
    groups: Counter = Counter()
    kernels = []
    for repo in store.repos():
        for c in store.candidates(repo.id):
            stage, reason, detail = terminal(c)
            if stage == "row":
                continue
            groups[(repo.url, stage, reason)] += 1
            kernels.append(
                {
                    "repo": repo.url,
                    "id": c.id,
                    "kernel": c.kernel.name,
                    "file": c.kernel.file,
                    "stage": stage,
                    "reason": reason,
                    "detail": detail,
                }
            )
    order = {name.value: i for i, name in enumerate((StageName.DISCOVER, *ROW_PATH))}
    summary = [
        {"repo": repo, "stage": stage, "reason": reason, "kernels": n}
        for (repo, stage, reason), n in sorted(
            groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99), -kv[1])
        )
    ]
    kernels.sort(key=lambda k: (k["repo"], order.get(k["stage"], 99), k["reason"], k["file"]))
    return {"by_reason": summary, "kernels": kernels}
