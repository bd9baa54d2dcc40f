"""testgen/selectors.py: the integer argument value that makes a host function launch a kernel
the recorded calls never reach (pytorch3d's knn `version`), in the shapes real code has."""

from __future__ import annotations

from testgen.cases import BaseCall, plan
from testgen.selectors import kernel_selectors

HOST = """
template <typename T> __global__ void KernelV0(const T* x, T* y, int n) { y[0] = x[0]; }
template <typename T, int D> __global__ void KernelV1(const T* x, T* y, int n) { y[0] = x[1]; }
template <typename T, int D> __global__ void KernelV2(const T* x, T* y, int n) { y[0] = x[2]; }
template <typename T> __global__ void KernelV3(const T* x, T* y, int n) { y[0] = x[3]; }

template <typename T, int D>
struct KernelV1Functor {
  static void run(const T* x, T* y, int n) { KernelV1<T, D><<<1, 32>>>(x, y, n); }
};

template <typename T>
void LaunchV2(const T* x, T* y, int n) { KernelV2<T, 3><<<1, 32>>>(x, y, n); }

template <template <typename, int> class Kernel, typename T, typename... Args>
void Dispatch(int d, Args... args) { Kernel<T, 3>::run(args...); }

at::Tensor Knn(const at::Tensor& x, at::Tensor& y, bool sorted, int version, int mode) {
  if (version < 0) {
    version = 1;
  }
  if (version == 0) {
    KernelV0<float><<<1, 32>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  } else if (1 == version && sorted) {
    Dispatch<KernelV1Functor, float>(3, x.data_ptr<float>(), y.data_ptr<float>(), 1);
  } else if (version == 2) {
    LaunchV2<float>(x.data_ptr<float>(), y.data_ptr<float>(), 1);
  }
  switch (mode) {
    case 7:
      KernelV3<float><<<1, 32>>>(x.data_ptr<float>(), y.data_ptr<float>(), 1);
      break;
    default:
      break;
  }
  return y;
}
"""
NAMES = ["x", "y", "sorted", "version", "mode"]


def test_the_value_whose_branch_launches_the_kernel():
    recorded = [[None, None, True, -1, 0], [None, None, False, -1, 2]]
    assert kernel_selectors(HOST, "KernelV0", NAMES, recorded) == [(3, 0)]
    # through a functor handed to a dispatch template, and `literal == name` with another test
    assert kernel_selectors(HOST, "KernelV1", NAMES, recorded) == [(3, 1)]
    assert kernel_selectors(HOST, "KernelV2", NAMES, recorded) == [(3, 2)]  # a helper launches
    assert kernel_selectors(HOST, "KernelV3", NAMES, recorded) == [(4, 7)]  # `case 7:`


def test_nothing_where_a_recorded_call_already_selects_it_or_the_argument_is_no_integer():
    assert kernel_selectors(HOST, "KernelV0", NAMES, [[None, None, True, 0, 0]]) == []
    as_flag = [[None, None, True, True, 0]]  # a bool is a flag (cases.flag_flips), not a value
    assert kernel_selectors(HOST, "KernelV0", NAMES, as_flag) == []
    assert kernel_selectors(HOST, "KernelV0", ["x", "y", "sorted", "v", "mode"], [[0] * 5]) == []


def test_selecting_cases_run_each_shape_with_the_value_and_are_made_by_kminer():
    import torch

    base = [
        BaseCall([torch.ones(4), torch.zeros(4), True, -1, 0], "tests/test_knn.py"),
        BaseCall([torch.ones(4), torch.zeros(4), True, -1, 0], "tests/test_knn.py"),
        BaseCall([torch.ones(6), torch.zeros(6), True, -1, 0], "tests/test_knn.py"),
    ]
    out = plan(base, ["float32"], NAMES, selectors=[(3, 0)])
    picked = [c for c in out.cases if c["id"].startswith("select")]
    assert [c["id"] for c in picked] == ["select3_0_of_0", "select3_0_of_2"]  # one per shape
    assert all(c["made"] and c.get("flag") is None for c in picked)
    calls = [out.base[c["base"]] for c in picked]
    assert [b.args[3] for b in calls] == [0, 0] and all(b.selects for b in calls)
    assert all(not c["made"] for c in out.cases if c["id"].startswith("recorded_"))
