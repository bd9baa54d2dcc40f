"""Class template specializations a label needs from other CUDA sources, and their defaults."""

from __future__ import annotations

from conftest import kernel

from miner.discover import discover
from miner.extract import Extractor
from miner.specializations import with_defaults
from miner.textprep import blank_comments_and_strings as blanked
from wrappers.mined import LauncherIndex, mine_wrapper

_FUNCTORS_H = """#pragma once
namespace tv {
struct GPU {};
}  // namespace tv
namespace functor {
template <typename Device, typename T>
struct Gather {
  void operator()(const Device &d, T *buf, const T *in, const int *idx, int n);
};
template <typename Device, typename T>
struct ScatterAdd {
  void operator()(const Device &d, T *out, const T *buf, const int *idx, int n,
                  bool reset = false);
};
}  // namespace functor
"""
_REORDER_CU = """#include "functors.h"
template <typename T>
__global__ void gather_kernel(T *buf, const T *in, const int *idx, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) buf[i] = in[idx[i]];
}
template <typename T>
__global__ void scatter_add_kernel(T *out, const T *buf, const int *idx, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(out + idx[i], buf[i]);
}
template <class T>
struct Internal;
template <>
struct Internal<double> {
  typedef double type;
};
namespace functor {
template <typename T>
struct Gather<tv::GPU, T> {
  void operator()(const tv::GPU &d, T *buf, const T *in, const int *idx, int n) {
    gather_kernel<T><<<(n + 255) / 256, 256>>>(buf, in, idx, n);
  }
};
template <typename T>
struct ScatterAdd<tv::GPU, T> {
  void operator()(const tv::GPU &d, T *out, const T *buf, const int *idx, int n,
                  bool reset) {
    if (reset) cudaMemset(out, 0, n * sizeof(T));
    scatter_add_kernel<T><<<(n + 255) / 256, 256>>>(out, buf, idx, n);
  }
};
template struct Gather<tv::GPU, float>;
template struct ScatterAdd<tv::GPU, float>;
}  // namespace functor
"""
_CONV_CU = """#include <torch/extension.h>
#include "functors.h"
template <class T>
struct Internal;
template <>
struct Internal<float> {
  typedef float type;
};
at::Tensor conv_forward(at::Tensor in, at::Tensor idx) {
  auto buf = at::empty({idx.size(0)}, in.options());
  auto out = at::zeros_like(in);
  functor::Gather<tv::GPU, Internal<float>::type>()(
      tv::GPU(), buf.data_ptr<float>(), in.data_ptr<float>(), idx.data_ptr<int>(), idx.size(0));
  functor::ScatterAdd<tv::GPU, float>()(tv::GPU(), out.data_ptr<float>(), buf.data_ptr<float>(),
                                        idx.data_ptr<int>(), idx.size(0));
  return out;
}
"""


def test_a_label_links_the_gpu_specializations_its_functors_have_elsewhere(tmp_path):
    """spconv's convolution launcher calls a gather and a scatter functor whose primaries only
    declare `operator()`; both GPU specializations live in another CUDA source. mmcv's labels
    linked only the one on the kernel's own path and failed to import (undefined symbol of the
    other). Both are linked, the primary's default argument goes onto the specialization (a
    call that leaves it out must still compile), and a same-named class of another translation
    unit (its own primary) stays out."""
    repo = tmp_path / "repo"
    (repo / "csrc").mkdir(parents=True)
    (repo / "csrc" / "functors.h").write_text(_FUNCTORS_H)
    (repo / "csrc" / "reordering.cu").write_text(_REORDER_CU)
    (repo / "csrc" / "conv.cu").write_text(_CONV_CU)
    disc = discover(repo)
    for name in ("gather_kernel", "scatter_add_kernel"):
        mined = mine_wrapper(kernel(disc, name), Extractor(disc), LauncherIndex(disc))
        assert mined is not None and "conv_forward" in mined.code, name
        code = mined.code
        assert "struct Gather<tv::GPU, T> {" in code and "struct ScatterAdd<tv::GPU, T> {" in code
        assert "int n,\n                  bool reset = false) {" in code  # the default, copied
        assert code.index("struct ScatterAdd<tv::GPU, T>") < code.index("at::Tensor conv_forward")
        assert "struct Internal<float>" in code and "struct Internal<double>" not in code


def test_defaults_go_onto_member_declarations_only():
    primary = """struct F {
  Index operator()(const Device& d, tv::TensorView<const Index> a,
                   const tv::SimpleVector<Index, NDim> s, bool transpose, bool resetGrid = false);
  void g(int a, float b = 1.0f);
  void h(int a = 2);
  void m(std::string mode = "sum");
};"""
    spec = """struct F<tv::GPU, Index, NDim> {
  Index operator()(const tv::GPU &d, tv::TensorView<const Index> a,
                   const tv::SimpleVector<Index, NDim> s, bool transpose, bool resetGrid) {
    g(a, b);
    return foo(x, y);
  }
  void g(int a, float b) const { h(a); }
  void h(int a, int b) {}
  void m(std::string mode) {}
};"""
    # the code each is read in has its strings blanked; a default is copied as written
    filled = with_defaults((spec, blanked(spec)), (primary, blanked(primary)))
    assert filled is not None
    assert "bool transpose, bool resetGrid = false) {" in filled
    assert "void g(int a, float b = 1.0f) const { h(a); }" in filled
    assert "g(a, b);" in filled and "foo(x, y);" in filled  # calls are not declarations
    assert "void h(int a, int b) {}" in filled  # another arity: another function
    assert 'void m(std::string mode = "sum") {}' in filled
    assert with_defaults((filled, blanked(filled)), (primary, blanked(primary))) is None
