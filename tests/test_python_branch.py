"""A CPU binding the repository's Python calls where it calls the CUDA one (testgen.python_branch),
and what comes with repositories built that way (torch-points-kernels): the tests' calls of the
CPU binding as calls of the CUDA one, a test package's own helpers, a compat macro spelled as a
member name."""

from __future__ import annotations

import torch
from conftest import write_tree
from test_reference import repo_candidates

from miner.discover import discover
from miner.filemodel import refs_in
from testgen.carry import pybind_arg_names
from testgen.inputs import RecordedCall, record_repo_calls
from testgen.python_branch import branch_twins, cuda_calls
from testgen.reference import RepoRefs, locate

OPS = """import torch
import pkg.points_cuda as gpu
import pkg.points_cpu as cpu
from pkg.helpers import knn


def interpolate(features, idx, weight):
    if features.is_cuda:
        out = gpu.interpolate(features.contiguous(), idx, weight)
    else:
        out = cpu.knn_interpolate(features.contiguous(), idx, weight)
    return out


def query(radius, n, x, y, sort=False):
    if x.is_cuda:
        if sort:
            raise NotImplementedError("the GPU does not sort")
        ind, dist = gpu.query(x, y, radius, n)
    else:
        ind, dist = cpu.radius_query(x, y, radius, n, mode=0, sorted=sort)
    return ind, dist


def nearest(unknown, known):
    if unknown.device.type == "cuda":
        return gpu.nearest(unknown, known)
    return knn(known, unknown, 3)  # a Python function, no binding: no twin


def scale(x, alpha, beta):
    if x.is_cuda:
        return gpu.scale(x, alpha, beta)
    else:
        return cpu.scale_cpu(x, alpha)  # beta: the CPU side ignores it


def sample(points, n):
    if points.is_cuda:
        return gpu.sample(points, n)
    else:
        return cpu.sample_cpu(points, n, True)  # a random first point on the CPU side only


def count(x, k):
    if not x.is_cuda:
        return cpu.count_cpu(x, x.shape[0])  # an argument the CUDA call never had
    else:
        return gpu.count(x, k)
"""

CUDA = """#include <torch/extension.h>
__global__ void interpolate_kernel(const float* f, const int* idx, const float* w, float* out,
                                   int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = f[idx[i]] * w[i];
}
at::Tensor interpolate(at::Tensor features, at::Tensor idx, at::Tensor weight) {
  auto out = torch::zeros_like(weight);
  int n = weight.numel();
  interpolate_kernel<<<(n + 255) / 256, 256>>>(features.data_ptr<float>(), idx.data_ptr<int>(),
      weight.data_ptr<float>(), out.data_ptr<float>(), n);
  return out;
}
__global__ void query_kernel(const float* x, const float* y, float radius, int n, long* ind,
                             int m) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < m) ind[i] = (x[i] - y[i]) < radius ? n : -1;
}
std::pair<at::Tensor, at::Tensor> query(at::Tensor x, at::Tensor y, float radius, int n) {
  auto ind = torch::zeros({x.size(0)}, x.options().dtype(torch::kLong));
  int m = x.size(0);
  query_kernel<<<(m + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), radius, n,
      ind.data_ptr<long>(), m);
  return {ind, x};
}
__global__ void sample_kernel(const float* points, int n, long* out) {
  if (threadIdx.x < n) out[threadIdx.x] = threadIdx.x;
}
at::Tensor sample(at::Tensor points, int n) {
  auto out = torch::zeros({n}, points.options().dtype(torch::kLong));
  sample_kernel<<<1, 256>>>(points.data_ptr<float>(), n, out.data_ptr<long>());
  return out;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("interpolate", &interpolate);
  m.def("query", &query);
  m.def("sample", &sample);
}
"""

