"""Wrappers: mined launchers, rule wrappers, bindability, op chains, and the batched build."""

from __future__ import annotations

import pytest
from conftest import FIXTURES, kernel, label_of, needs_nvcc

from miner.candidate import Provenance
from miner.repo_model import to_candidate
from wrappers.batching import batch_source, split_label
from wrappers.batching import blame as _blame
from wrappers.label import unit_parts
from wrappers.mined import LauncherIndex, mine_wrapper
from wrappers.opmap import op_map
from wrappers.rule import rule_wrapper
from wrappers.signature import bindable, bindable_type, parse_signature

OPCHAIN = FIXTURES / "opchain"


@pytest.fixture(scope="module")
def opchain():
    from miner.discover import discover
    from miner.extract import Extractor

    disc = discover(OPCHAIN)
    return disc, Extractor(disc), LauncherIndex(disc)


@pytest.mark.parametrize(
    ("type_text", "ok"),
    [
        ("Tensor", True),
        ("const at::Tensor &", True),
        ("std::vector<int64_t>", True),
        ("c10::optional<at::Tensor>", True),
        ("at::IntArrayRef", True),
        ("float*", False),
        ("cudaStream_t", False),
        ("tv::TensorView<float>", False),
        ("const int", True),
        ("uint", True),  # the POSIX spellings (flash-fft-conv: `uint padding`)
        ("const ushort", True),
    ],
)
def test_bindable_types(type_text, ok):
    assert bindable_type(type_text) is ok


def test_signature_parsing_templates_and_enums():
    sig = parse_signature(
        "template <unsigned NDim>\nstd::vector<torch::Tensor> Launch("
        "torch::Tensor x, int64_t k = 3) {}",
        "Launch",
    )
    assert sig.template and sig.returns == "std::vector<torch::Tensor>"
    assert sig.params == [("torch::Tensor", "x"), ("int64_t", "k")]
    assert not bindable(sig)
    sig.template_args = "3"
    assert bindable(sig) and sig.reference() == "&Launch<3>"
    enum_sig = parse_signature("void f(const at::Tensor& x, const Mode m) {}", "f", ("ns",))
    assert not bindable(enum_sig) and bindable(enum_sig, frozenset({"Mode"}))
    assert "static_cast<Mode>(a1)" in enum_sig.reference(frozenset({"Mode"}))


def test_mined_label_holds_launcher_kernel_and_binding(opchain):
    w, label = label_of(*opchain, "square_kernel")
    text = label.text
    assert w.chain == ["SquareForwardCUDAKernelLauncher"]
    for needed in (
        "void SquareForwardCUDAKernelLauncher(Tensor x, Tensor y)",
        "__global__ void square_kernel",
        "#define THREADS 256",
        "inline int blocks_for",
        "using at::Tensor;",
        "#include <c10/cuda/CUDAGuard.h>",
        'm.def("SquareForwardCUDAKernelLauncher", &SquareForwardCUDAKernelLauncher)',
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)",
    ):
        assert needed in text, needed
    assert "reduce_rows_kernel" not in text  # only what this launcher needs


def test_enum_launcher_is_bound_through_an_int(opchain):
    _, label = label_of(*opchain, "reduce_rows_kernel")
    assert "int64_t a2) { ReduceRowsCUDAKernelLauncher(a0, a1, static_cast<Reduce>(a2)); }" in (
        label.text
    )
    assert "enum class Reduce" in label.text


def test_functor_launch_from_another_translation_unit(opchain):
    w, label = label_of(*opchain, "shift_kernel")
    assert w.chain == ["ShiftFunctor", "ShiftCUDAKernelLauncher"]
    text = label.text
    spec, launcher = (
        text.index("struct ShiftFunctor<GPU, float>"),
        text.index("Tensor ShiftCUDAKernelLauncher("),
    )
    assert text.index("template <typename Device, typename T> struct ShiftFunctor;") < spec
    assert spec < launcher  # the specialization precedes its use
    assert "__global__ void shift_kernel" in text


