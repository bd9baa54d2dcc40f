"""An op the tests never call borrows the recorded calls of an op of the same extension that
takes the same parameters, and only when it returns its result."""

from pathlib import Path

import torch

from miner.discover import discover
from testgen.inputs import RecordedCall
from testgen.reference import RepoRefs
from testgen.sibling_calls import sibling_calls

BINDINGS = """
#include <torch/extension.h>
torch::Tensor inv(int group_index, torch::Tensor X) { return X; }
torch::Tensor logm(int group_index, const torch::Tensor& X) { return X; }
torch::Tensor as_matrix(int group_index, torch::Tensor X) { return X; }
torch::Tensor expm(int group_index, torch::Tensor a) { return a; }
torch::Tensor adj(int group_index, torch::Tensor X, torch::Tensor a) { return a; }
torch::Tensor Jinv(int group_index, torch::Tensor X, torch::Tensor a) { return a; }
void part_forward(at::Tensor boxes, at::Tensor pts, at::Tensor out) {}
void all_forward(at::Tensor boxes, at::Tensor pts, at::Tensor out) {}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("inv", &inv); m.def("logm", &logm); m.def("as_matrix", &as_matrix);
  m.def("expm", &expm); m.def("adj", &adj); m.def("Jinv", &Jinv);
  m.def("part_forward", &part_forward); m.def("all_forward", &all_forward);
}
"""


def _refs(tmp_path: Path) -> RepoRefs:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "ops.cpp").write_text(BINDINGS)
    (tmp_path / "src" / "ops_gpu.cu").write_text("__global__ void k(float* x) { x[0] = 1; }\n")
    return RepoRefs(discover(tmp_path))


def _calls(name: str, n: int) -> list[RecordedCall]:
    return [RecordedCall(name, [1, torch.randn(3, 4)], {}, "tests/t.py") for _ in range(n)]


def test_an_op_nobody_calls_takes_the_calls_of_the_op_with_its_parameters(tmp_path):
    refs = _refs(tmp_path)
    recorded = {"inv": _calls("inv", 2), "logm": _calls("logm", 3), "expm": _calls("expm", 5)}
    borrowed = sibling_calls(refs, "as_matrix", recorded)
    assert [c.function for c in borrowed] == ["as_matrix"] * 3  # logm's (most), not expm's (`a`)
    assert borrowed[0].args is recorded["logm"][0].args
    assert "a call of `logm`" in borrowed[0].test_file
    recorded["adj"] = [RecordedCall("adj", [2, torch.randn(5, 4), torch.randn(5, 3)], {}, "t.py")]
    assert [c.args[1].shape for c in sibling_calls(refs, "Jinv", recorded)] == [(5, 4)]
    assert sibling_calls(refs, "expm", {"inv": _calls("inv", 2)}) == []  # `a` is not `X`


def test_an_op_that_writes_into_a_passed_tensor_borrows_nothing(tmp_path):
    """points_in_boxes part and all take the same names, with outputs of different shapes."""
    refs = _refs(tmp_path)
    boxes = [RecordedCall("all_forward", [torch.ones(1, 2, 7), torch.ones(1, 5, 3), None], {})]
    assert sibling_calls(refs, "part_forward", {"all_forward": boxes}) == []
