"""Probe sizes for kernels the host code picks by tile alignment (testgen/tile_sizes.py)."""

from __future__ import annotations

from testgen.probe_inputs import MAX_TILE_ELEMENTS
from testgen.tile_sizes import TILE_SIZES, sizes_at_rank, tile_sizes, tiled

# spconv's gather functor, as mmcv's labels hold it: a vectorized block kernel for whole tiles
# of an aligned width, a vectorized one for the rest, a generic one where no tile fits
FUNCTOR = """
template <typename T, int NumTLP> __global__ void gatherVecBlockKernel(T *b, const T *f, int n) {
  if (threadIdx.x < n) b[threadIdx.x] = f[threadIdx.x];
}
template <typename T, int NumTLP> __global__ void gatherVecKernel(T *b, const T *f, int n) {
  if (threadIdx.x < n) b[threadIdx.x] = f[threadIdx.x];
}
template <typename T> __global__ void gatherGenericKernel(T *b, const T *f, int n) {
  if (threadIdx.x < n) b[threadIdx.x] = f[threadIdx.x];
}
template <typename T>
struct SparseGatherFunctor {
  void operator()(T *buffer, const T *features, int numPlanes, int size) {
    bool notFound = true;
    mp_for_each<kernel_block_t>([=, &notFound](auto NumTLP) {
      int nHotBlock = (size / NumTLP) * NumTLP;
      if (notFound) {
        if (numPlanes % NumTLP == 0) {
          if (nHotBlock >= NumTLP) {
            gatherVecBlockKernel<T, int(NumTLP)><<<1, NumTLP>>>(buffer, features, nHotBlock);
          }
          if (size > nHotBlock) {
            gatherVecKernel<T, int(NumTLP)><<<1, NumTLP>>>(buffer, features, size - nHotBlock);
          }
          notFound = false;
        }
      }
    });
    if (notFound) {
      gatherGenericKernel<T><<<1, 64>>>(buffer, features, size);
    }
  }
};
at::Tensor gather(at::Tensor features, at::Tensor buffer, int64_t size) {
  if (size <= 0) return buffer;
  SparseGatherFunctor<float>()(buffer.data_ptr<float>(), features.data_ptr<float>(),
                               features.size(1), size);
  return buffer;
}
"""


def test_kernels_picked_by_alignment_or_a_threshold_get_the_tile_sizes():
    assert tiled(FUNCTOR, "gatherVecBlockKernel") and tiled(FUNCTOR, "gatherVecKernel")
    assert tile_sizes(FUNCTOR, "gatherVecKernel") == TILE_SIZES
    # under `notFound` only, and the kernels' own `threadIdx.x < n` guards are no host choice
    assert not tiled(FUNCTOR, "gatherGenericKernel")
    assert tile_sizes(FUNCTOR, "gatherGenericKernel") == ()
    # one width only the smallest common tile (16) aligns, one count past the largest (64)
    assert any(s % 16 == 0 and s % 32 for s in TILE_SIZES) and any(s > 64 for s in TILE_SIZES)


def test_template_brackets_and_literal_bounds_are_no_threshold():
    cast = FUNCTOR.replace("  if (size <= 0) return buffer;", "  if (static_cast<int>(size) > 0)")
    cast = cast.replace("  SparseGatherFunctor<float>()(", "    SparseGatherFunctor<float>()(")
    assert "if (static_cast<int>(size) > 0)" in cast
    assert not tiled(cast, "gatherGenericKernel")
    typed = cast.replace("static_cast<int>(size) > 0", "std::is_same<T, float>::value")
    assert not tiled(typed, "gatherGenericKernel")
    spaced = cast.replace("static_cast<int>(size) > 0", "size > numPlanes")
    assert tiled(spaced, "gatherGenericKernel")


# SparseConvNet's convolution picks its kernel size inside a macro, and calls the macro as a
# statement with no semicolon (which the grammar cannot read)
MACRO = r"""
template <typename T, int K, int V> __global__ void conv_A(T *o, const T *i, int n) {
  if (threadIdx.x < n) o[threadIdx.x] = i[threadIdx.x];
}
template <typename T, int K, int V> __global__ void conv_B(T *o, const T *i, int n) {
  if (threadIdx.x < n) o[threadIdx.x] = i[threadIdx.x];
}
#define FOO(T, K, V)                                                   \
  {                                                                    \
    if (planes % K == 0) {                                             \
      conv_A<T, K, V><<<1, K>>>(o, i, n);                              \
      return;                                                          \
    }                                                                  \
  }
template <typename T> void conv(T *o, const T *i, int n, int planes) {
  FOO(T, 32, 8)
  FOO(T, 16, 4)
  conv_B<T, 8, 2><<<1, 8>>>(o, i, n);
}
"""


def test_a_kernel_picked_by_alignment_inside_a_macro_gets_the_tile_sizes():
    assert tiled(MACRO, "conv_A")
    assert not tiled(MACRO, "conv_B")  # launched outside the macro, under no alignment


def test_tensors_of_more_dimensions_are_probed_at_smaller_tiles():
    assert sizes_at_rank(TILE_SIZES, 2) == TILE_SIZES and sizes_at_rank((), 4) == ()
    small = sizes_at_rank(TILE_SIZES, 4)
    assert min(small) ** 4 <= MAX_TILE_ELEMENTS  # a tensor of that size a side is embedded
    assert any(s % 16 == 0 for s in small) and any(s % 8 == 0 and s % 16 for s in small)
    assert any(s % 8 for s in small)  # one width no tile aligns
    assert any(s % 8 == 0 and s // 8 >= 3 and s % 16 for s in small)  # 8-wide tiles, 3 of them
