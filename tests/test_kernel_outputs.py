"""A kernel's test compares the outputs it writes, where its host function launches several."""

from pathlib import Path

import torch

from testgen.kernel_outputs import unchecked

ROOT = Path(__file__).resolve().parents[1]

LABEL = """
#include <torch/extension.h>
template <typename T> struct View { T* p; __device__ T& operator[](int i) { return p[i]; } };
template <typename T> View<T> view_of(at::Tensor t) { return View<T>{t.data_ptr<T>()}; }

__global__ void grad_x_kernel(const float* g, View<float> gx, int n) {
  int i = threadIdx.x;
  if (i < n) gx[i] = g[i] * 2.f;
}

__global__ void grad_c_kernel(const float* g, float* gc, int n) {
  int i = threadIdx.x;
  if (i < n) atomicAdd(gc, g[i]);
}

__global__ void count_kernel(const float* x, int* tmp, int n) {
  int i = threadIdx.x;
  if (i < n) tmp[i] = x[i] > 0;
}

std::vector<at::Tensor> op_backward(const at::Tensor g, const at::Tensor x) {
  auto gx_ = at::zeros_like(x);
  auto gc_ = at::zeros({1}, x.options());
  auto gs_ = g.sum();
  View<float> gx = view_of<float>(gx_);
  grad_x_kernel<<<1, 64>>>(g.data_ptr<float>(), gx, x.numel());
  grad_c_kernel<<<1, 64>>>(g.data_ptr<float>(), gc_.data_ptr<float>(), x.numel());
  return {gx_, gc_, gs_};
}

void op_forward(const at::Tensor x, at::Tensor out) {
  auto tmp = at::zeros({x.numel()}, x.options().dtype(at::kInt));
  count_kernel<<<1, 64>>>(x.data_ptr<float>(), tmp.data_ptr<int>(), x.numel());
  grad_c_kernel<<<1, 64>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
}
"""


def test_each_kernel_is_compared_on_the_outputs_it_writes():
    # grad_x writes gx_ through a view made from it; grad_c writes gc_: each leaves the other's
    assert unchecked(LABEL, "grad_x_kernel", ["g", "gx", "n"], "op_backward", ["g", "x"]) == (
        [1],
        [],
    )
    assert unchecked(LABEL, "grad_c_kernel", ["g", "gc", "n"], "op_backward", ["g", "x"]) == (
        [0],
        [],
    )


def test_a_kernel_writing_no_output_of_its_own_leaves_every_output_compared():
    # count_kernel writes a buffer made like x (x is not what it writes), no output: nothing is
    # left out, or its test would compare nothing it computes
    assert unchecked(LABEL, "count_kernel", ["x", "tmp", "n"], "op_forward", ["x", "out"]) == (
        [],
        [],
    )
    # the kernel writing `out` keeps it compared; count_kernel writes no output to leave out
    assert unchecked(LABEL, "grad_c_kernel", ["g", "gc", "n"], "op_forward", ["x", "out"]) == (
        [],
        [],
    )


def test_the_test_leaves_out_what_only_other_kernels_write():
    text = (ROOT / "prompts" / "test_code.py.j2").read_text()
    start = text.index("\ndef _outputs(")
    scope: dict = {"torch": torch, "UNCHECKED": set(), "OTHER_KERNELS": ([1], [0])}
    exec(text[start : text.index("\ndef ", start + 1)], scope)
    gx, gc, gs, grad_in, x = (torch.full((2,), float(v)) for v in range(5))
    compared = scope["_outputs"]([grad_in, x], [gx, gc, gs])
    assert [int(t[0]) for t in compared] == [4, 0, 2]  # x, then gx and gs: not grad_in nor gc
    scope["OTHER_KERNELS"] = ([], [])
    assert len(scope["_outputs"]([grad_in, x], [gx, gc, gs])) == 5
