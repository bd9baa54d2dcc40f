"""Dependency closure and unit rendering on the trap fixtures (no compiler needed)."""

from __future__ import annotations

import re

from conftest import kernel, needs_nvcc

from miner.treewalk import pasted_refs


def unit_for(traps, traps_extractor, name, spec=None):
    k = kernel(traps, name, spec)
    return traps_extractor.extract(k, f"test {name}")


def unit_texts(root, *names: str) -> list[str]:
    """The unit text of each kernel `names` of the repository written at `root`."""
    from miner.discover import discover
    from miner.extract import Extractor

    disc = discover(root)
    extractor = Extractor(disc)
    return [extractor.extract(kernel(disc, name), "t").unit.text for name in names]


def test_helpers_macros_and_aliases_come_along(traps, traps_extractor):
    res = unit_for(traps, traps_extractor, "blend_kernel")
    text = res.unit.text
    assert "#define CUDA_1D_KERNEL_LOOP" in text
    assert "lerp_hd(float a, float b, float t)" in text
    assert "#define HD_INLINE __host__ __device__ __forceinline__" in text
    # the header includes nothing itself: the launching .cu supplied the context
    assert res.closure.from_tu == "src/context_cuda.cu"
    # only what it uses
    assert "clampv" not in text and "GET_BLOCKS" not in text


def test_same_named_helper_from_the_right_header(traps, traps_extractor):
    add = unit_for(traps, traps_extractor, "combine_add_kernel")
    mul = unit_for(traps, traps_extractor, "combine_mul_kernel")
    assert "return a + b;" in add.unit.text and "return a * b;" not in add.unit.text
    assert "return a * b;" in mul.unit.text and "return a + b;" not in mul.unit.text
    assert add.pruned == 1 and mul.pruned == 1


def test_overload_sets_stay_together(traps, traps_extractor):
    text = unit_for(traps, traps_extractor, "clamp_pair_kernel").unit.text
    assert "float clampv(float v)" in text and "int clampv(int v)" in text


def test_hip_branch_is_evaluated_away(traps, traps_extractor):
    for k in traps.kernels:
        text = traps_extractor.extract(k, "t").unit.text
        assert "hip_runtime" not in text and "hip_helper" not in text


def test_specialization_keeps_its_arch_guard_and_primary(traps, traps_extractor):
    res = unit_for(traps, traps_extractor, "scale_kernel", "double")
    text = res.unit.text
    guard = text.index("#if (__CUDA_ARCH__ >= 600)")
    assert text.index("__global__ void scale_kernel<double>") > guard
    assert "template <typename T>" in text[:guard]  # the primary template comes first
    assert "kminer_inst" not in text  # a full specialization needs no launch stub


def test_primary_excludes_other_specializations(traps, traps_extractor):
    text = unit_for(traps, traps_extractor, "scale_kernel", "").unit.text
    assert "scale_kernel<double>" not in text
    assert "namespace kminer_inst_float" in text


def test_device_globals_types_and_enum_template_argument(traps, traps_extractor):
    text = unit_for(traps, traps_extractor, "poly_eval_kernel").unit.text
    for needed in (
        "__constant__ float c_coeffs[8];",
        "__device__ int d_counter;",
        "struct Accum",
        "typedef float real_t;",
        "using count_t = int;",
    ):
        assert needed in text
    stub = unit_for(traps, traps_extractor, "pair_reduce_kernel").unit.text
    assert "enum class Mode" in stub
    assert re.search(r"constexpr auto M = Mode::(Sum|Max);", stub)


def test_template_values_from_launch_sites_and_defaults(traps, traps_extractor):
    text = unit_for(traps, traps_extractor, "gather_kernel").unit.text
    assert "using index_t = int64_t;" in text  # written at the launch site
    vec = unit_for(traps, traps_extractor, "vec_copy_kernel").unit.text
    assert "constexpr auto N = 4;" in vec  # the parameter's default


def test_macro_kernel_unit_holds_the_expansion(traps, traps_extractor):
    text = unit_for(traps, traps_extractor, "act_leaky_kernel").unit.text
    assert "__global__ void act_leaky_kernel(" in text
    assert "DEFINE_ACT(" not in text.split("// src/fill_cuda.cu")[-1]


def test_names_never_resolve_outside_the_include_closure(tmp_path):
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "a.cuh").write_text(
        "#define EPS 1e-3f\n__device__ float bump(float x) { return x + EPS; }\n"
    )
    (tmp_path / "b.cuh").write_text(
        "#define EPS 42.0f\n__device__ float bump(float x) { return -x; }\n"
    )
    (tmp_path / "k.cu").write_text(
        '#include "a.cuh"\n__global__ void k(float* x) { x[0] = bump(x[0]) + EPS; }\n'
        "__global__ void lonely(float* x) { x[0] = unknown_helper(x[0]); }\n"
    )
    disc = discover(tmp_path)
    ex = Extractor(disc)
    text = ex.extract(kernel(disc, "k"), "t").unit.text
    assert "1e-3f" in text and "42.0f" not in text and "return -x" not in text
    lonely = ex.extract(kernel(disc, "lonely"), "t").unit.text
    assert "bump" not in lonely


