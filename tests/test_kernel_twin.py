"""A kernel bound alone where a CPU function of its very parameters is its twin
(wrappers.kernel_twin) and the reference that calls the twin (testgen.reference)."""

from __future__ import annotations

import pytest
from conftest import kernel

from miner.candidate import Provenance, Reference
from miner.discover import discover
from miner.repo_model import to_candidate
from testgen.reference import RepoRefs, find_reference
from wrappers.kernel_twin import find_twin, has_twin, kernel_adapter, launch_config, twin_names
from wrappers.mined import LauncherIndex, mine_wrapper
from wrappers.opmap import functions_by_name

KERNEL = """#include <torch/extension.h>
template <typename scalar_t>
__global__ void gather_kernel(const int n_k, const int n_in, const int c, scalar_t *in_feat,
                              scalar_t *out_feat, const int *kmap, const bool transpose) {
  int index = blockIdx.x * blockDim.x + threadIdx.x;
  int i = index / c, j = index % c;
  if (i >= n_k) return;
  int in_pos = kmap[2 * i + transpose];
  if (in_pos < 0) return;
  out_feat[i * c + j] = in_feat[in_pos * c + j];
}
"""
LAUNCHER = """
at::Tensor conv_fallback_cuda(at::Tensor in_feat, at::Tensor kmap, int n_active, int off) {
  const int n_in = in_feat.size(0), channels = in_feat.size(1);
  at::Tensor buffer = torch::zeros({n_active, channels}, in_feat.options());
  AT_DISPATCH_FLOATING_TYPES(in_feat.scalar_type(), "gather", ([&] {
    gather_kernel<scalar_t>
        <<<ceil((double)(n_active * channels) / 256), 256>>>(
            n_active, n_in, channels, in_feat.data_ptr<scalar_t>(),
            buffer.data_ptr<scalar_t>(), kmap.data_ptr<int>() + off, false);
  }));
  return buffer;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("conv_fallback", &conv_fallback_cuda); }
"""
TWIN = """#include <torch/extension.h>
void gather_cpu(const int n_k, const int n_in, const int c, const float *in_feat,
                float *out_feat, const int *kmap, const bool transpose) {
  for (int i = 0; i < n_k; i++) {
    int in_pos = kmap[2 * i + transpose];
    if (in_pos < 0) continue;
    for (int j = 0; j < c; j++) out_feat[i * c + j] = in_feat[in_pos * c + j];
  }
}
"""


def test_twin_names():
    assert "gather_cpu" in twin_names("gather_kernel")
    assert "im2col_cpu_kernel" in twin_names("im2col_gpu_kernel")
    assert "roi_pool_forward_cpu" in twin_names("roi_pool_forward_cuda_kernel")
    assert twin_names("gather") == []


def test_the_launch_is_read_back_to_the_kernels_parameters(tmp_path):
    """The grid of the repository's launch over the arguments the call passes as they are;
    the code's own macros stay, a name the launcher computes is no launch of the kernel's."""
    (tmp_path / "g.cu").write_text(KERNEL + LAUNCHER)
    k = to_candidate(kernel(discover(tmp_path), "gather_kernel"), discover(tmp_path), _prov())
    config = launch_config(k.kernel, LAUNCHER, KERNEL)
    assert config == "ceil((double)(n_k * c) / 256), 256, 0, at::cuda::getCurrentCUDAStream()"
    macro = LAUNCHER.replace(", 256>>>", ", THREADS>>>")
    assert launch_config(k.kernel, macro, KERNEL) is None  # THREADS is nobody's
    assert launch_config(k.kernel, macro, "#define THREADS 128\n" + KERNEL).startswith(
        "ceil((double)(n_k * c) / 256), THREADS, 0,"
    )
    computed = LAUNCHER.replace("ceil((double)(n_active * channels) / 256)", "blocks")
    assert launch_config(k.kernel, computed, KERNEL) is None


def _prov() -> Provenance:
    return Provenance(repo_url="https://x/twinrepo", commit="a" * 40)


