"""A backward binding the tests never call gets calls made from its forward's recorded calls."""

import shutil
from pathlib import Path
from types import SimpleNamespace

import torch

from miner.discover import discover
from testgen.backward_calls import backward_calls
from testgen.carry import carry_down
from testgen.inputs import RecordedCall, record_repo_calls
from testgen.reference import RepoRefs

FIXTURE = Path(__file__).parent / "fixtures" / "bwdrepo"


def _repo(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo)
    return repo, RepoRefs(discover(repo))


def test_backward_calls_take_the_forward_arguments_its_outputs_and_a_gradient(tmp_path):
    repo, refs = _repo(tmp_path)
    recorded = record_repo_calls(repo, tmp_path / "cache")
    assert "pool_backward" not in recorded  # gradcheck never got past the absent forward
    forward = recorded["pool_forward"]
    assert [(tuple(c.args[0].shape), c.args[1]) for c in forward] == [
        ((3, 8), 2),
        ((4, 10), 3),
        ((2, 33), 4),
    ]
    made = backward_calls("pool_backward", recorded, refs)
    assert [c.function for c in made] == ["pool_backward"] * 3
    for call, fwd in zip(made, forward, strict=True):
        grad_output, x, count, kernel = call.args
        rows, width = fwd.args[0].shape
        out_w = (width - fwd.args[1]) // fwd.args[1] + 1  # what pool_forward_cuda allocates
        assert grad_output.shape == count.shape == (rows, out_w)
        assert grad_output.dtype == torch.float32 and grad_output.abs().sum() > 0  # seeded
        assert torch.equal(x, fwd.args[0]) and kernel == fwd.args[1]
    again = backward_calls("pool_backward", recorded, refs)
    assert all(torch.equal(a.args[0], b.args[0]) for a, b in zip(made, again, strict=True))


def test_backward_calls_say_why_when_the_forward_is_not_called(tmp_path):
    _, refs = _repo(tmp_path)
    why = backward_calls("pool_backward", {"other_op": [RecordedCall("other_op", [1])]}, refs)
    assert why == "no forward of pool_backward is called by the tests"


def test_a_merged_op_chain_is_walked_along_the_calls_the_code_makes(tmp_path):
    """copy_rows is reached from both pool_forward_cuda and pool_backward_cuda, and the op
    chain lists both paths in one: a forward call is carried down the forward's path only."""
    _, refs = _repo(tmp_path)
    chain = ["copy_rows", "pool_forward_cuda", "pool_backward_cuda", "pool_forward"]
    chain += ["pool_backward", "PYBIND11_MODULE"]
    cand = SimpleNamespace(
        wrapper=SimpleNamespace(
            op_map={"chain": chain, "python_name": "pool_forward"},
            functions=["pool_forward_cuda"],
            launcher="copy_rows",
        )
    )
    x = torch.randn(3, 8)
    assert carry_down(RecordedCall("pool_forward", [x, 2]), cand, refs) == [x, 2]


def test_a_forward_whose_output_cannot_be_read_gives_no_backward_calls(tmp_path):
    """`twice_forward` allocates `{rows, Traits::width}` (a constant the interpreter cannot
    read) and ends with `return input;` for other devices: that fallback is no output shape,
    so no calls are made (lietorch's expm: a gradient shaped like the input read past it)."""
    _, refs = _repo(tmp_path)
    recorded = {"twice_forward": [RecordedCall("twice_forward", [torch.randn(5, 3)])]}
    why = backward_calls("twice_backward", recorded, refs)
    assert isinstance(why, str) and "cannot be read" in why


def test_a_call_that_passes_none_for_a_tensor_is_no_case(tmp_path):
    """pytorch_sparse's ptr2ind was recorded with `ptr` None (made from a result the recording
    could not compute): the launcher takes `const at::Tensor &`, so that call is no case."""
    from testgen.cases import base_calls

    _, refs = _repo(tmp_path)
    cand = SimpleNamespace(
        wrapper=SimpleNamespace(
            op_map={"chain": ["pool_forward_cuda", "pool_forward"], "python_name": "pool_forward"},
            functions=["pool_forward_cuda"],
            launcher="pool_forward_cuda",
        )
    )
    good = RecordedCall("pool_forward", [torch.randn(3, 8), 2])
    found, why = base_calls(cand, [RecordedCall("pool_forward", [None, 2]), good], refs)
    assert [b.args[1] for b in found] == [2] and torch.equal(found[0].args[0], good.args[0])
    assert why == ["a recorded call passes None where the launcher takes a tensor"]


BN_BINDINGS = """
#include <torch/extension.h>
template <typename T>
void cpu_bn_updateOutput(at::Tensor &input_features, at::Tensor &output_features,
                         at::Tensor &saveMean, T eps) {
  output_features.resize_as_(input_features);
  saveMean.resize_({input_features.size(1)});
}
void BN_updateOutput(at::Tensor &input_features, at::Tensor &output_features,
                     at::Tensor &saveMean, double eps) {
  cpu_bn_updateOutput<float>(input_features, output_features, saveMean, eps);
}
void BN_updateGradInput(at::Tensor &input_features, at::Tensor &d_input_features,
                        at::Tensor &output_features, at::Tensor &d_output_features,
                        at::Tensor &saveMean) {}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("BN_updateOutput", &BN_updateOutput);
  m.def("BN_updateGradInput", &BN_updateGradInput);
}
"""