def test_launcher_compiled_inside_an_umbrella_gets_the_umbrellas_context(traps, traps_extractor):
    # scale_part.cu is compiled only inside umbrella_cuda.cu, after types.h: its launcher's
    # label needs `Int` and PART_THREADS from there, as the kernel's unit does
    w = mine_wrapper(kernel(traps, "scale_part_kernel"), traps_extractor, LauncherIndex(traps))
    assert w is not None and w.chain == ["scale_part_cuda"]
    assert "typedef int Int;" in w.code and "#define PART_THREADS 128" in w.code
    assert w.code.index("typedef int Int;") < w.code.index("torch::Tensor scale_part_cuda(")


def test_op_map_follows_the_registry_to_the_cpu_twin(opchain):
    disc, _, index = opchain
    m = op_map(disc, ["SquareForwardCUDAKernelLauncher"], index.callers)
    assert m["dispatch_key"] == "square_forward_impl"
    assert m["device_fn"] == "square_forward_cuda" and m["op_file"] == "ops/square.cpp"
    assert (m["cpu_fn"], m["cpu_file"]) == ("square_forward_cpu", "ops/cpu/square.cpp")
    assert m["python_name"] == "square_forward"


def test_rule_wrapper_for_a_kernel_nobody_launches(traps, traps_extractor):
    fk = kernel(traps, "legacy_norm_kernel")
    assert not traps.launches[id(fk.kdef)]
    cand = to_candidate(fk, traps, Provenance(repo_url="r", commit="c" * 40))
    cand.unit.compiled_types = ["float"]
    rule = rule_wrapper(cand)
    assert rule is not None
    assert "legacy_norm_kernel<<<blocks, threads, 0, stream>>>" in rule.host_code
    assert "numel()" in rule.host_code and "TORCH_CHECK" in rule.host_code
    _, device = unit_parts(traps_extractor.extract(fk, "t").unit.text)
    assert "kminer_inst" not in device and "__global__ void legacy_norm_kernel" in device


def test_no_rule_for_kernels_with_shapes(traps):
    for name in ("block_sum_kernel", "gather_kernel", "poly_eval_kernel"):
        cand = to_candidate(kernel(traps, name), traps, Provenance(repo_url="r", commit="c"))
        assert rule_wrapper(cand) is None, name


def test_batch_source_namespaces_bodies_and_hoists_includes(opchain):
    _, a = label_of(*opchain, "square_kernel")
    _, b = label_of(*opchain, "shift_kernel")
    source, owners = batch_source([("aa", a.text), ("bb", b.text)], "kminer_batch")
    assert source.count("#include <c10/cuda/CUDAGuard.h>") == 1
    assert source.count("#include <torch/extension.h>") == 1
    assert 'namespace kminer_aa {\n#line 2 "kminer_aa.cu"' in source
    assert "#undef THREADS" in source  # macros do not leak into the next label
    assert "kminer_bb::kminer_bind(s);" in source and "PYBIND11_MODULE(kminer_batch" in source
    assert owners and all(ids <= {"aa", "bb"} for ids in owners.values())
    _, body = split_label(a.text)
    assert body.startswith("//") and "kminer_bind" in body and "PYBIND11_MODULE" not in body


