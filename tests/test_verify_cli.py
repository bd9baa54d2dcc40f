"""`kminer testgen | bundle | ingest | verify`, the testgen stage in the pipeline, and the funnel's
tail (reference → tests → pass) in `stats` and `candidates --json`.

The workdir is made by hand: candidates whose labels, tests, references and variants are the fake
fixtures of the runner (tests/fixtures/runner/fake: the test does what its label says, no torch
build, no GPU), so `verify` runs the real run.py end to end on this machine.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miner.cli.app import app

FAKE = Path(__file__).parent / "fixtures" / "runner" / "fake"
cli = CliRunner()

# id -> label fixture (None: the label file is gone), variants, reference kind, testgen status
SPECS = {
    "a": ("pass", [("off_by_one", "v_mismatch"), ("no_write", "v_nobuild")], "cpp", "ok"),
    "b": ("mismatch", [], "cpp", "ok"),
    "w": ("pass", [("op_swap", "v_pass"), ("off_by_one", "v_mismatch")], "python", "ok"),
    "e": (None, [], "cpp", "ok"),  # has a test, but its label is missing: never bundled
    "n": ("pass", [], "", "skipped"),  # no reference: no test
}
RESULTS = {
    "gpu": "NVIDIA H100 80GB HBM3",
    "torch": "2.13.0+cu129",
    "cuda": "12.9",
    "started": "2025-01-01T00:00:00+00:00",
    "entries": {
        "a": {
            "outcome": "pass",
            "phase": "run",
            "cases": [{"id": "case_0", "shape": [[4]], "dtype": "float32", "ok": True}],
            "kernel_time_us": 12.5,
            "kill_rate": 1.0,
            "variants": [{"kind": "off_by_one", "path": "v", "outcome": "mismatch", "detail": ""}],
            "build_s": 2.0,
            "run_s": 0.5,
            "build_cached": False,
            "detail": "",
            "log_tail": "",
        },
        "b": {"outcome": "mismatch", "kernel_time_us": 30.0, "kill_rate": None, "detail": "d1"},
        "w": {"outcome": "weak_test", "kernel_time_us": 7.25, "kill_rate": 0.5, "detail": "wk"},
        "zz": {"outcome": "pass"},  # an id the store does not have
    },
}


def make_workdir(wd: Path) -> Path:
    """Six candidates: a, b, w with tests; e with a test but no label file; n without a
    reference; u whose unit did not compile (no label)."""
    from miner.candidate import (
        Candidate,
        Kernel,
        Provenance,
        Reason,
        Reference,
        StageName,
        StageResult,
        Status,
        Tests,
        Wrapper,
    )
    from miner.store import Store

    for sub in ("src", "labels", "tests", "references", "variants"):
        (wd / sub).mkdir(parents=True, exist_ok=True)
    store = Store.open(wd)
    url, commit = "https://example.com/r", "0" * 40
    repo_id = store.upsert_repo(url, commit, kind="dir", root=str(wd / "src"))
    cands = []
    for cid, (label, variants, ref_kind, testgen) in {**SPECS, "u": (None, [], "", "")}.items():
        source = f"__global__ void {cid}_kernel() {{}}"
        kernel = Kernel(
            name=f"{cid}_kernel",
            file=f"k_{cid}.cu",
            line=1,
            start_line=1,
            end_line=2,
            source=source,
        )
        cand = Candidate(id=cid, provenance=Provenance(repo_url=url, commit=commit), kernel=kernel)
        ok = StageResult(status=Status.OK)
        if cid == "u":
            cand.set_stage(
                StageName.COMPILE, StageResult(status=Status.ERROR, reason="compile_error")
            )
            cands.append(cand)
            continue
        cand.set_stage(StageName.COMPILE, ok)
        cand.set_stage(StageName.BUILD, StageResult(status=Status.OK, seconds=61.25 * (cid == "a")))
        cand.wrapper = Wrapper(strategy="mined", label_path=f"labels/{cid}.cu", label_hash=cid)
        if label:
            shutil.copy(FAKE / f"{label}.cu", wd / cand.wrapper.label_path)
        if ref_kind:
            cand.reference = Reference(kind=ref_kind, path=f"references/{cid}.cpp", hash=cid)
            shutil.copy(FAKE / "ref.cpp", wd / cand.reference.path)
        if testgen == "skipped":
            result = StageResult(status=Status.SKIPPED, reason=Reason.NO_REFERENCE, detail="none")
            cand.set_stage(StageName.TESTGEN, result)
            cands.append(cand)
            continue
        tests = Tests(path=f"tests/{cid}.py", hash=cid, num_cases=4, num_shapes=2)
        # one test file per candidate (a build folder each), all the fake test
        (wd / tests.path).write_text((FAKE / "fake_check.py").read_text() + f"\n# {cid}\n")
        for n, (kind, fixture) in enumerate(variants):
            tests.variants.append(f"variants/{cid}.{n}.{kind}.cu")
            tests.variant_kinds.append(kind)
            shutil.copy(FAKE / f"{fixture}.cu", wd / tests.variants[-1])
        cand.tests = tests
        metrics = {"num_cases": 6, "num_shapes": 3, "reference_kind": ref_kind}
        # e's record predates the metrics: candidates --json takes them from the record
        metrics = {} if cid == "e" else metrics
        cand.set_stage(StageName.TESTGEN, StageResult(status=Status.OK, metrics=metrics))
        cands.append(cand)
    store.save(cands, repo_id)
    store.close()
    return wd


@pytest.fixture
def wd(tmp_path):
    return make_workdir(tmp_path / "run")


def invoke(*args: str, env: dict | None = None):
    return cli.invoke(app, list(args), env=env)


def rows(wd: Path) -> dict[str, dict]:
    res = invoke("candidates", "--workdir", str(wd), "--json")
    assert res.exit_code == 0, res.output
    return {r["id"]: r for r in map(json.loads, res.stdout.splitlines())}


def stats(wd: Path) -> dict:
    res = invoke("stats", "--workdir", str(wd), "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def one_error_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


# ---------------------------------------------------------------- pipeline and testgen command


def test_the_runner_runs_stages_in_order_over_what_each_needs(wd):
    from miner.candidate import StageName, StageResult, Status
    from miner.pipeline import run
    from miner.stage import MINE_STAGES, RunConfig, Stage

    assert MINE_STAGES[-2:] == ("build", "testgen")
    calls = []

    class FakeBuild(Stage):
        name = StageName.BUILD

        def key(self, cand, ctx):
            return "build-key"

        def run(self, batch, ctx):
            calls.append(("build", sorted(c.id for c in batch)))
            for c in batch:
                c.wrapper.launcher = "built"
                c.set_stage(self.name, StageResult(status=Status.OK))
                yield c

    class FakeTestgen(Stage):
        name = StageName.TESTGEN
        needs = (StageName.BUILD,)

        def key(self, cand, ctx):
            return "testgen-key"

        def run(self, batch, ctx):
            calls.append(("testgen", [c.wrapper.launcher for c in batch], ctx.cfg.filter))
            return []

    cfg = RunConfig(repo="", workdir=wd, filter="*a*")
    ctx = run(cfg, [FakeBuild(), FakeTestgen()], command="build testgen")
    assert calls[0] == ("build", ["a"])  # the filter is the runner's
    assert calls[1] == ("testgen", ["built"], "*a*")  # read back after build saved
    assert "testgen" in ctx.timings
    calls.clear()
    run(RunConfig(repo="", workdir=wd), [FakeBuild()], command="build")
    assert calls == [("build", ["b", "e", "n", "u", "w"])]  # a is built under the same key


def test_testgen_command(wd, monkeypatch):
    from testgen.testgen_stage import Testgen

    seen = []

    def fake_run(self, batch, ctx):
        seen.append((ctx.cfg, [c.id for c in batch]))
        return []

    monkeypatch.setattr(Testgen, "run", fake_run)
    res = invoke("testgen", "--workdir", str(wd), "--filter", "k_a.cu", "--redo", "--json")
    assert res.exit_code == 0, res.output
    ((cfg, ids),) = seen
    assert (cfg.stages, cfg.filter, cfg.redo, ids) == (("testgen",), "k_a.cu", True, ["a"])
    data = json.loads(res.stdout)
    assert (data["tests"], data["references"]) == (4, 4)
    assert "testgen" in data["last_run"]["timings_s"]
    res = invoke("testgen", "--workdir", str(wd), "--llm", "openai", env={"OPENAI_BASE_URL": ""})
    assert res.exit_code == 2 and "needs an endpoint" in one_error_line(res)


def test_testgen_alone_gets_the_llm_client(wd, monkeypatch):
    from testgen.testgen_stage import Testgen
    from wrappers.llm.client import LLMClient

    seen = []
    monkeypatch.setattr(Testgen, "run", lambda self, batch, ctx: seen.append(ctx.llm) or [])
    url = "http://127.0.0.1:9/v1"  # never called: the fake stage asks nothing
    res = invoke("testgen", "--workdir", str(wd), "--llm", "openai", "--llm-base-url", url)
    assert res.exit_code == 0, res.output
    ((client,),) = [seen]
    assert isinstance(client, LLMClient) and str(client.base_url).startswith(url)
    seen.clear()
    assert invoke("testgen", "--workdir", str(wd), "--llm", "none", "--redo").exit_code == 0
    assert seen == [None]


def test_mine_knows_the_testgen_stage(tmp_path):
    res = invoke("mine", "x", "--workdir", str(tmp_path / "r"), "--stages", "discover,bogus")
    assert res.exit_code == 2
    assert one_error_line(res).endswith("closure, compile, wrap, build, testgen")


# ---------------------------------------------------------------- bundle


def test_bundle_writes_the_candidates_with_tests(wd, tmp_path):
    out = tmp_path / "b" / "B.tar.gz"
    res = invoke("bundle", "--workdir", str(wd), "--out", str(out))
    assert res.exit_code == 0, res.output
    assert f"3 candidates in {out}" in res.stdout
    assert "e: label missing: labels/e.cu" in res.stdout
    with tarfile.open(out) as tar:
        names = {m.name for m in tar.getmembers()}
        manifest = json.load(tar.extractfile("B/manifest.json"))
    assert [e["id"] for e in manifest] == ["a", "b", "w"]
    assert [v["kind"] for v in manifest[0]["variants"]] == ["off_by_one", "no_write"]
    assert [e.get("build_s") for e in manifest] == [61.2, None, None]  # measured where mined
    assert {"B/run.py", "B/tests/w.py", "B/references/w.cpp", "B/labels/b.cu"} <= names
    assert not any("/n" in n or n.endswith("/u.cu") for n in names)

    res = invoke("bundle", "--workdir", str(wd), "--out", str(out), "--filter", "w_*", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"path": str(out), "ids": ["w"], "skipped": {}}


def test_bundle_without_tests_is_an_error(wd, tmp_path):
    out = tmp_path / "B.tar.gz"
    res = invoke("bundle", "--workdir", str(wd), "--out", str(out), "--filter", "n_*")
    assert res.exit_code == 1
    assert "no candidate" in one_error_line(res) and "kminer testgen" in res.stderr
    assert not out.exists()
    res = invoke("bundle", "--workdir", str(wd), "--out", str(out), "--filter", "e_*")
    assert res.exit_code == 1 and "e: label missing" in one_error_line(res)
    assert not out.exists()
    res = invoke("bundle", "--workdir", str(wd))
    assert res.exit_code == 2 and "--out" in one_error_line(res)


# ---------------------------------------------------------------- ingest


def test_ingest_sets_verify_stages(wd, tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(RESULTS))
    res = invoke("ingest", "--workdir", str(wd), str(results))
    assert res.exit_code == 0, res.output
    assert "3 results: mismatch 1, pass 1, weak_test 1" in res.stdout
    assert "1 ids match no candidate: zz" in res.stdout
    got = rows(wd)
    a, b, w = (got[i]["stages"]["verify"] for i in "abw")
    assert {k: a[k] for k in ("status", "reason", "kill_rate", "kernel_time_us")} == {
        "status": "pass",
        "reason": None,
        "kill_rate": 1.0,
        "kernel_time_us": 12.5,
    }
    assert a["gpu"] == "NVIDIA H100 80GB HBM3" and a["cases"][0]["id"] == "case_0"
    assert (b["status"], b["reason"], b["kill_rate"], b["kernel_time_us"]) == (
        "mismatch",
        "mismatch",
        None,
        30.0,
    )
    assert (w["status"], w["reason"], w["kill_rate"], w["detail"]) == (
        "weak_test",
        "weak_test",
        0.5,
        "wk",
    )
    assert "verify" not in got["e"]["stages"] and "verify" not in got["n"]["stages"]
    # testgen figures: from the stage's metrics, or from the record when the stage has none
    assert {k: got["a"]["stages"]["testgen"][k] for k in ("status", "num_cases", "num_shapes")} == {
        "status": "ok",
        "num_cases": 6,
        "num_shapes": 3,
    }
    assert got["w"]["stages"]["testgen"]["reference_kind"] == "python"
    e = got["e"]["stages"]["testgen"]
    assert (e["num_cases"], e["num_shapes"], e["reference_kind"]) == (4, 2, "cpp")
    n = got["n"]["stages"]["testgen"]
    assert (n["status"], n["reason"], n["num_cases"], n["num_shapes"], n["reference_kind"]) == (
        "skipped",
        "no_reference",
        0,
        0,
        "",
    )
    assert got["a"]["stages"]["build"] == {"status": "ok", "reason": None, "detail": ""}

    res = invoke("ingest", "--workdir", str(wd), str(results), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {
        "ingested": 3,
        "unknown": ["zz"],
        "outcomes": {"mismatch": 1, "pass": 1, "weak_test": 1},
    }


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps({"entries": {"a": {"outcome": "pass"}, "b": {"outcome": "exploded"}}}),
        json.dumps({"entries": {"a": {"outcome": "pass"}, "w": {"outcome": "pass", "cases": 3}}}),
        json.dumps([RESULTS]),
    ],
)
def test_ingest_rejects_a_bad_file_and_changes_nothing(wd, tmp_path, text):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(RESULTS))
    assert invoke("ingest", "--workdir", str(wd), str(good)).exit_code == 0
    before = rows(wd)
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    res = invoke("ingest", "--workdir", str(wd), str(bad))
    assert res.exit_code == 1
    assert "not a kminer results file" in one_error_line(res) and "bad.json" in res.stderr
    assert rows(wd) == before
    res = invoke("ingest", "--workdir", str(wd), str(tmp_path / "missing.json"))
    assert res.exit_code == 1 and "missing.json" in one_error_line(res)
    assert rows(wd) == before


# ---------------------------------------------------------------- the funnel


def test_stats_funnel(wd, tmp_path):
    s = stats(wd)
    assert (s["found"], s["unit_compiles"], s["label_builds"]) == (6, 5, 5)
    assert (s["references"], s["tests"], s["passes"]) == (4, 4, 0)
    assert s["testgen_reasons"] == {"no_reference": 1}
    assert s["reference_kinds"] == {"cpp": 3, "python": 1}
    assert s["testgen"]["status"] == {"ok": 4, "skipped": 1}
    assert (s["verify_outcomes"], s["mean_kill_rate"]) == ({}, None)
    assert "verify" not in s
    (tmp_path / "r.json").write_text(json.dumps(RESULTS))
    assert invoke("ingest", "--workdir", str(wd), str(tmp_path / "r.json")).exit_code == 0
    s = stats(wd)
    assert s["passes"] == 1
    assert s["verify_outcomes"] == {"mismatch": 1, "pass": 1, "weak_test": 1}
    assert s["mean_kill_rate"] == 0.75  # a 1.0, w 0.5; b had no variant run
    assert s["verify"] == {
        "status": {"ok": 1, "error": 2},
        "reasons": {"mismatch": 1, "weak_test": 1},
    }
    res = invoke("stats", "--workdir", str(wd), env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    table = {ln.split("│")[1].strip(): ln for ln in res.stdout.splitlines() if ln.count("│") > 2}
    assert "4/6" in table["reference"] and "cpp 3, python 1" in table["reference"]
    assert "4/6" in table["tests"] and "no_reference 1" in table["tests"]
    assert "1/6" in table["pass"] and "mean kill rate 0.75" in table["pass"]


# ---------------------------------------------------------------- verify


def test_verify_without_a_gpu(wd):
    res = invoke("verify", "--workdir", str(wd), env={"KMINER_ASSUME_GPU": "0"})
    assert res.exit_code == 2
    d = wd.resolve()
    assert one_error_line(res) == (
        f"error: no CUDA GPU on this machine: run `kminer bundle --workdir {d} --out B.tar.gz`, "
        f"then `python run.py` on a GPU box and `kminer ingest --workdir {d} results.json`"
    )
    assert not (wd / "verify").exists()


def test_gpu_detection_matches_torch(monkeypatch):
    torch = pytest.importorskip("torch")
    from miner.cli import verify

    monkeypatch.delenv("KMINER_ASSUME_GPU", raising=False)
    assert verify.has_gpu() is torch.cuda.is_available()
    monkeypatch.setenv("KMINER_ASSUME_GPU", "1")
    assert verify.has_gpu() is True


def test_verify_runs_the_bundle_and_ingests(wd, tmp_path):
    env = {"KMINER_ASSUME_GPU": "1"}

    def fake_steps() -> list[str]:  # what the fake tests did, oldest first (test_runner.py)
        logs = (wd / "verify" / "bundle").glob(".build/**/fake.log")
        lines = [ln.split() for path in logs for ln in path.read_text().splitlines()]
        return [line[0] for line in sorted(lines, key=lambda line: int(line[5]))]

    args = ["verify", "--workdir", str(wd), "--jobs", "2", "--build-timeout", "60"]
    res = invoke(*args, "--run-timeout", "60", env=env)
    assert res.exit_code == 0, res.output
    assert "3 results: mismatch 1, pass 1, weak_test 1" in res.stdout
    assert "not bundled: e: label missing" in res.stdout
    assert "[3/3]" in res.stderr  # run.py's progress
    got = rows(wd)
    a, b, w = (got[i]["stages"]["verify"] for i in "abw")
    assert (a["status"], a["kill_rate"], a["kernel_time_us"], a["gpu"]) == (
        "pass",
        1.0,
        12.5,
        "FakeGPU 80GB",
    )
    assert (b["status"], b["reason"], b["kill_rate"]) == ("mismatch", "mismatch", None)
    assert "differs from the reference" in b["detail"]
    assert (w["status"], w["kill_rate"]) == ("weak_test", 0.5) and "op_swap" in w["detail"]
    assert "verify" not in got["e"]["stages"]
    base = wd / "verify"
    assert (base / "bundle.tar.gz").is_file() and (base / "results.json").is_file()
    assert (base / "bundle" / "manifest.json").is_file() and (base / "bundle" / ".build").is_dir()
    s = stats(wd)
    assert (s["passes"], s["mean_kill_rate"]) == (1, 0.75)
    assert s["last_run"]["counts"] == {"mismatch": 1, "pass": 1, "weak_test": 1}
    assert {"bundle", "run"} <= set(s["last_run"]["timings_s"])

    # a rerun verifies nothing that is verified; --redo unpacks over the last bundle: old files
    # go, the build cache stays
    steps = len(fake_steps())
    res = invoke(*args, "--run-timeout", "60", "--json", env=env)
    assert res.exit_code == 0 and json.loads(res.stdout)["ingested"] == 0
    assert len(fake_steps()) == steps
    (base / "bundle" / "tests" / "stale.py").write_text("x")
    res = invoke(*args, "--run-timeout", "60", "--redo", env=env)
    assert res.exit_code == 0, res.output
    again = fake_steps()[steps:]
    assert again and set(again) == {"run"}  # nothing built twice
    assert not (base / "bundle" / "tests" / "stale.py").exists()

    # --only: one result, the others keep theirs
    res = invoke(*args, "--only", "b", "--redo", "--json", env=env)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["outcomes"] == {"mismatch": 1}
    assert set(json.loads((base / "results.json").read_text())["entries"]) == {"b"}
    assert rows(wd)["a"]["stages"]["verify"]["status"] == "pass"


def test_verify_needs_tests_and_a_store(wd, tmp_path):
    res = invoke("verify", "--workdir", str(wd), "--filter", "n_*", env={"KMINER_ASSUME_GPU": "1"})
    assert res.exit_code == 1 and "kminer testgen" in one_error_line(res)
    res = invoke("verify", "--workdir", str(tmp_path / "nothing"))
    assert res.exit_code == 1 and "no kminer store" in one_error_line(res)


def test_summary_always_shows_the_stage_figures():
    from miner.candidate import (
        Candidate,
        Kernel,
        Provenance,
        Reason,
        StageName,
        StageResult,
        Status,
    )

    kernel = Kernel(name="k", file="k.cu", line=1, start_line=1, end_line=1, source="")
    cand = Candidate(id="x", provenance=Provenance(repo_url="u", commit="c"), kernel=kernel)
    cand.set_stage(StageName.VERIFY, StageResult(status=Status.ERROR, reason=Reason.NO_GPU))
    cand.set_stage(StageName.TESTGEN, StageResult(status=Status.ERROR, reason=Reason.NO_CASES))
    stages = cand.summary()["stages"]
    assert stages["verify"] == {
        "status": "error",
        "reason": "no_gpu",
        "detail": "",
        "kill_rate": None,
        "kernel_time_us": None,
    }
    assert stages["testgen"] == {
        "status": "error",
        "reason": "no_cases",
        "detail": "",
        "num_cases": 0,
        "num_shapes": 0,
        "reference_kind": "",
    }
