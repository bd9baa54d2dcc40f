"""Inputs for kernels the repository's tests never call: by rule for element-wise rule wrappers,
by a model (against the loopback replay server) for the rest, checked in the sandbox."""

from __future__ import annotations

import json

import pytest
import torch
from llm_server import FakeLLM, load
from test_llm_reference import llm_for
from test_reference import REFREPO, candidate
from test_testgen import CPU_AFFINE, _run_generated, write_label

from miner.candidate import Reason, StageName, StageResult, Status
from miner.store import Store
from testgen.generate import generate_for
from testgen.llm_inputs import param_kind, run_calls
from testgen.made_inputs import RULE_SIZES, exposed_params, rule_calls
from testgen.standalone.callcheck import MAX_ELEMENTS
from wrappers.rule import rule_wrapper
from wrappers.wrap_stage import rule_label

KERNEL = "affine_forward_cuda_kernel"
SPEC = [{"name": "x", "kind": "tensor"}, {"name": "n", "kind": "int"}]


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "work")
    yield s
    s.close()


@pytest.mark.parametrize(
    "cpp, kind",
    [
        ("const at::Tensor&", "tensor"),
        ("Tensor", "tensor"),
        ("c10::optional<at::Tensor>", "tensor?"),
        ("const int", "int"),
        ("int64_t", "int"),
        ("unsigned int", "int"),
        ("const float", "float"),
        ("double", "float"),
        ("bool", "bool"),
        ("std::vector<int64_t>", "ints"),
        ("at::IntArrayRef", "ints"),
        ("std::vector<float>", "floats"),
        ("std::string", "str"),
        ("py::object", "any"),
    ],
)
def test_parameter_kinds(cpp, kind):
    assert param_kind(cpp) == kind


def rule_candidate(refrepo, workdir):
    """The affine kernel as the wrap stage leaves it when no launcher is mined: a rule label."""
    cand = candidate(refrepo, KERNEL)
    cand.wrapper.strategy, cand.wrapper.launcher, cand.wrapper.chain = "rule", "", []
    cand.wrapper.op_map = {}
    rule = rule_wrapper(cand)
    assert rule is not None
    cand.wrapper.functions = [f.name for f in rule.functions]
    source = (REFREPO / cand.kernel.file).read_text()
    cand.provenance.license = "MIT"
    label = rule_label(cand, rule, "#include <torch/extension.h>\n\n" + source)
    (workdir / "labels").mkdir(exist_ok=True)
    (workdir / "labels" / f"{cand.id}.cu").write_text(label.text)
    cand.wrapper.label_path, cand.wrapper.label_hash = f"labels/{cand.id}.cu", label.hash
    cand.set_stage(StageName.BUILD, StageResult(status=Status.OK))
    return cand, label.text


def test_rule_wrapper_signature_comes_from_the_label_and_gets_rule_calls(refrepo, tmp_path):
    cand, label = rule_candidate(refrepo, tmp_path)
    sig = exposed_params(refrepo[3], KERNEL, label)
    assert sig == [
        ("at::Tensor", "input"),
        ("at::Tensor", "output"),
        ("double", "alpha"),
        ("double", "beta"),
    ]
    calls = rule_calls(cand, sig)
    assert [b.args[0].numel() for b in calls] == list(RULE_SIZES)
    for b in calls:
        x, out, alpha, beta = b.args
        assert x.dtype == out.dtype == torch.float32 and x.shape == out.shape
        assert (alpha, beta) == (1.25, -0.5) and not x.equal(out)
    again = rule_calls(cand, sig)
    assert all(a.args[0].equal(b.args[0]) for a, b in zip(calls, again, strict=True))
    cand.wrapper.strategy = "mined"  # a mined launcher's shapes are no rule's to guess
    assert rule_calls(cand, sig) == []


def test_the_call_check_refuses_what_cannot_be_test_inputs():
    good = "import torch\ndef make_calls():\n    return [[torch.ones(n), n] for n in (1, 5, 9)]\n"
    calls = run_calls(good, SPEC)
    assert isinstance(calls, list) and [c[1] for c in calls] == [1, 5, 9]
    assert calls[2][0].equal(torch.ones(9))
    bad = {
        "return [[torch.ones(5), 5]] * 3": "at least 3 different shapes",
        "return [[torch.ones(1), 1]]": "at least 3 calls",
        "return [[torch.ones(n), float(n)] for n in (1, 2, 3)]": "`n` must be a int",
        "return [[torch.ones(n)] for n in (1, 2, 3)]": "must be a list of 2 arguments (x, n)",
        "return [[torch.rand(n), n] for n in (1, 2, 3)]": "seed every random draw",
        f"return [[torch.ones({MAX_ELEMENTS + 1}), n] for n in (1, 2, 3)]": "at most",
        "return [[torch.ones(n, 2).t(), n] for n in (1, 2, 3)]": "contiguous",
        "raise ValueError('no')": "`make_calls` raised",
    }
    for body, problem in bad.items():
        got = run_calls(f"import torch\ndef make_calls():\n    {body}\n", SPEC)
        assert isinstance(got, str) and problem in got, (body, got)


