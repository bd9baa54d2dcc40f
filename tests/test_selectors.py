"""testgen/selectors.py: the integer argument value that makes a host function launch a kernel
the recorded calls never reach (pytorch3d's knn `version`), in the shapes real code has."""

from __future__ import annotations

from testgen.cases import BaseCall, plan
from testgen.selectors import kernel_selectors
from testgen.shape_selectors import resized, shape_selectors

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


SIZED_HOST = """
#define THREADS_PER_BLOCK 512
template <typename T> __global__ void small_kernel(const T* v, T* g, int c) {}
template <typename T> __global__ void multi_blocks_kernel(const T* v, T* g, int c) {}
template <typename T> __global__ void global_mem_kernel(const T* v, T* g, int c) {}
template <typename T> __global__ void any_kernel(const T* v, T* g, int c) {}

void col2im(const float* v, float* g, const int channels) {
  if (channels > THREADS_PER_BLOCK) {
    if ((channels & THREADS_PER_BLOCK - 1) == 0) {
      multi_blocks_kernel<float><<<1, 512>>>(v, g, channels);
    } else {
      global_mem_kernel<float><<<1, 512>>>(v, g, channels);
    }
  } else {
    switch (channels) {
      case 1:
        small_kernel<float><<<1, 1>>>(v, g, channels);
        break;
      default:
        global_mem_kernel<float><<<1, 512>>>(v, g, channels);
    }
  }
}

at::Tensor backward(const at::Tensor& value, const at::Tensor& grad_output, int step) {
  const int channels = value.size(3);
  auto grad_value = at::zeros_like(value);
  col2im(value.data_ptr<float>(), grad_value.data_ptr<float>(), channels);
  any_kernel<float><<<1, 32>>>(value.data_ptr<float>(), grad_value.data_ptr<float>(), channels);
  return grad_value;
}
"""
SIZED_NAMES = ["value", "grad_output", "step"]


def _sized_call(channels: int):
    import torch

    value = torch.rand(1, 5, 2, channels)
    return [value, torch.rand(1, 7, 2 * channels), 64]


def test_the_tensor_size_whose_guards_launch_the_kernel():
    """mmcv's multi-scale deformable attention backward: the kernel is chosen by the channel
    count it reads from `value.size(3)`, through a helper that takes it by the same name."""
    recorded = [_sized_call(c) for c in (30, 1025)]
    # > 512 and a multiple of 512: 1024, the size of that kind nearest the recorded ones
    assert shape_selectors(SIZED_HOST, "multi_blocks_kernel", SIZED_NAMES, recorded) == [
        (0, 3, 1024)
    ]
    assert shape_selectors(SIZED_HOST, "small_kernel", SIZED_NAMES, recorded) == [(0, 3, 1)]
    # launched by a recorded call already (1025 > 512, not a multiple), or under no guard
    assert shape_selectors(SIZED_HOST, "global_mem_kernel", SIZED_NAMES, recorded) == []
    assert shape_selectors(SIZED_HOST, "any_kernel", SIZED_NAMES, recorded) == []
    # a guard on something other than a size or a constant is not read: the others decide
    unknown = SIZED_HOST.replace("THREADS_PER_BLOCK - 1", "mask_bits")
    assert shape_selectors(unknown, "multi_blocks_kernel", SIZED_NAMES, recorded) == []
    small = [_sized_call(c) for c in (30, 100)]
    assert shape_selectors(unknown, "multi_blocks_kernel", SIZED_NAMES, small) == [(0, 3, 513)]


def test_a_resized_call_keeps_its_tensors_consistent():
    import torch

    call = _sized_call(30)
    value, grad_output, step = resized(call, 0, 3, 1024, 1 << 20)
    assert value.shape == (1, 5, 2, 1024) and grad_output.shape == (1, 7, 2048) and step == 64
    assert torch.equal(value[..., :30], call[0])  # the recorded channels, then scaled copies
    assert torch.allclose(value[..., 30:60], call[0] * 1.5)
    heads = grad_output.reshape(1, 7, 2, 1024)  # num_heads * channels: each head widened
    assert torch.equal(heads[..., :30], call[1].reshape(1, 7, 2, 30))
    assert resized([*call[:2], 30], 0, 3, 1024, 1 << 20) is None  # the count passed on its own
    assert resized(_sized_call(2), 0, 3, 1024, 1 << 20) is None  # too many axes share 2
    assert resized(call, 0, 3, 1024, 10_000) is None  # past a test's size


def test_sized_cases_are_made_calls_that_select():
    base = [BaseCall(_sized_call(30), "tests/test_msda.py"), BaseCall(_sized_call(40), "t.py")]
    out = plan(base, ["float32"], SIZED_NAMES, sized=[(0, 3, 1024)])
    picked = [c for c in out.cases if c["id"].startswith("select")]
    assert [c["id"] for c in picked] == ["select0_dim3_1024_of_1"]  # the larger recorded size
    call = out.base[picked[0]["base"]]
    assert call.selects and picked[0]["made"] and call.args[0].shape[3] == 1024
    assert "dimension 3 of argument 0 set to 1024" in call.derived