def test_a_standard_library_name_never_resolves_to_a_vendored_definition(tmp_path):
    """`std::optional` / `std::max` are the standard library's: a header-only library vendored
    in the repository (pytorch_sparse's parallel-hashmap) defines `optional`, `nullopt` and
    `max` of its own, and pulling those in (and what they need) broke the unit. Its operators
    are wanted by their parameters' types, not by their parameters' names."""
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "vendored.h").write_text(
        "namespace lib {\nstruct nullopt_t {};\nconstexpr nullopt_t nullopt{};\n"
        "template <class T> class optional { T v; };\n"
        "template <class T> __host__ __device__ T max(T a, T b) { return a < b ? b : a; }\n}\n"
        "__device__ float relu(float x) { return max(x, 0.f); }\n"
        "struct Thing { int v; };\n"
        "inline bool operator==(const Thing& a, const Thing& b) { return a.v == b.v; }\n"
    )
    (tmp_path / "k.cu").write_text(
        '#include <optional>\n#include "vendored.h"\n'
        "__global__ void k(float* x) { int b = 1; x[b] = std::max(x[0], 0.f); }\n"
        "__global__ void own(float* x) { x[0] = relu(x[0]); }\n"
        "void host(std::optional<float> o) { if (o == std::nullopt) return; }\n"
    )
    disc = discover(tmp_path)
    ex = Extractor(disc)
    text = ex.extract(kernel(disc, "k"), "t").unit.text
    assert "class optional" not in text and "T max(T a, T b)" not in text
    assert "operator==" not in text  # wanted by a Thing, not by a variable named `b`
    own = ex.extract(kernel(disc, "own"), "t").unit.text  # unqualified: the repository's own
    assert "T max(T a, T b)" in own and "float relu(float x)" in own


def test_definitions_stamped_by_macro_invocations_are_found(tmp_path):
    (tmp_path / "atomics.cuh").write_text(
        "#pragma once\n#define OP(X, Y) Y + X\n"
        "#define ATOMIC(NAME) \\\n  template <typename T> struct Atomic##NAME##Impl { \\\n"
        "    __device__ T operator()(T a, T b) { return OP(a, b); } \\\n  };\n"
        "ATOMIC(Add)\n#undef OP\n#define OP(X, Y) Y * X\nATOMIC(Mul)\n"
    )
    (tmp_path / "k.cu").write_text(
        '#include "atomics.cuh"\n'
        "__global__ void k(float* x) { x[0] = AtomicMulImpl<float>()(x[0], x[1]); }\n"
    )
    (text,) = unit_texts(tmp_path, "k")
    assert "ATOMIC(Mul)" in text and "#define ATOMIC(NAME)" in text
    assert text.index("#define OP(X, Y) Y * X") < text.index("ATOMIC(Mul)")


def test_torch_units_keep_light_repo_headers_only(tmp_path):
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "k.cu").write_text(
        "#include <torch/extension.h>\n#include <ATen/cuda/detail/TensorInfo.cuh>\n"
        "#include <ATen/cuda/CUDAApplyUtils.cuh>\n"
        "__global__ void k(at::Half* x, at::cuda::detail::TensorInfo<float, int> info) {\n"
        "  atomicAdd(x, x[1]);\n}\n"
    )
    disc = discover(tmp_path)
    res = Extractor(disc).extract(kernel(disc, "k"), "t")
    text = res.unit.text
    assert res.unit.needs_torch
    assert "#include <ATen/cuda/detail/TensorInfo.cuh>" in text
    assert "#include <ATen/cuda/Atomic.cuh>" in text  # the light part of CUDAApplyUtils.cuh
    assert "torch/extension.h" not in text and "CUDAApplyUtils" not in text


def test_an_empty_define_with_a_trailing_blank_keeps_the_else_branch(tmp_path):
    """`#define ROCM_ONLY(x) ` (causal-conv1d): the grammar took the next line, `#else`, as its
    body, and the ROCm branch (`namespace cub = hipcub;`) came into CUDA units."""
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "k.cu").write_text(
        "#ifndef USE_ROCM\n    #define ROCM_ONLY(x) \n#else\n    namespace cub = hipcub;\n"
        "    #define ROCM_ONLY(x) x\n#endif\n"
        "__global__ void k(float* x) { ROCM_ONLY(x[0] = 1;) x[1] = 2; }\n"
    )
    disc = discover(tmp_path)
    res = Extractor(disc).extract(kernel(disc, "k"), "test")
    assert "#define ROCM_ONLY(x) \n" in res.unit.text
    assert "hipcub" not in res.unit.text and "#else" not in res.unit.text


