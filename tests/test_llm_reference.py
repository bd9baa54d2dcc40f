"""LLM references (testgen.llm_reference) against the loopback OpenAI-compatible server, which
replays hand-recorded answers: the contract and the sandboxed run judge each answer, a failed
one goes back to the model, every attempt is stored, a rerun asks nothing, and the generated test
(slow) runs the Python reference against a right and a wrong implementation."""

from __future__ import annotations

import json

import pytest
import torch
from llm_server import FakeLLM, load
from test_reference import REFREPO, candidate
from test_testgen import _run_generated, write_label

from miner.candidate import Reason, StageName, Status
from miner.store import Store
from testgen.generate import ModelHelp, generate_for
from testgen.inputs import RecordedCall
from testgen.llm_reference import contract_problem, related_refs, repo_python_refs, run_check
from wrappers.llm.client import LLMClient

KERNEL = "shift_forward_cuda_kernel"


def shift_recorded() -> dict:
    calls = []
    for n in (7, 300, 1000):
        x = torch.linspace(-3, 3, n)
        calls.append(RecordedCall("shift_forward", [x, torch.zeros(n), 3], {}, "t.py"))
    return {"shift_forward": calls}


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "work")
    yield s
    s.close()


def llm_for(server: FakeLLM, store: Store):
    client = LLMClient(store, base_url=server.base_url, api_key="k", model="fake-model")
    return ModelHelp(client=client, store=store, max_attempts=3)


def test_repository_references_are_found_by_name(refrepo):
    refs = repo_python_refs(str(REFREPO))
    assert {r.name for r in refs} == {"shift_ref", "unrelated_norm_pytorch"}
    cand = candidate(refrepo, KERNEL)
    assert [r.name for r in related_refs(cand, refs)] == ["shift_ref"]
    assert "return x + by" in next(r for r in refs if r.name == "shift_ref").source


def test_contract_problems():
    ok = "import torch, math\ndef reference(a, b):\n    b.copy_(a)\n"
    assert contract_problem(ok, ["a", "b"]) == ""
    assert "exactly (a, b)" in contract_problem("def reference(a):\n    pass\n", ["a", "b"])
    assert "imports numpy" in contract_problem(
        "import numpy\ndef reference(a, b): pass", ["a", "b"]
    )
    assert "CUDA" in contract_problem("def reference(a, b):\n    b.copy_(a.cuda())", ["a", "b"])
    assert "not valid Python" in contract_problem("def reference(a, b)\n", ["a", "b"])
    assert "no top-level function" in contract_problem("def ref(a, b): pass", ["a", "b"])


def test_the_run_check_catches_errors_and_references_that_do_nothing():
    calls = [[torch.ones(3), torch.zeros(3)]]
    assert run_check("def reference(a, b):\n    b.copy_(a * 2)\n", calls) == ""
    assert run_check("def reference(a, b):\n    return a.sum()\n", calls) == ""
    assert "wrote no argument" in run_check("def reference(a, b):\n    c = a + 1\n", calls)
    problem = run_check("def reference(a, b):\n    b.copy_(a[:2])\n", calls)
    assert problem.startswith("call 0 raised") and "RuntimeError" in problem


def test_model_writes_the_reference_after_one_correction(refrepo, tmp_path, store):
    cand = candidate(refrepo, KERNEL)
    write_label(refrepo, cand, tmp_path)
    with FakeLLM(load("reference/shift_forward_cuda_kernel")) as server:
        generate_for(cand, refrepo[3], shift_recorded(), tmp_path, llm_for(server, store))
        first = server.chat_requests("[kminer:reference]")
        fixes = server.chat_requests("[kminer:reference-fix]")
    r = cand.stage(StageName.TESTGEN)
    assert r.status == Status.OK, r.detail
    assert (r.metrics["reference_kind"], cand.reference.kind) == ("python", "python")
    assert (cand.reference.function, cand.reference.file) == ("shift_ref", "ops/shift.py")
    assert len(first) == 1 and len(fixes) == 1
    prompt = first[0]["last_user"]
    assert "ShiftForwardCUDAKernelLauncher" in prompt and "def shift_ref(x, by)" in prompt
    assert "unrelated_norm_pytorch" not in prompt
    assert "`twice_by`: const int" in prompt and "tensor of shape [7], float32" in prompt
    assert "imports numpy" in fixes[0]["last_user"]
    assert len(fixes[0]["body"]["messages"]) == 4  # system, user, the answer, the fix
    rows = [a for a in store.attempts(cand.id) if a["step"] == "reference"]
    assert [(a["attempt"], a["passed"]) for a in rows] == [(1, False), (2, True)]
    assert "imports numpy" in rows[0]["build_log"] and "shift_ref" in rows[1]["parsed"]["code"]
    text = (tmp_path / cand.reference.path).read_text()
    assert cand.reference.path.endswith(".py") and "def reference(input, output, twice_by)" in text
    assert "adapted by fake-model from the repository's `shift_ref`" in text
    test = (tmp_path / cand.tests.path).read_text()
    assert "PYTHON_REFERENCE = True" in test and 'HERE / "reference.py"' in test