def test_guards_are_evaluated_as_c_integers_and_nothing_else_runs():
    """kminer's evaluator, not Python's eval: the guard is the repository's text."""
    from testgen.shape_selectors import _maybe, _python, _reaches

    def holds(cond: str, **env) -> bool:
        return _reaches([(_python(cond), True)], env)

    assert holds("(c & T - 1) == 0 && c > T", c=1024, T=512)
    assert not holds("(c & T - 1) == 0 && c > T", c=1025, T=512)
    assert holds("c / 2 == -3", c=-7)  # C's division truncates toward zero
    assert holds("!(c % 4) && c != 0u", c=8)
    assert not holds("c << 100000000", c=1)  # refused, not computed
    assert not holds("c / (c - 1) > 0", c=1)  # a division by zero reaches nothing
    # a call is no guard: not run, only unknown (it may hold, as a guard on a stride may)
    assert _maybe(_python("__import__('os').system('true')"), {"c": 1}) is None
    assert _maybe(_python("(lambda: 1)()"), {"c": 1}) is None
    assert _maybe(_python("s != 1 && c <= 24"), {"c": 25}) is False  # false whatever s is
    assert _maybe(_python("s != 1 || c <= 24"), {"c": 24}) is True
    assert _maybe(_python("s != 1 && c <= 24"), {"c": 24}) is None


UNGUARDED_HOST = """
__global__ void plain_kernel(float* x, int n) {}

auto scale = [](const at::Tensor& x) {
  const int n = x.size(0);
  if (n > 512) {
    x.mul_(2);
  }
  plain_kernel<<<1, 32>>>(x.data_ptr<float>(), n);
  return x;
};
"""


def test_a_kernel_launched_under_no_guard_gets_no_size_from_other_calls_guards():
    """Only the kernel's launch and calls of functions that launch it are its sites; a kernel
    launched from no named function (a lambda here) has no other: every call under a size
    guard used to count as one."""
    import torch

    recorded = [[torch.rand(4)], [torch.rand(9)]]
    assert shape_selectors(UNGUARDED_HOST, "plain_kernel", ["x"], recorded) == []
    guarded = UNGUARDED_HOST.replace(
        "x.mul_(2);", "plain_kernel<<<1, 32>>>(x.data_ptr<float>(), n);"
    )
    assert shape_selectors(guarded, "plain_kernel", ["x"], recorded) == [(0, 0, 513)]


SPEC_HOST = """
struct resample_params { int2 up; int2 filterSize; int3 inStride; };
struct resample_spec { void* kernel; int tileW; };

template <class T> __global__ void resample_generic(resample_params p) {}
template <class T, int F> __global__ void resample_tiled(resample_params p) {}

template <class T>
resample_spec choose_resample_kernel(const resample_params& params) {
  int s = params.inStride.z, fx = params.filterSize.x, fy = params.filterSize.y;
  resample_spec spec = {(void*)resample_generic<T>, -1};
  if (params.up.x == 1) {
    if (s != 1 && fx <= 24 && fy <= 24) spec = {(void*)resample_tiled<T, 24>, 64};
    if (s != 1 && fx <= 8 && fy <= 8) spec = {(void*)resample_tiled<T, 8>, 64};
  }
  if (params.up.x == 4 && fx <= 32 && fy <= 32) spec = {(void*)resample_tiled<T, 32>, 32};
  return spec;
}

torch::Tensor resample(torch::Tensor x, torch::Tensor f, int up) {
  resample_params p;
  p.up = make_int2(up, up);
  p.filterSize = make_int2((int)f.size(1), (int)f.size(0));
  p.inStride = make_int3((int)x.stride(3), (int)x.stride(2), (int)x.stride(1));
  resample_spec spec = choose_resample_kernel<float>(p);
  void* args[] = {&p};
  cudaLaunchKernel(spec.kernel, 1, 32, args, 0, 0);
  return x;
}
"""


def test_a_kernel_chosen_as_a_function_pointer_by_a_structs_sizes():
    """StyleGAN's upfirdn2d (vendored widely): the generic kernel is the spec's first value and
    stays chosen only where no later assignment's guards may hold; the filter's sizes reach the
    guards through a struct's fields. A guard on a stride or an argument may hold, so only a
    filter past every limit (33: `up` might be 4) reaches the generic kernel for sure."""
    import torch

    recorded = [
        [torch.rand(2, 3, 4, 4), torch.rand(4, 4), 1],
        [torch.rand(2, 3, 8, 8), torch.rand(3, 3), 2],
    ]
    names = ["x", "f", "up"]
    got = shape_selectors(SPEC_HOST, "resample_generic", names, recorded)
    assert (1, 0, 33) in got or (1, 1, 33) in got
    assert all(size in (33, 4) for _, _, size in got)
    # each tile spec may be taken by a recorded call as far as sizes tell (`up` is an
    # argument, not a size): no size is forced on them
    assert shape_selectors(SPEC_HOST, "resample_tiled", names, recorded) == []
    # without the later assignments the generic kernel is what every recorded call runs
    alone = SPEC_HOST.replace("spec = {(void*)resample_tiled", "other = {(void*)resample_tiled")
    assert shape_selectors(alone, "resample_generic", names, recorded) == []