def test_an_if_inside_a_constructor_initializer_list_does_not_hide_the_rest_of_the_file(tmp_path):
    """mamba's reverse_scan.cuh: `#ifndef USE_ROCM` between a constructor and its initializer
    list made the grammar give up on the rest of the file, and BlockReverseScan, defined after
    it, was never found."""
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "scan.cuh").write_text(
        "template <int N> struct WarpScan {\n  int lane;\n"
        "  __device__ WarpScan()\n#ifndef USE_ROCM\n      : lane(threadIdx.x & 31)\n#else\n"
        "      : lane(threadIdx.x & 63)\n#endif\n  {}\n};\n"
        "template <typename T, int N> struct BlockReverseScan {\n"
        "  __device__ T run(T x) { WarpScan<N> w; return x + w.lane; }\n};\n"
    )
    (tmp_path / "k.cu").write_text(
        '#include "scan.cuh"\n'
        "__global__ void scan_kernel(float* x) {\n"
        "  x[0] = BlockReverseScan<float, 32>().run(x[0]);\n}\n"
    )
    disc = discover(tmp_path)
    assert disc.models["scan.cuh"].error_count == 0
    res = Extractor(disc).extract(kernel(disc, "scan_kernel"), "test")
    assert "struct BlockReverseScan" in res.unit.text and "struct WarpScan" in res.unit.text
    assert "#ifndef USE_ROCM" in res.unit.text  # the repository's own text, for nvcc to decide


def test_template_values_written_in_a_launch_macro_and_integer_aliases(tmp_path):
    """SparseConvNet launches `k<T, NTX, NTY><<<...>>>` inside `#define FOO(NTX, NTY)`, invoked
    as FOO(32, 8): the unit takes those values. A value parameter of an integer alias (`Int`)
    with no value anywhere gets 32, never 0 (a zero-sized shared array does not compile)."""
    from miner.compile import compile_unit
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "tile.cu").write_text(
        "#include <cstdint>\nusing Int = int32_t;\n"
        "template <typename T, Int NTX, Int NTY>\n"
        "__global__ void tile_kernel(T *x, Int n) {\n"
        "  __shared__ T buf[NTX];\n  buf[threadIdx.x % NTX] = x[threadIdx.x % n];\n"
        "  __syncthreads();\n  x[0] = buf[NTY % NTX];\n}\n"
        "#define TILE_LAUNCH(NTX, NTY) \\\n  { if (n % NTX == 0) { \\\n"
        "      tile_kernel<T, NTX, NTY><<<1, dim3(NTX, NTY)>>>(x, n); return; } }\n"
        "template <typename T> void tile(T *x, Int n) { TILE_LAUNCH(16, 8) TILE_LAUNCH(1, 64) }\n"
        "template <typename T, Int N>\n"
        "__global__ void row_kernel(T *x) { __shared__ T s[N]; s[0] = x[0]; x[1] = s[0]; }\n"
        "template <typename T, Int N> void row(T *x) { row_kernel<T, N><<<1, 1>>>(x); }\n"
    )
    disc = discover(tmp_path)
    ex = Extractor(disc)
    tile = ex.extract(kernel(disc, "tile_kernel"), "t").unit
    assert "constexpr auto NTX = 16;" in tile.text and "constexpr auto NTY = 8;" in tile.text
    row = ex.extract(kernel(disc, "row_kernel"), "t").unit
    assert "constexpr auto N = 32;" in row.text
    for unit in (tile, row):
        result = compile_unit(unit.text, unit.needs_torch, unit.instantiations)
        assert result.status.value == "ok", result.detail


def _unit_compiled(tmp_path, filename: str, source: str, kernel_name: str):
    """(extractor, the kernel's unit, its nvcc result) for one source file of a repository."""
    from miner.compile import compile_unit
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / filename).write_text(source)
    disc = discover(tmp_path)
    ex = Extractor(disc)
    unit = ex.extract(kernel(disc, kernel_name), "t").unit
    return ex, unit, compile_unit(unit.text, unit.needs_torch, unit.instantiations)


def test_a_launch_macro_handed_to_a_variadic_map_takes_the_maps_first_value(tmp_path):
    """state-spaces/s4 launches `k<log_N_val>` inside `#define CASE_LOG_N(log_N_val)`, never
    invoked itself but handed to `MAP(CASE_LOG_N, 1, 2, 3)`: the unit takes 1. With the
    fallback 32, `ITEMS[log_N - 1]` read past the table and the unit did not compile."""
    source = (
        "static constexpr int ITEMS[] = {2, 4, 8};\n"
        "template <int log_N, int items = ITEMS[log_N - 1]>\n"
        "__global__ void vand_kernel(float *x) { x[threadIdx.x] *= items * log_N; }\n"
        "#define MAP(m, a, b, c) m(a) m(b) m(c)\n"
        "void vand(float *x, int log_N) {\n  switch (log_N) {\n"
        "    #define CASE_LOG_N(log_N_val) case log_N_val: \\\n"
        "      vand_kernel<log_N_val><<<1, 32>>>(x); break;\n"
        "    MAP(CASE_LOG_N, 1, 2, 3)\n  }\n  #undef CASE_LOG_N\n}\n"
    )
    _, unit, result = _unit_compiled(tmp_path, "vand.cu", source, "vand_kernel")
    assert "constexpr auto log_N = 1;" in unit.text
    assert result.status.value == "ok", result.detail


