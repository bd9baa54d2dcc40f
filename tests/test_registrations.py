"""An op's CPU and CUDA functions linked by their registrations with PyTorch's dispatcher
(miner.registrations), as pyg-lib, torchvision and torchaudio register theirs: the CPU
function is the reference whatever its name, and a test's `torch.ops.<ns>.<op>` call is a call
of the CUDA function."""

from __future__ import annotations

import torch
from conftest import write_tree
from test_reference import repo_candidates

from miner.registrations import registrations
from miner.textprep import blank_comments_and_strings
from testgen.carry import bound_function, carry_down, defined_name
from testgen.inputs import RecordedCall
from testgen.reference import locate

CPU = """#include <ATen/ATen.h>
#include <torch/library.h>

namespace pkg {
namespace {
// the CPU side has the CUDA side's name, as pyg-lib's scatter_sum_kernel does
at::Tensor scale_kernel(const at::Tensor& x, double alpha) { return x * alpha; }
at::Tensor shift_impl(const at::Tensor& x, double beta) { return x + beta; }
}  // namespace

TORCH_LIBRARY_IMPL(pkg, CPU, m) {
  m.impl(TORCH_SELECTIVE_NAME("pkg::scale"), TORCH_FN(scale_kernel));
  m.impl("shift", &shift_impl);
  // m.impl("old_scale", TORCH_FN(scale_kernel));  a registration commented out is none
}
}  // namespace pkg
"""

CUDA = """#include <ATen/ATen.h>
#include <torch/library.h>

namespace pkg {
namespace {
__global__ void scale_cuda_kernel(const float* x, float* out, float alpha, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] * alpha;
}
at::Tensor scale_kernel(const at::Tensor& x, double alpha) {
  auto out = at::empty_like(x);
  int n = x.numel();
  scale_cuda_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(),
                                              alpha, n);
  return out;
}
}  // namespace

TORCH_LIBRARY_IMPL(pkg, CUDA, m) {
  m.impl(TORCH_SELECTIVE_NAME("pkg::scale"), TORCH_FN(scale_kernel));
}
}  // namespace pkg
"""

FRONT = """#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace pkg {
// the C++ API: it only asks the dispatcher, which runs the function of the tensors' device
at::Tensor scale(const at::Tensor& x, double alpha) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pkg::scale", "")
                       .typed<decltype(scale)>();
  return op.call(x, alpha);
}
TORCH_LIBRARY_FRAGMENT(pkg, m) {
  m.def(TORCH_SELECTIVE_SCHEMA("pkg::scale(Tensor x, float alpha) -> Tensor"));
}
}  // namespace pkg
"""


def test_registrations_per_device_are_read():
    text = CPU + CUDA
    found = registrations(blank_comments_and_strings(text), text)
    assert found == [
        ("pkg::scale", "CPU", "scale_kernel"),
        ("pkg::shift", "CPU", "shift_impl"),
        ("pkg::scale", "CUDA", "scale_kernel"),
    ]
    mmcv = "REGISTER_DEVICE_IMPL(nms_impl, CUDA, nms_cuda);"
    assert registrations(mmcv, mmcv) == [("nms_impl", "CUDA", "nms_cuda")]


def test_an_op_registered_per_device_has_its_cpu_function_as_reference(tmp_path):
    """Before, neither side's name said the other (no `_cpu`/`_cuda` pair, or both the same
    name) and no C++ calls both: pyg-lib's 46 kernels got no reference (44 now, measured on
    pyg-lib 764e3a49). A test's `torch.ops.pkg.scale(x, 2.0)` reaches the CUDA function, never
    the C++ `scale` that only calls the dispatcher."""
    repo = write_tree(
        tmp_path / "repo",
        {"csrc/cpu/scale.cpp": CPU, "csrc/cuda/scale.cu": CUDA, "csrc/scale.cpp": FRONT},
    )
    (cand,), refs = repo_candidates(repo, "scale_cuda_kernel")
    assert cand.wrapper.functions == ["scale_kernel"]
    # the wrap stage's op map reads the same registrations: the CPU side of one name is the
    # definition beside its CPU registration, not the CUDA file's
    om = cand.wrapper.op_map
    assert (om["dispatch_key"], om["device_fn"], om["registered_in"]) == (
        "pkg::scale",
        "scale_kernel",
        "csrc/cuda/scale.cu",
    )
    assert (om["cpu_fn"], om["cpu_file"]) == ("scale_kernel", "csrc/cpu/scale.cpp")
    loc = locate(cand, refs)
    assert not isinstance(loc, str), loc
    assert (loc.mechanism, loc.cpu.file, loc.args) == (
        "registry",
        "csrc/cpu/scale.cpp",
        ["x", "alpha"],
    )
    assert refs.registry[("pkg::scale", "CPU")] == "scale_kernel"
    assert bound_function(refs, "scale") == "scale_kernel"
    assert defined_name(refs, "scale") == "scale_kernel"  # not the dispatcher's front
    x = torch.ones(4)
    args = carry_down(RecordedCall("scale", [x, 2.0], {}, "test/test_scale.py"), cand, refs)
    assert args[0] is x and args[1] == 2.0
