"""`kminer stats --failures`: every kernel that is not a row, by repository, stage and reason."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from miner.candidate import (
    Candidate,
    Kernel,
    LaunchSite,
    Provenance,
    Reason,
    StageName,
    StageResult,
    Status,
)
from miner.cli.app import app
from miner.stats import failures, terminal
from miner.store import Store

OK = StageResult(status=Status.OK)


def _kernel(name: str, stages: dict, launched: bool = True) -> Candidate:
    k = Kernel(name=name, file="k.cu", line=1, start_line=1, end_line=2, source="")
    c = Candidate(id=name, provenance=Provenance(repo_url="r", commit="c"), kernel=k)
    if launched:
        c.launches = [LaunchSite(file="k.cu", line=9, kind="chevron", caller="run")]
    for stage, result in stages.items():
        c.set_stage(stage, result)
    return c


def _stop(reason: Reason, status: Status = Status.ERROR) -> StageResult:
    return StageResult(status=status, reason=reason, detail=f"why {reason.value}")


PATH_OK = {StageName.CLOSURE: OK, StageName.WRAP: OK, StageName.BUILD: OK, StageName.TESTGEN: OK}


def _store(tmp_path) -> Store:
    store = Store.open(tmp_path)
    one = store.upsert_repo("https://example.com/one", "c1")
    two = store.upsert_repo("https://example.com/two", "c2")
    row = StageResult(status=Status.OK, metrics={"outcome": "pass", "kill_rate": 1.0})
    weak = StageResult(status=Status.OK, metrics={"outcome": "pass", "kill_rate": 0.5})
    store.save(
        [
            _kernel("row", {**PATH_OK, StageName.VERIFY: row}),
            _kernel("weak", {**PATH_OK, StageName.VERIFY: weak}),
            _kernel(
                "no_ref", {**PATH_OK, StageName.TESTGEN: _stop(Reason.NO_REFERENCE, Status.SKIPPED)}
            ),
            _kernel(
                "no_ref2",
                {**PATH_OK, StageName.TESTGEN: _stop(Reason.NO_REFERENCE, Status.SKIPPED)},
            ),
            _kernel("waits", {StageName.CLOSURE: OK, StageName.WRAP: OK}),
        ],
        one,
    )
    store.save(
        [
            _kernel(
                "dead",
                {StageName.CLOSURE: OK, StageName.WRAP: _stop(Reason.NEEDS_LLM, Status.SKIPPED)},
                launched=False,
            ),
            _kernel(
                "broken",
                {
                    StageName.CLOSURE: OK,
                    StageName.WRAP: OK,
                    StageName.BUILD: _stop(Reason.BUILD_ERROR),
                },
            ),
            _kernel("outside", {StageName.CLOSURE: _stop(Reason.INCLUDE_OUTSIDE)}),
        ],
        two,
    )
    return store


def test_each_kernel_that_is_not_a_row_has_one_place_and_reason(tmp_path):
    store = _store(tmp_path)
    found = failures(store)
    assert found["by_reason"] == [
        {"repo": "https://example.com/one", "stage": "build", "reason": "not_run", "kernels": 1},
        {
            "repo": "https://example.com/one",
            "stage": "testgen",
            "reason": "no_reference",
            "kernels": 2,
        },
        {"repo": "https://example.com/one", "stage": "verify", "reason": "weak_test", "kernels": 1},
        {
            "repo": "https://example.com/two",
            "stage": "discover",
            "reason": "not_launched",
            "kernels": 1,
        },
        {
            "repo": "https://example.com/two",
            "stage": "closure",
            "reason": "include_outside",
            "kernels": 1,
        },
        {
            "repo": "https://example.com/two",
            "stage": "build",
            "reason": "build_error",
            "kernels": 1,
        },
    ]
    names = {k["kernel"] for k in found["kernels"]}
    assert "row" not in names and len(names) == 7  # every kernel but the row, once
    assert [terminal(c)[:2] for c in store.candidates() if c.id in ("row", "waits")] == [
        ("row", "pass"),
        ("build", "not_run"),
    ]
    outside = next(k for k in found["kernels"] if k["kernel"] == "outside")
    assert outside["detail"] == "why include_outside" and outside["repo"].endswith("/two")
    store.close()


def test_stats_failures_through_the_cli(tmp_path):
    _store(tmp_path).close()
    res = CliRunner().invoke(app, ["stats", "--workdir", str(tmp_path), "--failures", "--json"])
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["failures"]["kernels"]) == 7
    res = CliRunner().invoke(app, ["stats", "--workdir", str(tmp_path), "--failures"])
    assert res.exit_code == 0, res.output
    assert "kernels that are not rows" in res.stdout
    assert "discover not_launched       k.cu dead: why needs_llm" in res.stdout