def test_a_launchers_local_type_alias_pins_the_units_type(tmp_path):
    """state-spaces/s4's launcher says `using scalar_t = c10::complex<float>;` and launches
    `k<scalar_t, log_N>`: the unit instantiates the complex type once, never float, whose
    `result += v_t * w_t` has no operator for a complex operand. An alias of the launcher's
    own template parameter (`acc_t = acc_type<scalar_t>`) stays a dtype placeholder."""
    source = (
        "#include <complex>\n"
        "template <typename scalar_t, int log_N>\n"
        "__global__ void cauchy_kernel(const std::complex<float> *v, scalar_t *out) {\n"
        "  scalar_t r = 0;\n  r += v[threadIdx.x] * std::complex<float>(log_N, 0);\n"
        "  out[threadIdx.x] = r;\n}\n"
        "template <typename T, typename A> __global__ void acc_kernel(T *x, A a) { x[0] *= a; }\n"
        "template <typename T> struct acc { typedef double type; };\n"
        "void cauchy(const std::complex<float> *v, void *out, float *y) {\n"
        "  using scalar_t = std::complex<float>;\n"
        "  cauchy_kernel<scalar_t, 2><<<1, 32>>>(v, (scalar_t *)out);\n"
        "  typedef typename acc<float>::type acc_t;\n"
        "  acc_kernel<float, acc_t><<<1, 1>>>(y, acc_t(2));\n}\n"
    )
    ex, unit, result = _unit_compiled(tmp_path, "cauchy.cu", source, "cauchy_kernel")
    assert "using scalar_t = std::complex<float>;" in unit.text
    assert unit.instantiations == ["float"]
    assert result.status.value == "ok", result.detail
    acc = ex.extract(kernel(ex.disc, "acc_kernel"), "t").unit
    assert len(acc.instantiations) == 3  # `typename acc<float>::type` names no type here


def test_a_kernel_with_a_parameter_pack_is_instantiated_with_the_pack_empty(tmp_path):
    """`template <typename T, typename... Args> __global__ void k(T *out, Args... args)`, stamped
    by a macro that takes the kernel's name: the launch stub passes no `Args... args` (a name the
    stub does not declare, so the unit did not compile) and instantiates the pack empty."""
    source = (
        "#define KERNEL_WITH_PACK(name) \\\n"
        "  template <typename T, typename... Args> \\\n"
        "  __global__ void name(T *out, int n, Args... args) { out[n] = out[sizeof...(Args)]; }\n"
        "KERNEL_WITH_PACK(count_kernel)\n"
        "void count(float *o) { count_kernel<<<1, 1>>>(o, 3, 1, 2.0f); }\n"
    )
    _, unit, result = _unit_compiled(tmp_path, "pack.cu", source, "count_kernel")
    assert "void launch(T *out, int n) { count_kernel<T><<<1, 1>>>(out, n); }" in unit.text
    assert result.status.value == "ok", result.detail
    assert result.detail == "" and unit.instantiations == ["float", "double", "half"]


def test_a_variable_whose_type_ends_in_three_closing_brackets_is_a_variable(tmp_path):
    """`std::vector<std::vector<std::vector<Int>>> offsets = {...};` (SparseConvNet): the CUDA
    grammar reads `>>>` as a launch's end and gives an expression; the text says a variable,
    so a host function that reads it gets its definition."""
    from miner.discover import discover

    (tmp_path / "offsets.h").write_text(
        "#include <vector>\nusing Int = int;\n"
        "std::vector<std::vector<std::vector<Int>>> offsets = {{}, {{0}, {-1}}};\n"
        "int other = 3;\nFOO(1);\n"
    )
    (tmp_path / "k.cu").write_text('#include "offsets.h"\n__global__ void k(int *x) {}\n')
    items = [(it.kind, it.names) for it in discover(tmp_path).models["offsets.h"].items]
    assert ("variable", ("offsets",)) in items and ("variable", ("other",)) in items
    assert not any("FOO" in names for _, names in items)  # a macro call stays no variable


