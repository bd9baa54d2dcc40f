"""nvcc verdicts on extracted units (compile only; no GPU)."""

from __future__ import annotations

import pytest
from conftest import kernel, needs_nvcc

from miner.candidate import Reason, Status
from miner.compile import compile_unit, failing_dtypes, first_error

pytestmark = needs_nvcc


def _compile(disc, extractor, name, spec=None):
    res = extractor.extract(kernel(disc, name, spec), f"test {name}")
    return res, compile_unit(res.unit.text, res.unit.needs_torch, res.unit.instantiations)


@pytest.mark.parametrize(
    ("name", "spec"),
    [("block_sum_kernel", None), ("scale_kernel", "double"), ("act_relu_kernel", None)],
)
def test_representative_units_compile(traps, traps_extractor, name, spec):
    res, result = _compile(traps, traps_extractor, name, spec)
    assert result.status == Status.OK, result.log
    assert result.compiled_types == res.unit.instantiations


def test_dtype_the_template_rejects_is_dropped(tmp_path):
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "k.cu").write_text(
        "template <typename T> __global__ void clip_kernel(T* x, int n) {\n"
        "  int i = threadIdx.x; if (i < n) x[i] = max(x[i], (T)0.5);\n}\n"
    )
    disc = discover(tmp_path)
    _, result = _compile(disc, Extractor(disc), "clip_kernel")
    assert result.status == Status.OK
    assert result.compiled_types == ["float", "double"]
    assert result.reason == Reason.PARTIAL_INSTANTIATION
    assert "kminer_inst_half" not in result.text and "kminer_inst_double" in result.text


def test_dtypes_failing_in_different_compiler_phases_are_dropped_in_turn(tmp_path):
    """half fails in the front end; only once it is gone does ptxas see that a double tile
    needs 64 KB of shared memory (SparseConvNet's 64x16 convolution tiles): both go."""
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "k.cu").write_text(
        "template <typename T, int K>\n__global__ void tile_kernel(T* x) {\n"
        '  static_assert(sizeof(T) != 2, "no half tiles");\n'
        "  __shared__ T buf[K * 512];\n  buf[threadIdx.x] = x[threadIdx.x];\n"
        "  __syncthreads();\n  x[threadIdx.x] = buf[K * 512 - 1 - threadIdx.x];\n}\n"
        "void tile(float* x) { tile_kernel<float, 16><<<1, 32>>>(x); }\n"
    )
    disc = discover(tmp_path)
    _, result = _compile(disc, Extractor(disc), "tile_kernel")
    assert result.status == Status.OK, result.detail
    assert result.compiled_types == ["float"]
    assert result.detail == "not for double, half"
    assert "retry without half" in result.log and "retry without double" in result.log


def test_broken_unit_reports_its_first_error(tmp_path):
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "k.cu").write_text(
        "__global__ void bad(float* x) { x[0] = not_defined_anywhere(1); }\n"
    )
    disc = discover(tmp_path)
    _, result = _compile(disc, Extractor(disc), "bad")
    assert result.status == Status.ERROR and result.reason == Reason.COMPILE_ERROR
    assert "not_defined_anywhere" in result.detail and result.detail.startswith("line ")


def test_error_parsing_helpers():
    log = (
        'unit.cu(12): error: identifier "foo" is undefined\n'
        "unit.cu(40): error: no instance of overloaded function\n"
        '  detected during instantiation of "void k<T>(T *) '
        '[with T=kminer_inst_half::T]" at line 61\n'
    )
    text = "\n".join(
        ["x"] * 59
        + [
            "// kminer-inst-begin half",
            "namespace kminer_inst_half {",
            "void launch() {}",
            "}",
            "// kminer-inst-end half",
        ]
    )
    assert failing_dtypes(log, text) == {"half"}
    assert first_error(log) == (Reason.COMPILE_ERROR, 'line 12: identifier "foo" is undefined')
    fatal = "unit.cu:3:10: fatal error: cutlass/cutlass.h: No such file or directory\n"
    assert first_error(fatal)[0] == Reason.MISSING_HEADER
    tiles = "\n".join(  # SparseConvNet's 64x16 tiles: the double ones exceed 48 KB
        ["x"] * 10
        + [
            f"// kminer-inst-begin {t}\nnamespace kminer_inst_{t} {{}}\n// kminer-inst-end {t}"
            for t in ("float", "double", "half")
        ]
    )
    ptxas = (
        "ptxas error   : Entry function '_Z27dConvolution_KMxKN_forwardAIdLi64ELi16EEvPT_S1_S1_"
        "Piiiiii' uses too much shared data (0x10000 bytes, 0xc000 max)\n"
        "ptxas error   : Entry function '_Z1kIN3c104HalfEEvPT_' uses too much shared data\n"
    )
    assert failing_dtypes(ptxas, tiles) == {"double", "half"}
    # a candidate the compiler lists "at line N of" a system header is no line of the unit
    # (detectron2: std::cos declared at line 188 of <cmath> fell in float's stub)
    system = (
        'unit.cu(116): error: more than one instance of overloaded function "cos"\n'
        '  function "std::cos(float)" (declared at line 11 of /usr/include/c++/12/cmath)\n'
        '  detected during instantiation of "void k<T>(T *) [with T=kminer_inst_half::T]" '
        "at line 61\n"
    )
    assert failing_dtypes(system, tiles) == {"half"}