CPU = """#include <torch/extension.h>
using namespace pybind11::literals;
at::Tensor knn_interpolate(at::Tensor features, at::Tensor idx, at::Tensor weight) {
  return features.index_select(0, idx.to(torch::kLong)) * weight;
}
std::pair<at::Tensor, at::Tensor> radius_query(at::Tensor x, at::Tensor y, float radius,
                                               int max_num, int mode, bool sorted) {
  auto ind = torch::where((x - y) < radius, torch::full_like(x, max_num), torch::full_like(x, -1));
  return {ind.to(torch::kLong), x};
}
at::Tensor sample_cpu(at::Tensor points, int n, bool random) {
  auto first = random ? at::randperm(points.size(0)).item<long>() : 0;
  return torch::arange(first, first + n);
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("knn_interpolate", &knn_interpolate, "", "features"_a, "idx"_a, "weight"_a);
  m.def("sample_cpu", &sample_cpu, "", "points"_a, "n"_a, "random"_a);
  m.def("radius_query", &radius_query, "ball query (-1 pads)", "support"_a, "query"_a,
        "radius"_a, "max_num"_a = -1, "mode"_a = 0, "sorted"_a = false);
}
"""


def _repo(tmp_path):
    return write_tree(
        tmp_path / "repo",
        {
            "pkg/__init__.py": "",
            "pkg/helpers.py": "def knn(a, b, k):\n    return a, b\n",
            "pkg/ops.py": OPS,
            "csrc/cuda/points.cu": CUDA,
            "csrc/cpu/points.cpp": CPU,
        },
    )


def test_the_other_branch_of_a_python_device_test_is_the_cuda_bindings_cpu_side(tmp_path):
    """torch-points-kernels picks `tpcuda.three_interpolate` or `tpcpu.knn_interpolate` by
    `features.is_cuda`: the CPU binding is the reference whatever its name, its arguments read
    from the CUDA call's (the same expression, a literal, or the enclosing function's default
    that the CUDA branch cannot have changed), keywords placed by the binding's `"name"_a`."""
    repo = _repo(tmp_path)
    twins = {n: branch_twins(repo, n) for n in ("interpolate", "query", "nearest", "count")}
    assert [t.cpu_binding for t in twins["interpolate"]] == ["knn_interpolate"]
    (query,) = twins["query"]
    assert query.args == (("arg", 0), ("arg", 1), ("arg", 2), ("arg", 3))
    assert query.keywords == (("mode", ("const", 0)), ("sorted", ("const", False)))
    assert twins["nearest"] == [] and twins["count"] == []

    kernels = ("interpolate_kernel", "query_kernel", "sample_kernel")
    cands, refs = repo_candidates(repo, *kernels)
    found = {}
    for kernel, cand in zip(kernels, cands, strict=True):
        loc = locate(cand, refs)
        assert not isinstance(loc, str), loc
        found[kernel] = (loc.mechanism, loc.cpu.names[0], loc.args)
    assert found["interpolate_kernel"] == (
        "python branch",
        "knn_interpolate",
        ["features", "idx", "weight"],
    )
    assert found["query_kernel"] == (
        "python branch",
        "radius_query",
        ["x", "y", "radius", "n", "0", "false"],
    )
    # the CPU side's random first point is switched off: the CUDA op takes no such flag
    (sample,) = branch_twins(repo, "sample")
    assert sample.args == (("arg", 0), ("arg", 1), ("const", True))
    assert found["sample_kernel"] == ("python branch", "sample_cpu", ["points", "n", "false"])