def test_a_class_whose_members_carry_eigens_qualifier_stays_one_type(tmp_path):
    """`EIGEN_DEVICE_FUNC static SE3 Exp(...)` inside a class (lietorch): the macro is Eigen's
    `__host__ __device__`; unexpanded, the class falls apart into pieces a unit cannot use."""
    from miner.discover import discover

    (tmp_path / "se3.h").write_text(
        "template <typename Scalar>\nclass SE3 {\n public:\n"
        "  EIGEN_DEVICE_FUNC SE3() : t(0) {}\n"
        "  EIGEN_DEVICE_FUNC static SE3<Scalar> Exp(Scalar x) { SE3<Scalar> s; s.t = x; "
        "return s; }\n  EIGEN_DEVICE_FUNC EIGEN_STRONG_INLINE Scalar get() const { return t; }\n"
        " private:\n  Scalar t;\n};\n"
    )
    (tmp_path / "k.cu").write_text(
        '#include "se3.h"\n__global__ void k(float *x) { x[0] = SE3<float>::Exp(x[1]).get(); }\n'
    )
    items = [(it.kind, it.names) for it in discover(tmp_path).models["se3.h"].items]
    assert items == [("type", ("SE3",))]


def test_a_macro_whose_body_holds_a_comment_is_whole(tmp_path):
    """`/* don't use TYPE again */ \\` inside a dispatch macro (lietorch, from PyTorch's own
    AT_DISPATCH): the grammar ends the macro's value at the comment; the item, and the label,
    keep every continued line and see the names used after it."""
    from miner.discover import discover

    (tmp_path / "dispatch.h").write_text(
        "#define DISPATCH(TYPE, ...)     \\\n  [&] {                          \\\n"
        "    const auto& t = TYPE;        \\\n    /* evaluate TYPE once */     \\\n"
        "    using group_t = SE3<float>;  \\\n    return __VA_ARGS__();        \\\n  }()\n"
        "int after = 1;\n"
    )
    (tmp_path / "k.cu").write_text('#include "dispatch.h"\n__global__ void k(float *x) {}\n')
    model = discover(tmp_path).models["dispatch.h"]
    (macro,) = [it for it in model.items if it.kind == "macro"]
    assert model.text[macro.start : macro.end].rstrip().endswith("}()")
    assert "SE3" in macro.refs and "group_t" in macro.refs
    # no item made of the lines the grammar read as code after the comment
    assert [(it.kind, it.names) for it in model.items] == [
        ("macro", ("DISPATCH",)),
        ("variable", ("after",)),
    ]


def test_a_cuda_files_own_build_switch_is_on(tmp_path):
    """detectron2's nms_rotated_cuda.cu includes its rotated-IoU helpers under `#ifdef
    WITH_CUDA` (setup.py defines it for the CUDA build): taken as undefined, the unit lost the
    helpers and `using namespace detectron2;` named nothing. A .cu file compiles only in the
    CUDA build, so its switches are on; a host file keeps its `#else` (it compiles either way)."""
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "utils.h").write_text(
        "#pragma once\nnamespace lib {\n"
        "template <typename T> __host__ __device__ T iou(const T* a, const T* b) {\n"
        "  return a[0] * b[0];\n}\n}  // namespace lib\n"
    )
    (tmp_path / "nms.cu").write_text(
        '#ifdef WITH_CUDA\n#include "utils.h"\n#endif\nusing namespace lib;\n'
        "template <typename T>\n__global__ void nms_kernel(const T* boxes, T* out) {\n"
        "  out[threadIdx.x] = iou<T>(boxes, boxes + 5);\n}\n"
        "void nms_cuda(float* b, float* o) { nms_kernel<float><<<1, 32>>>(b, o); }\n"
    )
    (tmp_path / "nms.cpp").write_text(
        "#ifdef WITH_CUDA\nint backend() { return 1; }\n#else\nint backend() { return 0; }\n"
        "#endif\n"
    )
    disc = discover(tmp_path)
    extractor = Extractor(disc)
    res = extractor.extract(kernel(disc, "nms_kernel"), "test")
    assert "T iou(const T* a, const T* b)" in res.unit.text
    assert res.unit.text.index("namespace lib {") < res.unit.text.index("using namespace lib;")
    host = extractor.linearizer.linear("nms.cpp")
    assert [extractor.linearizer.models["nms.cpp"].text[e.item.start : e.item.end].split("{")[1]
            for e in host.entries] == [" return 0; }"]  # fmt: skip