def test_operators_on_cuda_vector_types_stay_at_global_scope():
    """Inside the label's namespace, an `operator+` for float2 is found by no lookup from
    CUB's code (which finds operators by argument-dependent lookup, in float2's namespace):
    it goes ahead of the namespace, once per batch, and the body keeps its line count."""
    label = (
        "#include <cuda_runtime.h>\n// kminer-label-body-begin\n"
        "inline __device__ float2 operator+(const float2 & a, const float2 & b){\n"
        "    return {a.x + b.x, a.y + b.y};\n}\n"
        "struct Acc { float v; };\n"
        "__device__ Acc operator+(const Acc &a, const Acc &b) { return {a.v + b.v}; }\n"
        "void kminer_bind(pybind11::module_& m) {}\n"
    )
    source, _ = batch_source([("aa", label), ("bb", label)], "kminer_batch")
    hoisted = source.index("inline __device__ float2 operator+")
    assert source.count("inline __device__ float2 operator+") == 1  # once for both labels
    assert hoisted < source.index("namespace kminer_aa {")
    assert source.count("operator+(const Acc &a") == 2  # the label's own type: stays inside
    aa = source[source.index("namespace kminer_aa {") : source.index("}  // namespace kminer_aa")]
    assert aa.count("\n") == source[source.index("namespace kminer_bb {") :].split(
        "}  // namespace kminer_bb"
    )[0].count("\n")