@pytest.mark.slow
@pytest.mark.parametrize("which", ["traps", "sample"])
def test_every_fixture_unit_compiles(which, traps, traps_extractor, sample):
    from concurrent.futures import ThreadPoolExecutor

    from miner.extract import Extractor

    disc, ex = (traps, traps_extractor) if which == "traps" else (sample, Extractor(sample))
    units = [ex.extract(k, "t").unit for k in disc.kernels]
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(lambda u: compile_unit(u.text, u.needs_torch, u.instantiations), units)
        )
    failed = [
        (k.kdef.name, r.detail)
        for k, r in zip(disc.kernels, results, strict=True)
        if r.status != Status.OK
    ]
    assert failed == []


@pytest.mark.slow
def test_torch_unit_compiles_with_light_headers(tmp_path):
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "k.cu").write_text(
        "#include <ATen/ATen.h>\nusing at::Half;\n"
        "template <typename T> __global__ void half_add(T* x, const at::Half* y, int n) {\n"
        "  int i = threadIdx.x; if (i < n) atomicAdd(x + i, (T)(float)y[i]);\n}\n"
        "__global__ void acc_kernel(at::PackedTensorAccessor32<float, 2, at::RestrictPtrTraits> a)"
        " { a[0][0] = 1.f; }\n"
    )
    disc = discover(tmp_path)
    ex = Extractor(disc)
    for name in ("half_add", "acc_kernel"):
        res, result = _compile(disc, ex, name)
        assert res.unit.needs_torch
        assert "torch/extension.h" not in res.unit.text
        assert result.status == Status.OK, result.log


def test_a_class_whose_host_methods_name_the_tensor_type_compiles(tmp_path):
    """MinkowskiEngine's coordinate map: the kernel takes the class's device view, and the
    class also declares host methods returning `std::vector<at::Tensor>`; the light prelude
    (TensorAccessor) does not declare at::Tensor, so its units failed to compile."""
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "map.cuh").write_text(
        "#include <ATen/ATen.h>\n#include <vector>\n"
        "struct CoordMap {\n  int n;\n  __device__ int size() const { return n; }\n"
        "  std::vector<at::Tensor> field_map(at::Tensor const &f) const;\n};\n"
    )
    (tmp_path / "k.cu").write_text(
        '#include "map.cuh"\n'
        "__global__ void fill(CoordMap m, int* out) { out[threadIdx.x] = m.size(); }\n"
    )
    disc = discover(tmp_path)
    res, result = _compile(disc, Extractor(disc), "fill")
    assert res.unit.needs_torch and "#include <ATen/core/Tensor.h>" in res.unit.text
    assert result.status == Status.OK, result.log


TRAITS_KERNEL = (
    "template <int N_, typename T_> struct Traits { static constexpr int kN = N_;"
    " using input_t = T_; };\n"
    "template <typename Ktraits> __global__ void fwd_kernel(void* x) {\n"
    "  using input_t = typename Ktraits::input_t;\n"
    "  reinterpret_cast<input_t*>(x)[threadIdx.x % Ktraits::kN] = input_t(1);\n}\n"
    "void run(void* x) { auto k = &fwd_kernel<Traits<4, float>>; k<<<1, 32>>>(x); }\n"
)
OBJECT_KERNEL = (
    "struct View { __device__ void insert(long k, long v) {} };\n"
    "template <typename view_t, typename int_t>\n"
    "__global__ void stage1(view_t table, int n, int_t *out) {\n"
    "  int i = threadIdx.x; if (i < n) { out[i] = i; table.insert(i + 1, i); }\n}\n"
    "template <typename T> __global__ void plain(T *x, int n) { x[threadIdx.x] = n; }\n"
    "void run(long *o, float *x) {\n"
    "  stage1<View, long><<<1, 32>>>(View(), 4, o); plain<float><<<1, 32>>>(x, 4);\n}\n"
)