def test_a_macro_that_pastes_a_name_brings_the_macros_it_may_paste(tmp_path):
    """robin_hood.h (vendored by MinkowskiEngine and many more) asks `#if ROBIN_HOOD(CXX) >=
    ROBIN_HOOD(CXX14)` through `ROBIN_HOOD_PRIVATE_DEFINITION_##x()`: no word of the file names
    `ROBIN_HOOD_PRIVATE_DEFINITION_CXX14`, yet the unit needs it, or the preprocessor stops at
    `missing binary operator before token "("`."""
    (tmp_path / "hood.h").write_text(
        "#pragma once\n#define ROBIN_HOOD(x) ROBIN_HOOD_PRIVATE_DEFINITION_##x()\n"
        "#define ROBIN_HOOD_PRIVATE_DEFINITION_CXX() __cplusplus\n"
        "#define ROBIN_HOOD_PRIVATE_DEFINITION_CXX14() 201402L\n"
        "#define UNRELATED_DEFINITION_CXX() 1\n"
        "#if ROBIN_HOOD(CXX) >= ROBIN_HOOD(CXX14)\n#define HOOD_SCALE 2\n#else\n"
        "#define HOOD_SCALE 3\n#endif\n"
    )
    (tmp_path / "k.cu").write_text(
        '#include "hood.h"\n__global__ void k(float* x) { x[0] *= HOOD_SCALE; }\n'
        "void run(float* x) { k<<<1, 1>>>(x); }\n"
    )
    (text,) = unit_texts(tmp_path, "k")
    assert "#define ROBIN_HOOD_PRIVATE_DEFINITION_CXX14() 201402L" in text
    assert "#define ROBIN_HOOD_PRIVATE_DEFINITION_CXX() __cplusplus" in text
    assert "UNRELATED_DEFINITION_CXX" not in text  # only the pasted prefix's family
    assert pasted_refs("a##b", ["a", "b"]) == frozenset()  # two parameters: nothing to follow
    assert pasted_refs("x##_forward_impl", ["x"]) == {"*_forward_impl"}


@needs_nvcc
def test_a_namespace_a_macro_names_under_a_guard_opens_only_under_it(tmp_path):
    """robin_hood.h's C++11 fallback opens `namespace ROBIN_HOOD_STD {` only where the macro
    is not `std`; opened unguarded, it made `robin_hood::std`, and `using std::swap;` in
    robin_hood failed to compile in 6 of MinkowskiEngine's units."""
    from miner.compile import compile_unit

    (tmp_path / "hood.h").write_text(
        "#pragma once\n#define HOOD(x) HOOD_PRIVATE_DEFINITION_##x()\n"
        "#define HOOD_PRIVATE_DEFINITION_CXX() __cplusplus\n"
        "#define HOOD_PRIVATE_DEFINITION_CXX14() 201402L\n"
        "#include <utility>\n#include <type_traits>\nnamespace hood {\n"
        "#if HOOD(CXX) >= HOOD(CXX14)\n#define HOOD_STD std\n#else\n"
        "namespace HOOD_STD {\ntemplate <class T> struct alignment_of {\n"
        "  static const int value = alignof(T);\n};\n}\n#endif\n"
        "namespace detail {\nusing std::swap;\ntemplate <class T> struct nothrow {\n"
        "  static const bool value = noexcept(swap(std::declval<T&>(), std::declval<T&>()));\n"
        "};\ntemplate <class T> struct width {\n"
        "  static const int value = HOOD_STD::alignment_of<T>::value;\n};\n}\n}\n"
    )
    (tmp_path / "k.cu").write_text(
        '#include "hood.h"\n__global__ void k(float* x) {\n'
        "  x[0] = hood::detail::nothrow<float>::value;\n"
        "  x[1] = hood::detail::width<float>::value;\n"
        "}\nvoid run(float* x) { k<<<1, 1>>>(x); }\n"
    )
    (text,) = unit_texts(tmp_path, "k")
    opened = text.index("namespace HOOD_STD {")
    guard = text.rindex("#if", 0, opened)
    between = text[guard:opened].splitlines()
    assert between == ["#if (!(HOOD(CXX) >= HOOD(CXX14)))", "namespace hood {"]
    assert compile_unit(text, False, []).status.value == "ok"


def test_a_template_type_named_for_sizes_or_indices_is_an_integer(tmp_path):
    """MinkowskiEngine's `copy_column<dst_coordinate_type, src_coordinate_type, size_type,
    stride_src>` indexes with a `size_type`: instantiated as float, `x * coordinate_size` is no
    index and 9 of its units failed. Data types stay the dtype."""
    (tmp_path / "k.cu").write_text(
        "template <typename Dtype, typename size_type, typename MapItype,\n"
        "          typename coordinate_int_type>\n"
        "__global__ void k(Dtype* out, const Dtype* in, size_type n, const MapItype* map,\n"
        "                  coordinate_int_type stride) {\n"
        "  size_type i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "  if (i < n) out[i] = in[map[i] * stride];\n}\n"
    )
    (text,) = unit_texts(tmp_path, "k")
    stub = text[text.index("namespace kminer_inst_float {") :]
    stub = stub[: stub.index("}")]
    assert "using Dtype = float;" in stub
    for name in ("size_type", "MapItype", "coordinate_int_type"):
        assert f"using {name} = int;" in stub