def test_model_writes_inputs_for_an_op_no_test_calls(refrepo, tmp_path, store, monkeypatch):
    monkeypatch.setenv("KMINER_PROBE", "off")  # the model's turn comes after the probe's
    cand = candidate(refrepo, KERNEL)
    write_label(refrepo, cand, tmp_path)
    with FakeLLM(load("inputs/affine_forward_cuda_kernel")) as server:
        generate_for(cand, refrepo[3], {}, tmp_path, llm_for(server, store))
        first = server.chat_requests("[kminer:inputs]")
        fixes = server.chat_requests("[kminer:inputs-fix]")
        assert server.chat_requests("[kminer:reference]") == []  # the repository has one
    r = cand.stage(StageName.TESTGEN)
    assert r.status == Status.OK, r.detail
    assert r.metrics["cases_source"] == cand.tests.cases_source == "llm"
    assert r.metrics["reference_kind"] == "cpp" and r.metrics["num_shapes"] >= 3
    prompt = first[0]["last_user"]
    assert "`n`: const int (int)" in prompt and "`out`: Tensor (tensor)" in prompt
    assert "affine_forward_cpu" in prompt  # the C++ reference the test will compare with
    assert "at least 3 different shapes" in fixes[0]["last_user"] and len(fixes) == 1
    rows = [a for a in store.attempts(cand.id) if a["step"] == "inputs"]
    assert [(a["attempt"], a["passed"]) for a in rows] == [(1, False), (2, True)]
    text = (tmp_path / cand.tests.path).read_text()
    assert "inputs were made by `make_calls`, written by fake-model" in text
    assert "generated_1: generated call 1 from make_calls by fake-model, tensors [[1], [1]]" in text
    with FakeLLM(load("inputs/affine_forward_cuda_kernel")) as server:  # a rerun asks nothing
        generate_for(cand, refrepo[3], {}, tmp_path, llm_for(server, store))
        assert server.chat_requests() == []
    assert len(store.attempts(cand.id)) == 2 and cand.tests.cases_source == "llm"


def test_without_a_model_an_op_no_test_calls_says_why(refrepo, tmp_path, monkeypatch):
    monkeypatch.setenv("KMINER_PROBE", "off")
    cand = candidate(refrepo, KERNEL)
    write_label(refrepo, cand, tmp_path)
    generate_for(cand, refrepo[3], {}, tmp_path)
    r = cand.stage(StageName.TESTGEN)
    assert (r.status, r.reason) == (Status.SKIPPED, Reason.NO_CASES)
    assert "never call affine_forward" in r.detail and "no LLM is set" in r.detail
    assert "KMINER_PROBE=off" in r.detail
    assert r.metrics["llm_inputs_tried"] is False


def test_rule_inputs_and_a_model_reference_make_a_test(refrepo, tmp_path, store):
    cand, _ = rule_candidate(refrepo, tmp_path)
    with FakeLLM(load("reference/affine_forward_cuda_kernel.rule")) as server:
        generate_for(cand, refrepo[3], {}, tmp_path, llm_for(server, store))
        asked = server.chat_requests("[kminer:reference]")
        assert server.chat_requests("[kminer:inputs]") == []  # the rule made them
    r = cand.stage(StageName.TESTGEN)
    assert r.status == Status.OK, r.detail
    assert (r.metrics["cases_source"], r.metrics["reference_kind"]) == ("rule", "llm")
    assert "tensor of shape [1000], float32" in asked[0]["last_user"]
    assert r.metrics["num_cases"] >= 5 and r.metrics["num_shapes"] >= 3
    text = (tmp_path / cand.tests.path).read_text()
    assert "made by kminer's element-wise rule" in text and 'FUNCTION = "' + KERNEL in text


CPU_RULE_AFFINE = """#include <torch/extension.h>
std::vector<at::Tensor> affine(at::Tensor input, at::Tensor output, double alpha, double beta) {
  output.copy_(input * alpha + beta%s);
  return {output};
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("affine_forward_cuda_kernel", &affine); }
"""


@pytest.mark.slow
def test_generated_inputs_tests_pass_the_right_code_and_fail_a_wrong_one(
    refrepo, tmp_path, store, monkeypatch
):
    """Both ways of making inputs, run by the generated test on CPU implementations. The
    probe (which would come before the model) is off: the model's inputs are under test."""
    monkeypatch.setenv("KMINER_PROBE", "off")
    rule_dir, llm_dir = tmp_path / "rule", tmp_path / "llm"
    rule_dir.mkdir(), llm_dir.mkdir()
    cand, _ = rule_candidate(refrepo, rule_dir)
    with FakeLLM(load("reference/affine_forward_cuda_kernel.rule")) as server:
        generate_for(cand, refrepo[3], {}, rule_dir, llm_for(server, store))
    mined = candidate(refrepo, KERNEL)
    write_label(refrepo, mined, llm_dir)
    with FakeLLM(load("inputs/affine_forward_cuda_kernel")) as server:
        generate_for(mined, refrepo[3], {}, llm_dir, llm_for(server, store))
    for c, folder, source in ((cand, rule_dir, CPU_RULE_AFFINE), (mined, llm_dir, CPU_AFFINE)):
        good, bad = folder / "good.cpp", folder / "bad.cpp"
        good.write_text(source % "")
        bad.write_text(source % (" * 1.001" if c is cand else " * 1.001f"))
        code, rep = _run_generated(folder, c, good)
        assert code == 0 and rep["outcome"] == "pass", json.dumps(rep)[:500]
        assert len(rep["cases"]) == c.tests.num_cases >= 5
        code, rep = _run_generated(folder, c, bad)
        assert code != 0 and rep["outcome"] == "mismatch", json.dumps(rep)[:500]