@pytest.mark.parametrize(
    ("source", "kernel"), [(TRAITS_KERNEL, "fwd_kernel"), (OBJECT_KERNEL, "stage1")]
)
def test_a_kernel_over_a_class_type_compiles_as_a_template(tmp_path, source, kernel):
    """float cannot stand in for a class: causal-conv1d's kernels take `Ktraits` and read
    `Ktraits::kNThreads`; torchsparse's kernel-map kernels take a hash table's device view and
    call `table.insert(...)`. The unit is checked as the template itself, with no
    instantiation; an element type beside it still gets its dtypes."""
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "k.cu").write_text(source)
    disc = discover(tmp_path)
    res, result = _compile(disc, Extractor(disc), kernel)
    assert res.unit.instantiations == [] and "kminer_inst_" not in res.unit.text
    assert result.status == Status.OK, result.log
    if kernel == "stage1":
        res, _ = _compile(disc, Extractor(disc), "plain")
        assert res.unit.instantiations


@needs_nvcc
def test_a_header_only_library_of_the_system_is_found_and_travels_in_bundles(tmp_path):
    """`#include <Eigen/Dense>` (lietorch's submodule, absent from a snapshot) is found in this
    machine's /usr/include/eigen3, units compile against it, and a bundle carries it."""
    from miner.includes import exists_on_system
    from testgen.bundle import _header_libraries

    assert exists_on_system("Eigen/Dense")
    text = (
        "#include <Eigen/Dense>\n"
        "__global__ void norm3(float *x) { x[0] = Eigen::Vector3f(x[0], x[1], x[2]).norm(); }\n"
    )
    assert compile_unit(text, False, []).status == Status.OK
    carried = _header_libraries({"labels/a.cu": text.encode(), "b.cu": b"#include <cuda.h>\n"})
    assert "include/eigen3/Eigen/Dense" in carried
    assert not any(k.startswith("include/eigen3/unsupported/") for k in carried)  # not included


@needs_nvcc
def test_a_template_type_with_an_integer_default_keeps_it(tmp_path):
    """torchsparse's hash table: `template <typename key_type=int64_t, typename val_type=int>
    __global__ void insert_kernel(key_type *keys, ...)` does `atomicCAS` on its keys, which no
    float overload takes: the unit instantiates the integer defaults, not a dtype."""
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "k.cu").write_text(
        "__device__ long long cas(long long *a, long long c, long long v) {\n"
        "  return (long long)atomicCAS((unsigned long long *)a, (unsigned long long)c,\n"
        "                              (unsigned long long)v);\n}\n"
        "template <typename key_type = long long, typename val_type = int>\n"
        "__global__ void insert_kernel(key_type *keys, val_type *vals, int n) {\n"
        "  int i = threadIdx.x; if (i < n) { cas(keys + i, 0, i + 1); vals[i] = i; }\n}\n"
    )
    disc = discover(tmp_path)
    res, result = _compile(disc, Extractor(disc), "insert_kernel")
    assert result.status == Status.OK, result.log
    assert "using key_type = long long;" in res.unit.text
    assert "using key_type = float;" not in res.unit.text


def test_nvcc_failing_without_a_message_is_run_once_more(tmp_path, monkeypatch):
    """Under load nvcc may end with an exit code and no message at all (seen once in a full
    `make test`): that says nothing of the code, so the compile runs once more; a second
    silent failure is reported as such, not as an empty compile error."""
    from miner import toolchain

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvcc").write_text(
        "#!/bin/sh\n"
        "[ -f first ] || { touch first; exit 3; }\n"
        'for a; do out=$a; done\ntouch "$out"\nexit 0\n'
    )
    (fake / "nvcc").chmod(0o755)
    # nvcc_path is cached for the process: replaced here, never filled with the fake
    monkeypatch.setattr(toolchain, "nvcc_path", lambda: str(fake / "nvcc"))
    code, log, _ = toolchain.compile_source("int x;\n", "unit.cu", [], 60)
    assert code == 0, log
    (fake / "nvcc").write_text("#!/bin/sh\nexit 3\n")
    code, log, _ = toolchain.compile_source("int x;\n", "unit.cu", [], 60)
    assert (code, log) == (3, "nvcc exited 3 without a message, twice")


def test_aten_ceil_div_from_a_heavy_header_is_defined_again_in_the_unit(tmp_path):
    """detectron2's nms_rotated kernel calls `at::cuda::ATenCeilDiv`, which comes with
    <ATen/cuda/CUDAApplyUtils.cuh>: a heavy header the unit leaves out, so the unit defines it."""
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "nms.cu").write_text(
        "#include <ATen/cuda/CUDAApplyUtils.cuh>\n"
        "template <typename T> __global__ void nms_kernel(const T *boxes, unsigned long long *m,"
        " int n) {\n  const int blocks = at::cuda::ATenCeilDiv(n, 64);\n"
        "  m[threadIdx.x * blocks] = boxes[threadIdx.x] > T(0);\n}\n"
    )
    disc = discover(tmp_path)
    res, result = _compile(disc, Extractor(disc), "nms_kernel")
    assert "T ATenCeilDiv(T a, T b)" in res.unit.text
    assert result.status == Status.OK, result.log