@needs_nvcc
def test_a_functor_deriving_from_thrusts_removed_unary_function_compiles(tmp_path):
    """CCCL 3 (CUDA 13) removed `thrust::unary_function`; MinkowskiEngine's functors derive from
    it. The unit defines it again, only where the toolkit lacks it and the code uses it."""
    from miner.compile import compile_unit

    (tmp_path / "k.cu").write_text(
        "#include <thrust/functional.h>\n"
        "struct twice : public thrust::unary_function<float, float> {\n"
        "  __host__ __device__ float operator()(float x) const { return 2 * x; }\n};\n"
        "__global__ void k(float* x) { x[0] = twice()(x[0]); }\n"
        "__global__ void plain(float* x) { x[0] = 1; }\n"
    )
    text, plain = unit_texts(tmp_path, "k", "plain")
    assert "struct unary_function {" in text
    assert compile_unit(text, False, []).status.value == "ok"
    assert "unary_function {" not in plain


@needs_nvcc
def test_thcs_device_helpers_come_with_a_unit_whose_kernel_calls_them(tmp_path):
    """maskrcnn-benchmark's nms_kernel computes `THCCeilDiv(n_boxes, threadsPerBlock)` in device
    code, from <THC/THCDeviceUtils.cuh>, which torch no longer ships: the unit failed to compile.
    It gets the helper; a kernel that does not call it, or a repository that defines it (as a
    function or a macro), does not."""
    from miner.compile import compile_unit

    (tmp_path / "k.cu").write_text(
        "#include <THC/THC.h>\n#include <THC/THCDeviceUtils.cuh>\n"
        "__global__ void k(int n, long long* mask) {\n"
        "  mask[threadIdx.x * THCCeilDiv(n, 64) + THCRoundUp(n, 8)] = 1;\n}\n"
        "__global__ void plain(float* x) { x[0] = 1; }\n"
    )
    text, plain = unit_texts(tmp_path, "k", "plain")
    assert "#ifndef KMINER_THC_DEVICE_UTILS" in text and "THCCeilDiv" not in plain
    assert compile_unit(text, False, []).status.value == "ok"
    (tmp_path / "k.cu").write_text(
        "#define THCCeilDiv(a, b) (((a) + (b) - 1) / (b))\n"
        "__global__ void k(int n, int* out) { out[0] = THCCeilDiv(n, 64); }\n"
    )
    (own,) = unit_texts(tmp_path, "k")
    assert "KMINER_THC_DEVICE_UTILS" not in own
    assert compile_unit(own, False, []).status.value == "ok"


@needs_nvcc
def test_atens_kernel_loop_macro_comes_with_a_unit_whose_kernel_uses_it(tmp_path):
    """PyTorch-Encoding's `conv_rectify_cuda_frame` loops with `CUDA_KERNEL_LOOP(index, n)`,
    which ATen defines and the file gets through <ATen/ATen.h>: the unit (no torch) failed.
    It gets ATen's own definition; a repository that defines the macro keeps its own."""
    from miner.compile import compile_unit

    (tmp_path / "k.cu").write_text(
        "#include <ATen/ATen.h>\n"
        "__global__ void k(int n, float* x) {\n  CUDA_KERNEL_LOOP(i, n) { x[i] = 2 * x[i]; }\n}\n"
    )
    (text,) = unit_texts(tmp_path, "k")
    assert "#define CUDA_KERNEL_LOOP(i, n) CUDA_KERNEL_LOOP_TYPE(i, n, int)" in text
    assert "#include <ATen" not in text  # no torch
    assert compile_unit(text, False, []).status.value == "ok"
    (tmp_path / "k.cu").write_text(
        "#define CUDA_KERNEL_LOOP(i, n) for (int i = threadIdx.x; i < (n); i += blockDim.x)\n"
        "__global__ void k(int n, float* x) {\n  CUDA_KERNEL_LOOP(i, n) { x[i] = 2 * x[i]; }\n}\n"
    )
    (own,) = unit_texts(tmp_path, "k")
    assert "CUDA_KERNEL_LOOP_TYPE" not in own
    assert compile_unit(own, False, []).status.value == "ok"


def test_a_standard_name_torch_used_to_bring_gets_its_header(tmp_path):
    """MinkowskiEngine's storage.cuh prints with `std::setprecision` and never includes
    <iomanip>: under torch/extension.h it came along; a unit includes less."""
    from miner.closure import Closure
    from miner.discover import discover
    from miner.linearize import Entry, ExternalInclude
    from miner.unit import compat_lines

    (tmp_path / "k.cu").write_text(
        "#include <iostream>\n"
        "inline void show(float x) { std::cout << std::setprecision(3) << x; }\n"
        "__global__ void k(float* x) { x[0] = 1; }\n"
    )
    disc = discover(tmp_path)
    show = next(it for it in disc.models["k.cu"].items if it.names == ("show",))
    bare = Closure([Entry(show, ())], [ExternalInclude("iostream", True, (), "k.cu")], False)
    assert compat_lines(bare, disc.models) == ["#include <iomanip>"]
    own = [ExternalInclude(h, True, (), "k.cu") for h in ("iostream", "iomanip")]
    assert compat_lines(Closure([Entry(show, ())], own, False), disc.models) == []