def test_rerun_asks_nothing_and_logs_nothing_new(refrepo, tmp_path, store):
    cand = candidate(refrepo, KERNEL)
    write_label(refrepo, cand, tmp_path)
    recs = load("reference/shift_forward_cuda_kernel")
    with FakeLLM(recs) as server:
        generate_for(cand, refrepo[3], shift_recorded(), tmp_path, llm_for(server, store))
    with FakeLLM(recs) as server:
        generate_for(cand, refrepo[3], shift_recorded(), tmp_path, llm_for(server, store))
        assert server.chat_requests() == []
    assert len(store.attempts(cand.id)) == 2 and cand.reference.kind == "python"


def test_answers_never_usable_leave_no_reference(refrepo, tmp_path, store):
    cand = candidate(refrepo, KERNEL)
    write_label(refrepo, cand, tmp_path)
    recs = load("reference/shift_forward_cuda_kernel")
    recs[1]["answers"] = recs[0]["answers"]  # the fix imports numpy again
    with FakeLLM(recs) as server:
        generate_for(cand, refrepo[3], shift_recorded(), tmp_path, llm_for(server, store))
        assert len(server.chat_requests()) == 3
    r = cand.stage(StageName.TESTGEN)
    assert (r.status, r.reason) == (Status.SKIPPED, Reason.NO_REFERENCE)
    assert "not invertible" in r.detail and "no usable reference after 3 answers" in r.detail
    assert r.metrics["llm_tried"] is True and cand.reference.kind == ""
    assert [a["passed"] for a in store.attempts(cand.id)] == [False, False, False]


def test_endpoint_down_is_a_reason_not_a_crash(refrepo, tmp_path, store):
    from types import SimpleNamespace

    cand = candidate(refrepo, KERNEL)
    write_label(refrepo, cand, tmp_path)
    client = LLMClient(
        store, base_url="http://127.0.0.1:9/v1", api_key="k", model="m", max_retries=0, timeout=2.0
    )
    llm = SimpleNamespace(client=client, store=store, max_attempts=3)
    generate_for(cand, refrepo[3], shift_recorded(), tmp_path, llm)
    r = cand.stage(StageName.TESTGEN)
    assert r.reason == Reason.NO_REFERENCE and "llm: " in r.detail and "connection" in r.detail


CPU_SHIFT = """#include <torch/extension.h>
void ShiftForwardCUDAKernelLauncher(const at::Tensor input, at::Tensor output, const int twice_by) {
  output.copy_(input + twice_by / 2%s);
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("ShiftForwardCUDAKernelLauncher", &ShiftForwardCUDAKernelLauncher);
}
"""


@pytest.mark.slow
def test_generated_test_runs_the_python_reference(refrepo, tmp_path, store):
    cand = candidate(refrepo, KERNEL)
    write_label(refrepo, cand, tmp_path)
    with FakeLLM(load("reference/shift_forward_cuda_kernel")) as server:
        generate_for(cand, refrepo[3], shift_recorded(), tmp_path, llm_for(server, store))
    good, bad = tmp_path / "good.cpp", tmp_path / "bad.cpp"
    good.write_text(CPU_SHIFT % "")
    bad.write_text(CPU_SHIFT % " + 1")
    code, rep = _run_generated(tmp_path, cand, good)
    assert code == 0 and rep["outcome"] == "pass", rep
    assert len(rep["cases"]) == cand.tests.num_cases >= 5
    code, rep = _run_generated(tmp_path, cand, bad)
    assert code != 0 and rep["outcome"] == "mismatch", json.dumps(rep)[:500]