def test_the_tests_calls_of_the_cpu_binding_are_calls_of_the_cuda_one(tmp_path):
    """The recorder runs the tests on CPU tensors, so the Python takes its CPU branch and only
    `radius_query(x, y, radius, n, mode=0, sorted=...)` is seen: each becomes `query(x, y,
    radius, n)`, but a call in a mode the CUDA branch never takes (`sorted=True`)."""
    repo = _repo(tmp_path)
    refs = RepoRefs(discover(repo))
    assert pybind_arg_names(refs, "radius_query") == [
        "support",
        "query",
        "radius",
        "max_num",
        "mode",
        "sorted",
    ]
    x, y = torch.arange(4.0), torch.ones(4)
    recorded = {
        "radius_query": [
            RecordedCall("radius_query", [x, y, 0.5, 3], {"mode": 0, "sorted": False}, "t.py"),
            RecordedCall("radius_query", [x, y, 0.5, 3], {"mode": 0, "sorted": True}, "t.py"),
            RecordedCall("radius_query", [x, y, 2.0, 5, 0, False], {}, "t.py"),
        ]
    }
    made = cuda_calls(refs, "query", recorded)
    assert [(c.function, c.args[2:], c.test_file) for c in made] == [
        ("query", [0.5, 3], "t.py"),
        ("query", [2.0, 5], "t.py"),
    ]
    assert all(c.args[0] is x and c.args[1] is y for c in made)
    assert cuda_calls(refs, "nearest", recorded) == []
    # a CUDA argument the CPU call never receives cannot be read back from its calls
    assert [t.cpu_binding for t in branch_twins(repo, "scale")] == ["scale_cpu"]
    scaled = {"scale_cpu": [RecordedCall("scale_cpu", [x, 2.0], {}, "t.py")]}
    assert cuda_calls(refs, "scale", scaled) == []


def test_a_test_packages_own_helpers_load_from_source(tmp_path):
    """torch-points-kernels' tests do `from test import run_if_cuda`, a decorator in
    `test/__init__.py`: the recorder took the test folder for the library's package and gave
    a recorder in its place, so every test failed at collection and nothing was recorded."""
    repo = write_tree(
        tmp_path / "repo",
        {
            "pkg/__init__.py": "",
            "pkg/ops.py": "from pkg import _ext\n\ndef scale(x):\n    return _ext.scale(x, 2.0)\n",
            "test/__init__.py": (
                "def run_always(func):\n"
                "    def wrapped(*args, **kwargs):\n"
                "        return func(*args, **kwargs)\n"
                "    return wrapped\n"
            ),
            "test/test_scale.py": (
                "import torch\nfrom test import run_always\nfrom pkg.ops import scale\n\n\n"
                "@run_always\ndef test_scale():\n    scale(torch.ones(3))\n"
            ),
        },
    )
    calls = record_repo_calls(repo, tmp_path / "cache")
    assert [(c.args[0].tolist(), c.args[1]) for c in calls["scale"]] == [([1.0] * 3, 2.0)]


def test_a_macro_spelled_as_a_member_name_is_a_dependency():
    """torch-points-kernels writes `x.DATA_PTR<float>()` with `#define DATA_PTR data_ptr` in a
    compat header: the member's name is a macro the preprocessor expands, so the closure must
    carry its definition (7 of its 13 labels failed without it). Members spelled as ordinary
    names are not dependencies (`x.size()` never pulls in a function `size`)."""
    code = "auto p = x.DATA_PTR<float>(); auto q = y->HALF_PTR; int n = x.size(0); z.N;"
    found = refs_in(code, 0, len(code))
    assert {"DATA_PTR", "HALF_PTR"} <= found
    assert not {"size", "N"} & found