@needs_nvcc
def test_names_torch_extension_h_brought_get_their_own_headers_in_a_unit(tmp_path):
    """flash-fft-conv's kernels read `c10::complex<at::Half>` filters, overload `set_value` on
    `__nv_bfloat162*` and pick `__shfl_xor_sync` by `#if CUDA_VERSION >= 9000`: torch/extension.h
    brought c10/util/complex.h, cuda_bf16.h and cuda.h, a unit's lighter includes none of them,
    and 65 of its 97 units did not compile."""
    from miner.compile import compile_unit

    (tmp_path / "k.cu").write_text(
        "#include <torch/extension.h>\n"
        "using complex_half_t = typename c10::complex<at::Half>;\n"
        "__device__ __forceinline__ void set_value(__nv_bfloat162* d, float2 s) {\n"
        "  *d = __float22bfloat162_rn(s);\n}\n"
        "__device__ __forceinline__ void set_value(float2* d, float2 s) { *d = s; }\n"
        "template <typename T>\n__device__ __forceinline__ T xor_shfl(T v, int m) {\n"
        "#if CUDA_VERSION >= 9000\n  return __shfl_xor_sync(0xffffffff, v, m);\n"
        "#else\n  return __shfl_xor(v, m);\n#endif\n}\n"
        "__global__ void k(const complex_half_t* f, float2* out, __nv_bfloat162* low) {\n"
        "  float2 v = make_float2(float(f[threadIdx.x].real()), xor_shfl(1.0f, 1));\n"
        "  set_value(out + threadIdx.x, v);\n  set_value(low + threadIdx.x, v);\n}\n"
    )
    (text,) = unit_texts(tmp_path, "k")
    for header in ("c10/util/complex.h", "cuda_bf16.h", "cuda.h"):
        assert f"#include <{header}>" in text
    assert "torch/extension.h" not in text
    assert compile_unit(text, True, []).status.value == "ok"


@needs_nvcc
def test_a_pulsar_like_header_kernel_keeps_its_operators_and_restrict_parameters(tmp_path):
    """pytorch3d's pulsar renderer: `a.cam == b.cam` inside `operator==(Renderer, Renderer)`
    needs CamInfo's own operator==, which libclang's reach from the kernel dropped (3 operators
    of that name in 3 headers); `float const* const RESTRICT bg` (`#define RESTRICT
    __restrict__`) parsed as two parameters; and the constexpr std::max called from a kernel
    needs nvcc's relaxed constexpr, which every torch extension build passes."""
    from miner.compile import compile_unit
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "global.h").write_text(
        "#pragma once\n#include <algorithm>\n#define RESTRICT __restrict__\n"
        "struct vec3 { float x, y, z; };\n"
        "inline bool operator==(const vec3& a, const vec3& b) { return a.x == b.x; }\n"
    )
    (tmp_path / "camera.h").write_text(
        '#pragma once\n#include "global.h"\nstruct CamInfo { vec3 eye; int width; };\n'
        "inline bool operator==(const CamInfo& a, const CamInfo& b) {\n"
        "  return a.eye == b.eye && a.width == b.width;\n};\n"
    )
    (tmp_path / "renderer.h").write_text(
        '#pragma once\n#include "camera.h"\nstruct Renderer { CamInfo cam; float* out; int n; };\n'
        "inline bool operator==(const Renderer& a, const Renderer& b) {\n"
        "  return a.cam == b.cam && a.n == b.n;\n}\n"
    )
    (tmp_path / "fill.device.h").write_text(
        '#pragma once\n#include "renderer.h"\n'
        "template <bool DEV>\n__global__ void fill_bg(Renderer r, const CamInfo cam,\n"
        "    float const* const RESTRICT bg, /** the background */\n    const int mode) {\n"
        "  int i = threadIdx.x;\n  if (i < std::max(r.n, cam.width)) r.out[i] = bg[mode];\n}\n"
    )
    (tmp_path / "fill.cu").write_text(
        '#include "fill.device.h"\n'
        "void launch(Renderer r, CamInfo c, const float* bg) {\n"
        "  fill_bg<true><<<1, 32>>>(r, c, bg, 0);\n}\n"
    )
    disc = discover(tmp_path)
    k = kernel(disc, "fill_bg")
    assert [p[1] for p in k.kdef.params] == ["r", "cam", "bg", "mode"]
    unit = Extractor(disc).extract(k, "t").unit
    assert "operator==(const CamInfo& a" in unit.text
    result = compile_unit(unit.text, unit.needs_torch, unit.instantiations)
    assert result.status.value == "ok", result.detail