def _bn_refs(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "bn.cpp").write_text(BN_BINDINGS)
    (tmp_path / "src" / "bn.cu").write_text("__global__ void k(float* x) { x[0] = 1; }\n")
    return RepoRefs(discover(tmp_path))


def test_a_forward_that_writes_into_its_arguments_hands_them_to_its_backward(tmp_path):
    """SparseConvNet's batch norm: `X_updateOutput` returns nothing, resizes and fills
    `output_features` and writes `saveMean`; `X_updateGradInput` takes both by name. As the
    CPU build left them when the recorder ran the forward (`after`), else shaped by the
    forward's `resize_as_` with seeded values."""
    refs = _bn_refs(tmp_path)
    x, empty, mean = torch.randn(6, 4), torch.empty(0), torch.zeros(4)
    ran = RecordedCall("BN_updateOutput", [x, empty, mean, 1e-4], {}, "t.py")
    ran.after = {1: x * 2, 2: torch.full((4,), 0.5)}
    made = backward_calls("BN_updateGradInput", {"BN_updateOutput": [ran]}, refs)
    inputs, d_input, output, d_output, saved = made[0].args
    assert inputs is x and torch.equal(d_input, torch.zeros(6, 4))  # the gradient's buffer
    assert torch.equal(output, x * 2) and torch.equal(saved, torch.full((4,), 0.5))
    assert d_output.shape == (6, 4) and d_output.abs().sum() > 0  # the output's gradient
    unrun = RecordedCall("BN_updateOutput", [x, empty, mean, 1e-4], {}, "t.py")  # no CPU build
    inputs, _, output, d_output, saved = backward_calls(
        "BN_updateGradInput", {"BN_updateOutput": [unrun]}, refs
    )[0].args
    assert output.shape == d_output.shape == (6, 4) and output.abs().sum() > 0  # resize_as_
    assert saved is mean  # not resized by `resize_as_`: passed as recorded


def test_the_recorder_keeps_what_a_call_wrote_into_its_arguments():
    """A call run on the CPU build that resizes and fills an argument: the log keeps that
    argument as it is after the call, and nothing for the arguments it left alone."""
    from testgen.standalone.record_log import _Log

    log = _Log()
    x, out = torch.randn(3, 2), torch.empty(0)
    index = log.add("f_updateOutput", (x, out, 2.0), {})
    out.resize_as_(x).copy_(x * 2.0)  # what the CPU build does
    log.written(index, (x, out, 2.0))
    log.returned(index, (out, torch.zeros(4, dtype=torch.int32), 2.0))
    function, before, _, after, returned, setup, module, rows_cut = log.calls[index]
    assert function == "f_updateOutput" and before[1].shape == (0,) and setup == []  # no objects
    assert module == ""  # (the recorder names the extension module it went to)
    assert rows_cut == []  # the whole call (record_rows)
    assert list(after) == [1] and torch.equal(after[1], x * 2.0)
    assert returned == [[[3, 2], "float32"], [[4], "int32"]]  # what it returned: shapes only
    assert log.add("f_updateOutput", (x, torch.empty(0), 2.0), {}) is None  # a repeat


def test_a_cpp_autograd_backward_takes_the_shape_the_forward_returned(tmp_path):
    """pytorch_spline_conv's op `spline_basis` runs a C++ autograd Function, whose backward
    calls `spline_basis_bw(grad_basis, pseudo, degree)`: no test reaches it, and the forward's
    output hides behind `SplineBasis::apply`. What the forward returned when the recorder ran
    it on the CPU build (its shape and dtype) shapes the gradient; `_bw` reads as backward."""
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "basis.cpp").write_text(
        "#include <torch/script.h>\n"
        "torch::Tensor spline_basis_fw(torch::Tensor pseudo, int64_t degree);\n"
        "torch::Tensor spline_basis_bw(torch::Tensor grad_basis, torch::Tensor pseudo,\n"
        "                              int64_t degree) { return grad_basis.sum(1); }\n"
        "class SplineBasis : public torch::autograd::Function<SplineBasis> {\n"
        " public:\n"
        "  static variable_list forward(AutogradContext *ctx, Variable pseudo, int64_t degree) {\n"
        "    return {spline_basis_fw(pseudo, degree)};\n  }\n};\n"
        "torch::Tensor spline_basis(torch::Tensor pseudo, int64_t degree) {\n"
        "  auto result = SplineBasis::apply(pseudo, degree);\n  return result[0];\n}\n"
    )
    refs = RepoRefs(discover(tmp_path))
    pseudo = torch.rand(5, 2)
    forward = RecordedCall("spline_basis", [pseudo, 1], returned=[[[5, 4], "float64"]])
    made = backward_calls("spline_basis_bw", {"spline_basis": [forward]}, refs)
    assert not isinstance(made, str), made
    grad_basis, given, degree = made[0].args
    assert grad_basis.shape == (5, 4) and grad_basis.dtype == torch.float64
    assert grad_basis.abs().sum() > 0 and torch.equal(given, pseudo) and degree == 1
    blind = RecordedCall("spline_basis", [pseudo, 1])  # an older recording: no shapes
    assert "cannot be read" in backward_calls("spline_basis_bw", {"spline_basis": [blind]}, refs)