def _repo(tmp_path, op_twin: bool):
    repo = tmp_path / "repo"
    (repo / "csrc" / "cuda").mkdir(parents=True)
    (repo / "csrc" / "cpu").mkdir(parents=True)
    (repo / "csrc" / "cuda" / "conv_cuda.cu").write_text(KERNEL + LAUNCHER)
    twin = TWIN
    if op_twin:  # the op's own CPU function
        twin += (
            "at::Tensor conv_fallback_cpu(at::Tensor in_feat, at::Tensor kmap) { return kmap; }\n"
        )
    (repo / "csrc" / "cpu" / "gather_cpu.cpp").write_text(twin)
    return repo


@pytest.mark.parametrize("op_twin", [False, True])
def test_the_kernel_is_bound_alone_only_where_its_op_has_no_twin(tmp_path, op_twin):
    from miner.extract import Extractor

    repo = _repo(tmp_path, op_twin)
    disc = discover(repo)
    index, functions = LauncherIndex(disc), functions_by_name(disc)
    fk = kernel(disc, "gather_kernel")
    cand = to_candidate(fk, disc, _prov())
    mined = mine_wrapper(fk, Extractor(disc), index)
    assert mined.chain == ["conv_fallback_cuda"]
    assert has_twin(mined.chain, functions) is op_twin
    twin = find_twin(cand.kernel, index, functions)
    assert twin is not None and twin.file == "csrc/cpu/gather_cpu.cpp"
    sig, text = kernel_adapter(cand.kernel, fk, index, KERNEL, ("float", "double"))
    assert sig.name == "kminer_gather_kernel"
    assert [n for _, n in sig.params] == [p.name for p in cand.kernel.params]
    assert (
        "gather_kernel<scalar_t><<<ceil((double)(n_k * c) / 256), 256, 0, "
        "at::cuda::getCurrentCUDAStream()>>>(static_cast<int>(n_k)" in text
    )
    assert text.count("C10_CUDA_KERNEL_LAUNCH_CHECK();") == 2  # float and double


@pytest.mark.slow
def test_the_kernels_twin_is_its_reference_on_the_cpu(tmp_path):
    """The label exposes the adapter over the kernel: the twin, through an adapter of its own,
    computes what one launch computes; a double tensor its `float *` cannot take is refused."""
    import torch
    from torch.utils.cpp_extension import load

    repo, work = _repo(tmp_path, False), tmp_path / "work"
    disc = discover(repo)
    index = LauncherIndex(disc)
    fk = kernel(disc, "gather_kernel")
    cand = to_candidate(fk, disc, _prov())
    sig, text = kernel_adapter(cand.kernel, fk, index, KERNEL, ("float", "double"))
    work.mkdir()
    (work / "label.cu").write_text(f"// a label\n{KERNEL}\n{text}\n")
    cand.wrapper.launcher, cand.wrapper.functions = "gather_kernel", [sig.name]
    cand.wrapper.label_path = "label.cu"
    ref = find_reference(cand, repo, work, RepoRefs(disc, index))
    assert isinstance(ref, Reference), ref
    assert (ref.function, ref.file) == ("gather_cpu", "csrc/cpu/gather_cpu.cpp")
    (tmp_path / "build").mkdir()
    mod = load(
        name="kminer_ref_gather",
        sources=[str(work / ref.path)],
        build_directory=str(tmp_path / "build"),
        extra_cflags=["-w"],
    )
    feats = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    kmap = torch.tensor([2, 0, -1, 1, 0, 2], dtype=torch.int32)  # (in, out) pairs
    out = torch.full((3, 3), 7.0)
    mod.reference(3, 4, 3, feats, out, kmap, False)
    assert torch.equal(out, torch.stack([feats[2], torch.full((3,), 7.0), feats[0]]))
    with pytest.raises(RuntimeError):
        mod.reference(3, 4, 3, feats.double(), out.double(), kmap, False)