SAME_NAMES = {
    "pkg/__init__.py": "",
    "pkg/ops.py": "from pkg import cpu, gpu\n\n\n"
    "def scale(x, alpha):\n"
    "    if x.is_cuda:\n        return gpu.scale(x, alpha)\n"
    "    else:\n        return cpu.scale(x, alpha)\n\n\n"
    "def shift(x, mean, eps):\n"
    "    if x.is_cuda:\n        return gpu.shift(x, mean, eps)\n"
    "    else:\n        return cpu.shift(x, mean, eps)  # the CPU side takes no eps: broken\n",
    "pkg/lib/gpu/ops.cu": """#include <torch/extension.h>
__global__ void scale_kernel(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
__global__ void shift_kernel(float* x, const float* m, float eps, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] -= m[i] + eps;
}
at::Tensor scale_gpu(at::Tensor x, double alpha) {
  auto y = x.clone();
  int n = y.numel();
  scale_kernel<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), alpha, n);
  return y;
}
at::Tensor shift_gpu(at::Tensor x, at::Tensor mean, double eps) {
  auto y = x.clone();
  int n = y.numel();
  shift_kernel<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), mean.data_ptr<float>(), eps, n);
  return y;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scale", &scale_gpu);
  m.def("shift", &shift_gpu);
}
""",
    "pkg/lib/cpu/ops.cpp": """#include <torch/extension.h>
at::Tensor times(at::Tensor x, double alpha) { return x * alpha; }
at::Tensor minus(at::Tensor x, at::Tensor mean) { return x - mean; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scale", &times);
  m.def("shift", &minus);
}
""",
}


def test_a_binding_name_both_modules_define_is_the_cpu_modules_on_the_cpu_side(tmp_path):
    """PyTorch-Encoding builds `encoding.cpu` and `encoding.gpu`, each binding
    `batchnorm_forward`: `cpu.batchnorm_forward` was read as the GPU module's function, and
    BatchNorm_Forward_CUDA became its own reference (a CPU build of it cannot run a kernel).
    The CPU side is the function the CPU module binds; where that one cannot take the call
    (its CPU function takes no `eps`) there is no reference, never the CUDA function."""
    repo = write_tree(tmp_path / "repo", SAME_NAMES)
    cands, refs = repo_candidates(repo, "scale_kernel", "shift_kernel")
    scale = locate(cands[0], refs)
    assert not isinstance(scale, str), scale
    assert (scale.mechanism, scale.cpu.names[0]) == ("python branch", "times")
    shift = locate(cands[1], refs)
    assert isinstance(shift, str) and "shift_gpu" not in shift.split("no test")[0], shift


GPU_NAMED = {
    "pkg/__init__.py": "",
    "pkg/ops.py": "from pkg import scale_cpu, scale_gpu\n\n\n"
    "def scale(x, alpha):\n"
    "    if x.is_cuda:\n        return scale_gpu.forward(x, alpha)\n"
    "    else:\n        return scale_cpu.forward(x, alpha)\n",
    "pkg/src/cuda/scale_kernel.cu": """#include <cuda_runtime.h>
__global__ void scale_kernel(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
void ScaleLauncher(float* x, float a, int n, cudaStream_t stream) {
  scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, a, n);
}
""",
    "pkg/src/scale_gpu.cpp": """#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
void ScaleLauncher(float* x, float a, int n, cudaStream_t stream);
at::Tensor scale_gpu_forward(at::Tensor x, double alpha) {
  auto y = x.clone();
  ScaleLauncher(y.data_ptr<float>(), alpha, y.numel(), at::cuda::getCurrentCUDAStream());
  return y;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &scale_gpu_forward); }
""",
    "pkg/src/scale.cpp": """#include <torch/extension.h>
at::Tensor scale_forward(at::Tensor x, double alpha) { return x * alpha; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &scale_forward); }
""",
}


def test_a_binding_name_both_modules_define_is_told_apart_by_a_gpu_word(tmp_path):
    """longcw/RoIAlign.pytorch binds `forward` in crop_and_resize_gpu.cpp (to
    crop_and_resize_gpu_forward) and in crop_and_resize.cpp (to crop_and_resize_forward), no
    file under a cuda/ folder: the `_gpu` in the file's and the function's names tells the
    CUDA side, and the CPU module's function is the reference (there was none before)."""
    repo = write_tree(tmp_path / "repo", GPU_NAMED)
    cands, refs = repo_candidates(repo, "scale_kernel")
    found = locate(cands[0], refs)
    assert not isinstance(found, str), found
    assert (found.mechanism, found.cpu.names[0]) == ("python branch", "scale_forward")
