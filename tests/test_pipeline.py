"""`kminer mine` end to end through the CLI: records, resume, cache, filters, kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import SAMPLE, expected, git_repo, needs_nvcc
from typer.testing import CliRunner

from miner.cli.app import app

runner = CliRunner()
UNITS = "discover,closure,compile"
TINY = {
    "csrc/ops.cuh": "#pragma once\n"
    "#define LOOP(i, n) for (int i = threadIdx.x; i < (n); i += blockDim.x)\n"
    "__device__ float twice(float x) { return 2 * x; }\n",
    "csrc/ops.cu": '#include "ops.cuh"\n'
    "__global__ void double_kernel(float* x, int n) { LOOP(i, n) x[i] = twice(x[i]); }\n"
    "template <typename T> __global__ void add_kernel(T* x, const T* y, int n) {\n"
    "  LOOP(i, n) x[i] += y[i];\n}\n"
    "void run(float* x, const float* y, int n) {\n"
    "  double_kernel<<<1, 256>>>(x, n);\n  add_kernel<float><<<1, 256>>>(x, y, n);\n}\n",
    "LICENSE": "MIT License\n\nPermission is hereby granted, free of charge, to any person "
    "obtaining a copy of this software",
}


def mine(*args: str):
    return runner.invoke(app, ["mine", *args])


def candidates(workdir) -> list[dict]:
    res = runner.invoke(app, ["candidates", "--workdir", str(workdir), "--json"])
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def stats(workdir) -> dict:
    res = runner.invoke(app, ["stats", "--workdir", str(workdir), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_sample_repo_discovery_and_closure(tmp_path):
    wd = tmp_path / "run"
    res = mine(str(SAMPLE), "--workdir", str(wd), "--stages", "discover,closure")
    assert res.exit_code == 0, res.output
    rows = candidates(wd)
    want = {(r["file"], r["kernel"], int(r["line"])) for r in expected("sample-repo")}
    assert {(r["file"], r["kernel"], r["line"]) for r in rows} == want
    for r in rows:
        assert set(r) >= {"id", "file", "line", "kernel", "templated", "launched", "stages"}
        assert r["stages"]["closure"]["status"] == "ok"
        assert "compile" not in r["stages"]
        assert (wd / r["unit"]).read_text().count("__global__") >= 1
    s = stats(wd)
    assert s["found"] == 6 and s["repo"]["license"] == "MIT"
    assert s["last_run"]["timings_s"]["discover"] > 0


def test_rerun_reuses_discovery_and_ids_are_stable(tmp_path):
    wd = tmp_path / "run"
    assert mine(str(SAMPLE), "--workdir", str(wd), "--stages", "discover,closure").exit_code == 0
    first = {r["id"] for r in candidates(wd)}
    assert mine(str(SAMPLE), "--workdir", str(wd), "--stages", "discover,closure").exit_code == 0
    assert stats(wd)["last_run"]["counts"].get("reused_discover") == 1
    assert {r["id"] for r in candidates(wd)} == first
    assert (
        mine(str(SAMPLE), "--workdir", str(wd), "--stages", "discover,closure", "--redo").exit_code
        == 0
    )
    assert "discover" in stats(wd)["last_run"]["timings_s"]


@needs_nvcc
def test_compile_cache_and_redo(tmp_path):
    repo = git_repo(tmp_path / "tiny", TINY)
    wd = tmp_path / "run"
    res = mine(str(repo), "--workdir", str(wd), "--jobs", "2", "--stages", UNITS)
    assert res.exit_code == 0, res.output
    rows = {r["kernel"]: r for r in candidates(wd)}
    assert {k: r["stages"]["compile"]["status"] for k, r in rows.items()} == {
        "double_kernel": "ok",
        "add_kernel": "ok",
    }
    assert stats(wd)["last_run"]["counts"]["compiled"] == 2
    assert mine(str(repo), "--workdir", str(wd), "--stages", UNITS).exit_code == 0
    assert stats(wd)["last_run"]["counts"].get("compiled", 0) == 0
    assert mine(str(repo), "--workdir", str(wd), "--redo", "--stages", UNITS).exit_code == 0
    assert stats(wd)["last_run"]["counts"]["compiled"] == 2
    assert (wd / "logs" / f"{rows['add_kernel']['id']}.compile.log").exists()


def test_filter_limits_closure(tmp_path):
    wd = tmp_path / "run"
    res = mine(
        str(SAMPLE), "--workdir", str(wd), "--stages", "discover,closure", "--filter", "*softmax*"
    )
    assert res.exit_code == 0, res.output
    done = {r["kernel"] for r in candidates(wd) if "closure" in r["stages"]}
    assert done == {"row_softmax_cuda_kernel", "row_sum_cuda_kernel"}


@needs_nvcc
@pytest.mark.slow
def test_kill_9_loses_nothing(tmp_path):
    kernels = "".join(
        f"__global__ void k{i}(float* x) {{ x[{i}] = sqrtf(x[{i}]) * {i}; }}\n" for i in range(8)
    )
    repo = git_repo(tmp_path / "many", {"k.cu": kernels})
    wd = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "miner.cli",
        "mine",
        str(repo),
        "--workdir",
        str(wd),
        "-j",
        "1",
        "--stages",
        UNITS,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 120
    done: list[dict] = []
    while time.time() < deadline:
        time.sleep(0.5)
        if (wd / "kminer.db").exists():
            try:
                done = [r for r in candidates(wd) if "compile" in r["stages"]]
            except (AssertionError, json.JSONDecodeError):
                continue
            if len(done) >= 2:
                break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 2 <= len(done) < 8
    saved = {r["id"] for r in candidates(wd) if "compile" in r["stages"]}
    res = mine(str(repo), "--workdir", str(wd), "-j", "2", "--stages", UNITS)
    assert res.exit_code == 0, res.output
    assert all(r["stages"]["compile"]["status"] == "ok" for r in candidates(wd))
    assert stats(wd)["last_run"]["counts"]["compiled"] == 8 - len(saved)


def test_postgres_url_works(tmp_path, postgres_url):
    wd = tmp_path / "run"
    res = mine(
        str(SAMPLE), "--workdir", str(wd), "--stages", "discover,closure", "--db", postgres_url
    )
    assert res.exit_code == 0, res.output
    out = runner.invoke(app, ["candidates", "--db", postgres_url, "--json"])
    assert out.exit_code == 0, out.output
    assert len(out.stdout.strip().splitlines()) >= 6
    assert not (wd / "kminer.db").exists()


WRAPPABLE = {
    "ops.cu": "#include <torch/extension.h>\n"
    "__global__ void twice_kernel(const float* x, float* y, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2.f * x[i];\n}\n"
    "void twice_launcher(at::Tensor x, at::Tensor y) {\n"
    "  int n = x.numel();\n"
    "  twice_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);\n}\n"
    "// never launched, but plain: a rule wrapper fits\n"
    "__global__ void negate_kernel(const float* x, float* y, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = -x[i];\n}\n"
    "// never launched and not plain: waits for an LLM\n"
    "__global__ void transpose_kernel(const float* x, float* y, int rows, int cols) {\n"
    "  int r = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (c < cols) y[c * rows + r] = x[r * cols + c];\n}\n"
    "// launched only by a function taking an object Python cannot pass (MinkowskiEngine's\n"
    "// coordinate manager): waits for an LLM, and says why\n"
    "struct Manager { int rows; };\n"
    "__global__ void gather_kernel(const float* x, float* y, const int* idx, int cols) {\n"
    "  int r = blockIdx.y, c = threadIdx.x;\n"
    "  if (c < cols) y[r * cols + c] = x[idx[r] * cols + c];\n}\n"
    "void gather_launcher(at::Tensor x, at::Tensor y, at::Tensor idx, Manager* m) {\n"
    "  gather_kernel<<<dim3(1, m->rows), 32>>>(x.data_ptr<float>(), y.data_ptr<float>(),\n"
    "                                          idx.data_ptr<int>(), (int)x.size(1));\n}\n",
}


@needs_nvcc
def test_wrap_strategies_and_needs_llm(tmp_path):
    repo = git_repo(tmp_path / "w", WRAPPABLE)
    wd = tmp_path / "run"
    res = mine(str(repo), "--workdir", str(wd), "--stages", UNITS + ",wrap", "--llm", "none")
    assert res.exit_code == 0, res.output
    assert "2 kernels wait for an LLM wrapper" in res.stdout
    rows = {r["kernel"]: r for r in candidates(wd)}
    assert rows["twice_kernel"]["strategy"] == "mined"
    assert rows["negate_kernel"]["strategy"] == "rule"
    assert rows["transpose_kernel"]["stages"]["wrap"] == {
        "status": "skipped",
        "reason": "needs_llm",
        "detail": "no_rule: no host function launches it",
    }
    assert rows["gather_kernel"]["stages"]["wrap"]["detail"] == (
        "no_rule: neither its launcher gather_launcher nor a caller takes only what Python can "
        "pass (`Manager*`)"
    )
    label = (wd / rows["twice_kernel"]["label"]).read_text()
    assert 'm.def("twice_launcher", &twice_launcher)' in label
    # a rerun redoes nothing; the wrap stage is keyed by the code that made the labels
    assert mine(str(repo), "--workdir", str(wd), "--stages", UNITS + ",wrap").exit_code == 0
    assert stats(wd)["wrap"]["status"] == {"ok": 2, "skipped": 2}
    assert stats(wd)["last_run"]["timings_s"]["wrap"] < 1.0


@needs_nvcc
@pytest.mark.slow
def test_build_stage_checks_labels_once(tmp_path):
    repo = git_repo(tmp_path / "w", WRAPPABLE)
    wd = tmp_path / "run"
    res = mine(str(repo), "--workdir", str(wd), "--llm", "none")
    assert res.exit_code == 0, res.output
    rows = {r["kernel"]: r for r in candidates(wd)}
    assert rows["twice_kernel"]["stages"]["build"]["status"] == "ok"
    assert rows["negate_kernel"]["stages"]["build"]["status"] == "ok"
    assert "build" not in rows["transpose_kernel"]["stages"]
    assert stats(wd)["last_run"]["counts"]["built"] == 2
    res = runner.invoke(app, ["build", "--workdir", str(wd)])
    assert res.exit_code == 0, res.output
    assert stats(wd)["last_run"]["counts"].get("built", 0) == 0


def test_unreachable_llm_endpoint_fails_one_candidate_not_the_run(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = git_repo(tmp_path / "w", WRAPPABLE)
    wd = tmp_path / "run"
    res = mine(
        str(repo),
        "--workdir",
        str(wd),
        "--stages",
        "discover,closure,wrap",
        "--filter",
        "*transpose*",
        "--llm",
        "openai",
        "--llm-base-url",
        f"http://127.0.0.1:{port}/v1",
    )
    assert res.exit_code == 0, res.output
    wrap = {r["kernel"]: r for r in candidates(wd)}["transpose_kernel"]["stages"]["wrap"]
    assert wrap["status"] == "error" and wrap["reason"] == "llm_failed"
    assert "\n" not in wrap["detail"] and wrap["detail"]


def test_llm_needs_an_endpoint(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    repo = git_repo(tmp_path / "w", WRAPPABLE)
    res = mine(
        str(repo),
        "--workdir",
        str(tmp_path / "run"),
        "--stages",
        "discover,wrap",
        "--llm",
        "openai",
    )
    assert res.exit_code == 2
    assert "OPENAI_BASE_URL" in res.stderr and len(res.stderr.strip().splitlines()) == 1


@needs_nvcc
@pytest.mark.slow
def test_llm_wrapper_through_the_pipeline_then_rerun_is_free(tmp_path):
    from llm_server import FakeLLM, load

    repo = git_repo(tmp_path / "w", WRAPPABLE)
    wd = tmp_path / "run"
    args = [str(repo), "--workdir", str(wd), "--filter", "*transpose*", "--llm", "openai"]
    args += ["--stages", "discover,closure,compile,wrap,build"]  # the wrapper's calls only
    with FakeLLM(load("transpose_kernel")) as llm:
        res = mine(*args, "--llm-base-url", llm.base_url)
        assert res.exit_code == 0, res.output
        row = {r["kernel"]: r for r in candidates(wd)}["transpose_kernel"]
        assert row["strategy"] == "llm"
        assert row["stages"]["wrap"]["status"] == "ok"
        assert row["stages"]["build"]["status"] == "ok"
        label = (wd / row["label"]).read_text()
        assert "torch::Tensor transpose_forward(torch::Tensor x)" in label
        assert 'm.def("forward", &transpose_forward' in label
        counts = stats(wd)["last_run"]["counts"]
        assert counts["built"] == 0  # the reflection loop's build verdict was reused
        assert counts["llm_calls"] == 2
        calls = len(llm.requests)
        res = mine(*args, "--llm-base-url", llm.base_url, "--redo")
        assert res.exit_code == 0, res.output
        assert len(llm.requests) == calls  # answers come from the cache
        counts = stats(wd)["last_run"]["counts"]
        assert counts.get("llm_calls", 0) == 0 and counts["llm_cache_hits"] == 2


ABSENT_LIB = {
    "csrc/geom.cu": "#include <kminer_absent_linalg/Dense>\n"
    "__global__ void norm_kernel(float* x, int n) {\n"
    "  Linalg::Vector3f v(x[0], x[1], x[2]);\n  x[threadIdx.x] = v.norm();\n}\n"
    "void run(float* x, int n) { norm_kernel<<<1, 32>>>(x, n); }\n",
}


@needs_nvcc
def test_a_header_neither_the_repository_nor_this_machine_has_is_the_reason(tmp_path):
    """lietorch's Eigen is a git submodule its snapshot lacks: the unit fails on `Linalg::`,
    but what stops it is the header it could not have."""
    repo = git_repo(tmp_path / "w", ABSENT_LIB)
    wd = tmp_path / "run"
    res = mine(str(repo), "--workdir", str(wd), "--stages", UNITS, "--llm", "none")
    assert res.exit_code == 0, res.output
    (row,) = candidates(wd)
    compiled = row["stages"]["compile"]
    assert (compiled["status"], compiled["reason"]) == ("error", "missing_header")
    assert compiled["detail"].startswith(
        "kminer_absent_linalg/Dense not found (not in the repository, not on this machine): "
    )