def test_a_body_in_a_library_namespace_still_names_the_library(tmp_path):
    """longcw/RoIAlign.pytorch defines its host functions in `namespace torch`: inside the
    label's namespace that is `kminer_<id>::torch`, where `torch::Tensor` was no type, and
    both its labels failed to build. Checked by g++ against torch's headers."""
    import subprocess
    import sysconfig

    from miner import toolchain

    label = (
        "#include <torch/extension.h>\n// kminer-label-body-begin\n"
        "namespace torch {\n"
        "torch::Tensor twice(torch::Tensor x) { Tensor y = x * 2; return y; }\n"
        "}  // namespace torch\n"
        'void kminer_bind(pybind11::module_& m) { m.def("twice", &torch::twice); }\n'
        "// kminer-label-body-end\n"
    )
    source, _ = batch_source([("aa", label), ("bb", label)], "kminer_batch")
    assert source.count("namespace torch { using namespace ::torch; }") == 2
    (tmp_path / "batch.cpp").write_text(source)
    include = [*toolchain.torch_include_dirs(), sysconfig.get_paths()["include"]]
    argv = ["g++", f"-std={toolchain.cxx_standard()}", "-fsyntax-only", "-w"]
    argv += [f"-I{d}" for d in include] + ["batch.cpp"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    plain, _ = batch_source([("cc", label.replace("namespace torch", "namespace roi"))])
    assert "using namespace ::roi" not in plain  # a namespace of the repository's own: as is


def test_blame_attributes_errors_to_labels():
    log = (
        'kminer_aa.cu(12): error: identifier "x" is undefined\n\n'
        "torch/include/ATen/core/x.h(3): error: no instance of function\n"
        "          detected during instantiation at line 40 of kminer_bb.cu\n"
        "batch.cu:5:10: fatal error: missing.h: No such file or directory\n"
    )
    blamed = _blame(log, {5: {"cc"}})
    assert set(blamed) == {"aa", "bb", "cc"}
    assert blamed["aa"].startswith("label.cu(12): error: identifier")
    # an error in one label whose note points into another (an unclosed namespace): its own
    cascade = (
        'kminer_dd.cu(265): error: expected a "}"\n'
        'kminer_ee.cu(3): note #3196-D: to match this "{"\n'
    )
    assert set(_blame(cascade, {})) == {"dd"}


@needs_nvcc
@pytest.mark.slow
def test_batch_build_isolates_a_broken_label(opchain):
    from wrappers.build import build_batch

    _, good = label_of(*opchain, "square_kernel")
    _, functor = label_of(*opchain, "shift_kernel")
    broken = good.text.replace("int n = x.numel();", "int n = x.numel() + undefined_thing;")
    # pytorch_scatter overloads __shfl_up_sync for at::Half at global scope and calls it with
    # bfloat16 too: inside the label's namespace the global overloads must stay visible
    intrinsic = good.text.replace(
        "// kminer-label-body-begin\n",
        "// kminer-label-body-begin\n"
        "__device__ __inline__ at::Half __shfl_up_sync(const unsigned mask, const at::Half var,\n"
        "                                              const unsigned int delta) {\n"
        "  return __shfl_up_sync(mask, var.operator __half(), delta);\n}\n"
        "template <typename T> __device__ T shift_up(T v) { return __shfl_up_sync(~0u, v, 1); }\n"
        "template __device__ at::BFloat16 shift_up<at::BFloat16>(at::BFloat16);\n"
        "template __device__ at::Half shift_up<at::Half>(at::Half);\n",
    )
    # mamba defines `operator+` for float2 at global scope, and CUB's reduction finds it by
    # argument-dependent lookup: it must stay out of the label's namespace
    vector_op = good.text.replace(
        "// kminer-label-body-begin\n",
        "#include <cub/block/block_reduce.cuh>\n// kminer-label-body-begin\n"
        "inline __device__ float2 operator+(const float2 &a, const float2 &b) {\n"
        "  return {a.x + b.x, a.y + b.y};\n}\n"
        "__global__ void sum2(float2 *x) {\n"
        "  using Reduce = cub::BlockReduce<float2, 32>;\n"
        "  __shared__ typename Reduce::TempStorage scratch;\n"
        "  float2 total = Reduce(scratch).Sum(x[threadIdx.x]);\n"
        "  if (threadIdx.x == 0) x[0] = total;\n}\n",
        1,
    )
    # NVIDIA's helper_math.h (torchmcubes and many more vendor it) overloads CUDA's vector
    # constructors and math functions: in the namespace, CUDA's own must stay visible
    helper_math = good.text.replace(
        "// kminer-label-body-begin\n",
        "// kminer-label-body-begin\n"
        "inline __host__ __device__ float2 make_float2(float s) { return make_float2(s, s); }\n"
        "inline __host__ __device__ float2 fminf(float2 a, float2 b) {\n"
        "  return make_float2(fminf(a.x, b.x), fminf(a.y, b.y));\n}\n"
        "inline __host__ __device__ int2 min(int2 a, int2 b) {\n"
        "  return make_int2(min(a.x, b.x), min(a.y, b.y));\n}\n"
        "inline __device__ float2 floorf(float2 v) {\n"
        "  return make_float2(floorf(v.x), floorf(v.y));\n}\n",
        1,
    )
    labels = [("good", good.text), ("functor", functor.text), ("broken", broken)]
    labels += [("helper_math", helper_math)]
    results = build_batch([*labels, ("intrinsic", intrinsic), ("vector_op", vector_op)])
    assert results["good"].ok and results["functor"].ok, results
    assert results["helper_math"].ok, results["helper_math"].detail
    assert results["intrinsic"].ok, results["intrinsic"].detail
    assert results["vector_op"].ok, results["vector_op"].detail
    assert not results["broken"].ok and "undefined_thing" in results["broken"].detail


def test_parallel_builds_are_capped_by_batches_and_memory():
    from wrappers.build_stage import GB_PER_BUILD, build_workers

    assert build_workers(1, 10) == 1
    assert build_workers(8, 2) <= 2
    with open("/proc/meminfo") as fh:
        avail = int(dict(ln.split(":", 1) for ln in fh)["MemAvailable"].split()[0]) / 1024**2
    assert build_workers(1000, 1000) == max(1, int(avail // GB_PER_BUILD))


def test_a_kernel_launched_by_several_ops_belongs_to_the_one_named_like_its_file():
    from wrappers.mined import _home

    kernel = "mmcv/ops/csrc/common/cuda/nms_cuda_kernel.cuh"
    ranked = sorted(
        ["mmcv/ops/csrc/pytorch/cuda/iou3d_cuda.cu", "mmcv/ops/csrc/pytorch/cuda/nms_cuda.cu"],
        key=lambda f: -_home(kernel, f),
    )
    assert ranked[0].endswith("/nms_cuda.cu")
    assert _home("a/roi_align_cuda_kernel.cuh", "b/roi_align_rotated_cuda.cu") == len("roi_align_")


def test_a_launch_written_in_a_macro_is_launched_by_the_functions_that_invoke_it(tmp_path):
    """`#define FOO(NTX) { k<T, NTX><<<...>>>(...); }` expanded by `void k_f(T *x, int n)`: the
    launcher is k_f, and the tensor function calling it is exposed."""
    text = (
        "#include <torch/extension.h>\n"
        "template <typename T, int NTX>\n"
        "__global__ void k(T *x, int n) { if (threadIdx.x < n) x[threadIdx.x] *= NTX; }\n"
        "#define FOO(NTX) \\\n  { if (n % NTX == 0) { k<T, NTX><<<1, NTX>>>(x, n); return; } }\n"
        "template <typename T>\nvoid k_f(T *x, int n) {\n  FOO(4);\n  FOO(1);\n}\n"
        "at::Tensor k_forward(at::Tensor x) {\n"
        "  k_f<float>(x.data_ptr<float>(), x.numel());\n  return x;\n}\n"
    )
    w = _mined_from(tmp_path, "k.cu", text, "k")
    assert w is not None and w.chain == ["k_f", "k_forward"]
    assert "#define FOO(NTX)" in w.code and "void k_f(" in w.code


def test_a_macro_name_defined_again_launches_from_the_functions_in_its_own_scope(tmp_path):
    """SparseConvNet's AffineReluTrivialConvolution.cu defines `FOO` before the forward and
    again (after `#undef FOO`) before the backward, and both functions expand it as bare
    statements without semicolons (`FOO(T, 32, 8)` on its own line), which the grammar reads
    as one broken expression that swallows the rest of the file. Each kernel is launched by
    the function that expands its own `FOO`, and the backward is found at all."""
    from miner.discover import discover
    from wrappers.mined import launcher_candidates

    (tmp_path / "k.cu").write_text(
        "template <typename T, int K>\n"
        "__global__ void fwd_k(T *x, int n) { if (threadIdx.x < n) x[threadIdx.x] *= K; }\n"
        "template <typename T, int K>\n"
        "__global__ void bwd_k(T *x, int n) { if (threadIdx.x < n) x[threadIdx.x] /= K; }\n"
        "#define FOO(T, K) \\\n  { if (n % K == 0) { fwd_k<T, K><<<1, K>>>(x, n); return; } }\n"
        "template <typename T>\nvoid fwd(T *x, int n) {\n  FOO(T, 4)\n  FOO(T, 1)\n}\n"
        "#undef FOO\n"
        "#define FOO(T, K) \\\n  { if (n % K == 0) { bwd_k<T, K><<<1, K>>>(x, n); return; } }\n"
        "template <typename T>\nvoid bwd(T *x, int n) {\n  FOO(T, 8)\n  FOO(T, 2)\n}\n"
        "#undef FOO\n"
        "template <typename T>\nvoid after(T *x, int n) { fwd<T>(x, n); }\n"
    )
    disc = discover(tmp_path)
    index = LauncherIndex(disc)
    assert [it.names[0] for it in launcher_candidates(kernel(disc, "fwd_k"), disc, index)] == [
        "fwd"
    ]
    assert [it.names[0] for it in launcher_candidates(kernel(disc, "bwd_k"), disc, index)] == [
        "bwd"
    ]
    functions = [it.names[0] for it in disc.models["k.cu"].items if it.kind == "function"]
    assert functions == ["fwd", "bwd", "after"]  # nothing after the bare statements is lost
    sites = {
        k.name: disc.launches[id(k)] for k in (kernel(disc, n).kdef for n in ("fwd_k", "bwd_k"))
    }
    assert [s.template_args for s in sites["fwd_k"]] == ["T, 4"]  # its own FOO's first use
    assert [s.template_args for s in sites["bwd_k"]] == ["T, 8"]  # not the forward's


def test_only_bare_macro_statements_are_blanked_for_the_grammar():
    from miner.textprep import blank_bare_macro_calls

    source = "void f() {\n  FOO(T, 4)\n  BAR(x);\n  y = MAX(a, b);\n  FOO(T, 1)\n}\nTOP(k)\n"
    blanked = blank_bare_macro_calls(source)
    assert len(blanked) == len(source) and blanked.count("\n") == source.count("\n")
    assert "FOO" not in blanked  # statements of their own, no semicolon: blanked
    assert "BAR(x);" in blanked and "MAX(a, b)" in blanked  # a statement, an expression
    assert "TOP(k)" in blanked  # outside any function: a declaration macro, left to the grammar


POINTER_LAUNCHER = """#include <cstdint>
using Int = int32_t;
using Rules = std::vector<std::vector<Int>>;
template <typename T>
__global__ void pool_fp(T *in, T *out, Int n, const Int *rules, bool average) {
  Int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = average ? in[rules[i]] / 2 : in[rules[i]];
}
template <typename T>
void pool_ForwardPass(T *in, T *out, Int n, const Int *rules, bool average, Rules unused) {
  pool_fp<T><<<(n + 127) / 128, 128>>>(in, out, n, rules, average);
}
struct Metadata { Int size; };
template <typename T> void cuda_pool(Metadata &m, T *in, T *out, const Int *rules) {
  pool_ForwardPass<T>(in, out, m.size, rules, false, {});
}
template void cuda_pool<float>(Metadata &, float *, float *, const Int *);
#define EACH_RULE(X, Y) { for (int k = 0; k < 2; ++k) { X } }
template <typename T>
__global__ void unpool_fp(T *in, T *out, Int n) {
  Int i = threadIdx.x;
  if (i < n) out[i] = in[i];
}
template <typename T>
void unpool_ForwardPass(T *in, T *out, Int n) {
  EACH_RULE((unpool_fp<T><<<1, 32>>>(in, out, n));
            , )
}
template <typename T> void cuda_unpool(Metadata &m, T *in) { unpool_ForwardPass<T>(in, in, 2); }
"""


def _mined_from(tmp_path, file: str, text: str, name: str, dtypes=()):
    """The mined wrapper of kernel `name` in a one-file repository holding `text`."""
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / file).write_text(text)
    disc = discover(tmp_path)
    return mine_wrapper(kernel(disc, name), Extractor(disc), LauncherIndex(disc), dtypes)


def _pointer_launcher_label(tmp_path, dtypes=()):
    return _mined_from(tmp_path, "pool.cu", POINTER_LAUNCHER, "pool_fp", dtypes)


def test_a_launcher_of_raw_pointers_is_bound_through_an_adapter(tmp_path):
    """No caller takes what pybind can pass (a Metadata &): the launcher itself is bound, each
    pointer a tensor's data, each number (an alias of int32_t) a Python int, the template
    instantiated for the first T* tensor's dtype."""
    w = _pointer_launcher_label(tmp_path)
    assert w is not None and w.chain == ["pool_ForwardPass"]
    (fn,) = w.functions()
    assert fn.name == "kminer_pool_ForwardPass"
    assert (
        "void kminer_pool_ForwardPass(at::Tensor in, at::Tensor out, int64_t n, at::Tensor rules, "
        "bool average, std::vector<std::vector<int32_t>> unused)" in w.code
    )
    assert "if (in.scalar_type() == at::kDouble) {\n    using scalar_t = double;" in w.code
    assert (
        "pool_ForwardPass<scalar_t>(in.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), "
        "static_cast<Int>(n), rules.data_ptr<Int>()" in w.code
    )
    assert "struct Metadata" not in w.code  # the unbindable caller stays out
    # a unit that compiled for float only (double asked too much shared memory): float only
    only = _pointer_launcher_label(tmp_path, ("float", "half"))
    assert "at::kFloat" in only.code and "at::kDouble" not in only.code
    assert 'TORCH_CHECK(false, "pool_ForwardPass: float only")' in only.code


def test_a_pointer_launcher_that_returns_a_number_hands_it_back(tmp_path):
    """SparseConvNet's `double dConvolution_forward2(T *in, T *out, T *w, RuleBook rules,
    ...)` returns its flop count: the adapter returns it as a Python number (and passes the
    rule book, a vector of vectors of ints, as pybind converts it)."""
    text = (
        "#include <cstdint>\nusing Int = int32_t;\n"
        "using RuleBook = std::vector<std::vector<Int>>;\n"
        "template <typename T>\n__global__ void mm(T *in, T *out, Int n) {\n"
        "  if (threadIdx.x < n) out[threadIdx.x] = in[threadIdx.x];\n}\n"
        "template <typename T>\ndouble conv_forward2(T *in, T *out, RuleBook rules, Int n) {\n"
        "  mm<T><<<1, 32>>>(in, out, n);\n  return 2.0 * n * rules.size();\n}\n"
        "struct Metadata { Int size; };\n"
        "template <typename T>\n"
        "void cuda_conv(Metadata &m, T *in) { conv_forward2<T>(in, in, {}, 2); }\n"
    )
    w = _mined_from(tmp_path, "conv.cu", text, "mm")
    assert w is not None and w.chain == ["conv_forward2"]
    assert (
        "double kminer_conv_forward2(at::Tensor in, at::Tensor out, "
        "std::vector<std::vector<int32_t>> rules, int64_t n)" in w.code
    )
    assert "return static_cast<double>(conv_forward2<scalar_t>(" in w.code
    assert [f.name for f in w.functions()] == ["kminer_conv_forward2"]


def test_a_launcher_the_grammar_reads_as_a_declaration_is_still_a_launcher(tmp_path):
    """A body holding a macro call without its semicolon (SparseConvNet's RULEBOOKITERATOR)
    makes tree-sitter read the whole function as a declaration: it is still the launcher."""
    w = _mined_from(tmp_path, "pool.cu", POINTER_LAUNCHER, "unpool_fp")
    assert w is not None and w.chain == ["unpool_ForwardPass"]
    assert "void kminer_unpool_ForwardPass(at::Tensor in, at::Tensor out, int64_t n)" in w.code


@needs_nvcc
@pytest.mark.slow
def test_the_adapted_label_builds(tmp_path):
    from miner.discover import discover
    from miner.extract import Extractor
    from wrappers.build import build_batch

    (tmp_path / "pool.cu").write_text(POINTER_LAUNCHER)
    disc = discover(tmp_path)
    _, label = label_of(disc, Extractor(disc), LauncherIndex(disc), "pool_fp")
    result = build_batch([("adapted", label.text)])["adapted"]
    assert result.ok, result.detail


def test_a_cpu_namesake_of_the_launcher_is_no_caller_of_it(tmp_path):
    """SparseConvNet defines `BatchNormalization_ForwardPass` in CPU/ and in CUDA/: the CPU
    op calls its own, so it must not lead the wrapper up to the CPU build's binding (a label
    that never launches its kernel)."""
    from miner.discover import discover
    from wrappers.mined import LauncherIndex

    (tmp_path / "cpu").mkdir()
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cpu" / "bn.cpp").write_text(
        "template <typename T> void forward_pass(T *x, int n) { for (int i = 0; i < n; i++) "
        "x[i] *= 2; }\n"
        "template <typename T> void cpu_bn(T *x, int n) { forward_pass<T>(x, n); }\n"
    )
    (tmp_path / "cuda" / "bn.cu").write_text(
        "template <typename T> __global__ void k(T *x, int n) { x[threadIdx.x] *= 2; }\n"
        "template <typename T> void forward_pass(T *x, int n) { k<T><<<1, n>>>(x, n); }\n"
        "template <typename T> void cuda_bn(T *x, int n) { forward_pass<T>(x, n); }\n"
    )
    disc = discover(tmp_path)
    index = LauncherIndex(disc)
    items = {
        (f, it.names[0]): it
        for f, m in disc.models.items()
        for it in m.items
        if it.kind == "function" and it.names
    }
    launcher = items[("cuda/bn.cu", "forward_pass")]
    assert index.calls_its_own(items[("cpu/bn.cpp", "cpu_bn")], "forward_pass", launcher)
    assert not index.calls_its_own(items[("cuda/bn.cu", "cuda_bn")], "forward_pass", launcher)


def test_a_call_inside_a_local_macro_is_a_call_of_the_function_using_it(tmp_path):
    """SparseConvNet's `bn_f` calls its launcher once per tile size through a `#define` in the
    same file: the call is in the macro's text, and the caller is the function that uses it."""
    from miner.discover import discover
    from wrappers.mined import LauncherIndex

    (tmp_path / "bn.cu").write_text(
        "template <typename T, int N> __global__ void k(T *x, int n) { x[threadIdx.x] *= N; }\n"
        "template <typename T, int N> void forward_pass(T *x, int n) { k<T, N><<<1, n>>>(x, n); }\n"
        "#define CALL(N) forward_pass<T, N>(x, n);\n"
        "#define TILE(N) if (n % N == 0) { CALL(N) }\n"
        "template <typename T> void bn_f(T *x, int n) {\n"
        "  TILE(4)\n  else TILE(1)\n}\n"
        "template <typename T> void other(T *x, int n) { x[0] = 1; }\n"
    )
    disc = discover(tmp_path)
    # statements that are macro calls are no C++ the grammar reads: the body looks like a
    # braced initializer, and the item is still the function it defines
    kinds = {it.names[0]: it.kind for it in disc.models["bn.cu"].items if it.names}
    assert kinds["bn_f"] == "function" and kinds["other"] == "function"
    index = LauncherIndex(disc)
    callers = {it.names[0] for it in index.callers["forward_pass"]}
    assert "bn_f" in callers and "other" not in callers


def test_a_constant_each_unit_defines_for_itself_is_defined_once_in_the_label(tmp_path):
    """OpenPCDet defines `const int THREADS_PER_BLOCK_NMS` in its .cu (the launcher's unit) and
    in its .cpp (the bound function's): one per unit, internal linkage. Joined in one label it
    is defined once (a second definition did not compile)."""
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "nms_kernel.cu").write_text(
        "const int THREADS = sizeof(unsigned long long) * 8;\n"
        "__global__ void nms_kernel(const float *boxes, int n, unsigned long long *mask) {\n"
        "  if (threadIdx.x < n) mask[threadIdx.x] = boxes[threadIdx.x] > 0;\n}\n"
        "void nmsLauncher(const float *boxes, int n, unsigned long long *mask) {\n"
        "  nms_kernel<<<(n + THREADS - 1) / THREADS, THREADS>>>(boxes, n, mask);\n}\n"
    )
    (tmp_path / "nms.cpp").write_text(
        "#include <torch/extension.h>\n"
        "const int THREADS = sizeof(unsigned long long) * 8;\n"
        "void nmsLauncher(const float *boxes, int n, unsigned long long *mask);\n"
        "int nms_gpu(at::Tensor boxes, at::Tensor mask) {\n"
        "  int n = boxes.size(0);\n"
        "  auto *bits = (unsigned long long *)mask.data_ptr<int64_t>();\n"
        "  nmsLauncher(boxes.data_ptr<float>(), n, bits);\n"
        "  return (n + THREADS - 1) / THREADS;\n}\n"
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("nms_gpu", &nms_gpu); }\n'
    )
    disc = discover(tmp_path)
    w = mine_wrapper(kernel(disc, "nms_kernel"), Extractor(disc), LauncherIndex(disc))
    assert w is not None and w.chain == ["nmsLauncher", "nms_gpu"]
    assert w.code.count("const int THREADS =") == 1
    assert w.code.index("const int THREADS =") < w.code.index("__global__ void nms_kernel")
