"""CPU references from the repository (testgen.reference, testgen.argmap) on tests/fixtures/refrepo:
one op per way of finding the CPU side, plus the ways of not finding one."""

from __future__ import annotations

import pytest
from conftest import FIXTURES, kernel

from miner.candidate import Candidate, Kernel, Provenance, Reference
from miner.discover import discover
from miner.extract import Extractor
from miner.repo_model import to_candidate
from testgen.argmap import Step, adapter, call_args, map_arguments, plain_name
from testgen.reference import RepoRefs, find_reference, locate
from wrappers.batching import batch_source, split_label
from wrappers.mined import LauncherIndex, mine_wrapper
from wrappers.opmap import op_map
from wrappers.signature import parse_signature

REFREPO = FIXTURES / "refrepo"


def candidate(refrepo, kernel_name: str):
    """The candidate as the wrap stage leaves it: mined launcher, chain and op map."""
    disc, extractor, index, _ = refrepo
    return mined_candidate(disc, extractor, index, kernel_name)


def mined_candidate(disc, extractor, index, kernel_name: str):
    fk = kernel(disc, kernel_name)
    mined = mine_wrapper(fk, extractor, index)
    assert mined is not None, kernel_name
    cand = to_candidate(fk, disc, Provenance(repo_url="https://x/refrepo", commit="a" * 40))
    cand.wrapper.strategy = "mined"
    cand.wrapper.launcher = mined.chain[0]
    cand.wrapper.chain = mined.chain
    cand.wrapper.functions = [f.name for f in mined.functions()]
    cand.wrapper.op_map = op_map(disc, mined.chain, index.callers)
    return cand


def repo_candidates(repo, *kernel_names: str) -> tuple[list[Candidate], RepoRefs]:
    """The named kernels' candidates in a repository written by a test, and its references."""
    disc = discover(repo)
    index = LauncherIndex(disc)
    extractor = Extractor(disc)
    cands = [mined_candidate(disc, extractor, index, name) for name in kernel_names]
    return cands, RepoRefs(disc, index)


def reference(refrepo, kernel_name: str, workdir) -> tuple[Reference, str]:
    cand = candidate(refrepo, kernel_name)
    ref = find_reference(cand, REFREPO, workdir, refrepo[3])
    assert isinstance(ref, Reference), ref
    return ref, (workdir / ref.path).read_text()


def test_registry_reference_adapts_the_launcher_arguments(refrepo, tmp_path):
    cand = candidate(refrepo, "affine_forward_cuda_kernel")
    assert cand.wrapper.functions == ["AffineForwardCUDAKernelLauncher"]
    loc = locate(cand, refrepo[3])
    assert (loc.mechanism, loc.via, loc.cpu.names[0]) == (
        "registry",
        "affine_forward_cuda",
        "affine_forward_cpu",
    )
    # cudabind: affine_forward_cuda(input, output, alpha, beta) calls
    # AffineForwardCUDAKernelLauncher(output, input, beta, alpha, input.numel())
    assert loc.args == ["in", "out", "a", "b"]
    ref, text = reference(refrepo, "affine_forward_cuda_kernel", tmp_path)
    assert ref.kind == "cpp" and ref.exposed == "reference"
    assert (ref.function, ref.file) == ("affine_forward_cpu", "ops/csrc/pytorch/cpu/affine.cpp")
    assert ref.path == f"references/{cand.id}.cpp"
    assert ref.signature == ["Tensor", "const Tensor", "const float", "const float", "const int"]
    assert (
        "void reference(Tensor out, const Tensor in, const float b, const float a, const int n)"
        in text
    )
    assert "  affine_forward_cpu(in, out, a, b);" in text
    assert 'm.def("reference", &kminer_ref::reference)' in text


def test_reference_holds_the_cpu_closure_and_nothing_else(refrepo, tmp_path):
    _, text = reference(refrepo, "affine_forward_cuda_kernel", tmp_path)
    includes, body = split_label(text)
    body = body.split("// kminer: ")[0]  # the closure, without the adapter and its note
    assert text.index("#include <torch/extension.h>") < text.index("// kminer-label-body-begin")
    assert "#include <torch/types.h>" in includes
    for needed in (
        "using namespace at;",
        "#define CHECK_CPU_INPUT(x)",
        "#define CHECK_CPU(x)",
        "#define AFFINE_GRAIN 64",
        "struct AffineCoeffs",
        "inline T affine_one(",
        "void AffineForwardCPU(",
        "void affine_forward_cpu(",
    ):
        assert needed in body, needed
    for unrelated in (
        "AffineBackwardCPU",
        "affine_backward_cpu",
        "unused_cpu_helper",
        "CHECK_CUDA",
        "REGISTER_DEVICE_IMPL",
        "affine_forward_cuda",
        "__global__",
    ):
        assert unrelated not in body, unrelated
    assert "ATen/cuda" not in text and "CUDAGuard" not in text
    assert text.rstrip().endswith(
        "#ifndef KMINER_BATCH\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { kminer_bind(m); }\n#endif"
    )


def test_direct_call_from_the_op_function(refrepo, tmp_path):
    """clamp_op calls clamp_cuda(x, order, lo, hi) on GPU and clamp_cpu(x.contiguous(), lo, hi)
    otherwise (mmcv's nms_rotated): the twin names match, the signatures do not."""
    cand = candidate(refrepo, "clamp_cuda_kernel")
    loc = locate(cand, refrepo[3])
    assert (loc.mechanism, loc.via) == ("direct", "clamp_op")
    assert loc.args == ["x.contiguous()", "lo", "hi"]
    ref, text = reference(refrepo, "clamp_cuda_kernel", tmp_path)
    assert ref.function == "clamp_cpu"
    assert ref.signature == ["const Tensor", "const Tensor", "const float", "const float"]
    assert "Tensor reference(const Tensor x, const Tensor order, const float lo," in text
    assert "return clamp_cpu(x.contiguous(), lo, hi);" in text


def test_twin_with_the_same_signature_is_bound_as_is(refrepo, tmp_path):
    cand = candidate(refrepo, "gather_rows_kernel")
    assert locate(cand, refrepo[3]).mechanism == "twin"
    ref, text = reference(refrepo, "gather_rows_kernel", tmp_path)
    assert (ref.function, ref.file) == ("gather_cpu", "csrc/cpu/gather_cpu.cpp")
    assert ref.signature == ["torch::Tensor", "torch::Tensor", "int64_t"]
    assert 'm.def("reference", &gather_cpu)' in text and "kminer_ref" not in text
    _, body = split_label(text)
    assert "void gather_rows(" in body and "#define CHECK_INPUT(x)" in body
    assert "gather_rows_kernel" not in body and "CHECK_CUDA" not in body


def test_sibling_key_with_a_cpu_function(refrepo, tmp_path):
    """compact_forward calls nondeterministic_compact_forward_impl (CUDA only) or, with the same
    arguments, compact_forward_impl, whose CPU function is the reference (mmcv's voxelization)."""
    cand = candidate(refrepo, "compact_any_order_cuda_kernel")
    loc = locate(cand, refrepo[3])
    assert (loc.mechanism, loc.cpu.names[0]) == ("sibling", "compact_forward_cpu")
    assert refrepo[3].siblings("nondeterministic_compact_forward_impl") == ["compact_forward_impl"]
    assert refrepo[3].siblings("affine_forward_impl") == []
    ref, text = reference(refrepo, "compact_any_order_cuda_kernel", tmp_path)
    assert ref.function == "compact_forward_cpu"
    assert "int compact_forward_cpu(" in text and "atomicAdd" not in text


def test_declared_but_undefined_cpu_function_is_a_reason(refrepo, tmp_path):
    cand = candidate(refrepo, "norm_kernel")
    reason = find_reference(cand, REFREPO, tmp_path, refrepo[3])
    assert reason == "norm_cpu is declared but not defined in the repository"
    assert not (tmp_path / "references").exists()


def test_argument_lost_in_a_computation_is_not_inverted(refrepo, tmp_path):
    cand = candidate(refrepo, "shift_forward_cuda_kernel")
    reason = find_reference(cand, REFREPO, tmp_path, refrepo[3])
    assert isinstance(reason, str) and reason.startswith("not invertible")
    assert "`by`" in reason and "`by * 2`" in reason


def test_find_reference_discovers_the_repository_itself(refrepo, tmp_path):
    cand = candidate(refrepo, "gather_rows_kernel")
    ref = find_reference(cand, REFREPO, tmp_path)
    assert isinstance(ref, Reference) and (tmp_path / ref.path).is_file()


@pytest.mark.parametrize(
    ("expr", "name"),
    [
        ("x", "x"),
        ("x.contiguous()", "x"),
        ("static_cast<float>(alpha)", "alpha"),
        ("(int)n", "n"),
        ("std::move(t)", "t"),
        ("(x)", "x"),
        ("by * 2", None),
        ("input.numel()", None),
        ("x.data_ptr<float>()", None),
    ],
)
def test_plain_name(expr, name):
    assert plain_name(expr) == name


def test_call_args_reads_the_body_not_the_declarator():
    code = "void f(Tensor a, int n) {\n  g<float>(a, std::min(n, 3), h(n));\n  g(a, 1, 2);\n}"
    assert call_args(code, "g") == ["a", "std::min(n, 3)", "h(n)"]
    assert call_args(code, "f") is None
    assert call_args(code, "missing") is None


def test_map_arguments_through_two_calls():
    # op(p, q, r) calls mid(q, p), mid(s, t) calls launcher(t, s.contiguous(), 7):
    # the launcher's u carries p and v carries q
    steps = [
        Step("mid", ["s", "t"], "launcher", ["u", "v", "extra"], ["t", "s.contiguous()", "7"]),
        Step("op", ["p", "q", "r"], "mid", ["s", "t"], ["q", "p"]),
    ]
    assert map_arguments(steps, ["u", "v", "extra"], ["q", "p"], set(), "op_cpu") == ["v", "u"]
    reason = map_arguments(steps, ["u", "v", "extra"], ["p", "r"], set(), "op_cpu")
    assert reason.startswith("not invertible: op's parameter `r`")
    local = map_arguments(steps, ["u", "v", "extra"], ["k"], {"k"}, "op_cpu")
    assert "local value of op" in local


def test_a_cpu_functions_own_worker_count_is_one():
    """pytorch_cluster's radius(x, y, ..., num_workers) passes num_workers to radius_cpu only:
    the reference runs on one worker instead of being refused; any other parameter the CUDA
    path never sees still refuses it."""
    steps = [
        Step(
            "radius",
            ["x", "y", "r", "num_workers"],
            "radius_cuda",
            ["x", "y", "r"],
            ["x", "y", "r"],
        )
    ]
    cpu = ["x", "y", "r", "num_workers"]
    assert map_arguments(steps, ["x", "y", "r"], cpu, set(), "radius_cpu") == ["x", "y", "r", "1"]
    lost = map_arguments(steps, ["x", "y", "r"], ["x", "y", "r", "num_workers * 2"], set(), "c")
    assert lost.startswith("not invertible: radius's parameter `num_workers`")


def test_adapter_takes_enums_as_integers():
    sig = parse_signature("void L(Tensor x, Reduce mode) {}", "L")
    code, target = adapter(sig, "l_cpu", ["x", "mode"], frozenset({"Reduce"}), None, "note")
    assert target == "&kminer_ref::reference"
    assert "void reference(Tensor x, int64_t mode)" in code
    assert "l_cpu(x, static_cast<Reduce>(mode));" in code


def test_a_cpu_side_reached_from_other_python_gets_int32_indices_widened(tmp_path):
    """torch-points-kernels' CUDA `three_interpolate` checks its indices are int32 (its CUDA
    knn makes them), its CPU `knn_interpolate` reads them as int64 (its CPU knn makes those):
    the reference refused every case the label accepts. With `widen_ints` the adapter calls
    again with int32 tensors widened, only when the CPU side refused them for that alone."""
    import torch

    sig = parse_signature("Tensor L(Tensor f, Tensor idx, int n) {}", "L")
    code, target = adapter(sig, "pick_cpu", ["f", "idx", "n"], frozenset(), sig, "n", True)
    assert target == "&kminer_ref::reference"
    assert "return pick_cpu(kminer_widen(f), kminer_widen(idx), n);" in code
    plain, direct = adapter(sig, "pick_cpu", ["f", "idx", "n"], frozenset(), sig, "n")
    assert (plain, direct) == ("", "&pick_cpu")
    source = tmp_path / "pick.cpp"
    source.write_text(
        "#include <torch/extension.h>\nusing at::Tensor;\n"
        "Tensor pick_cpu(Tensor f, Tensor idx, int n) {\n"
        "  auto i = idx.accessor<int64_t, 1>();\n  auto out = torch::zeros({n});\n"
        "  for (int k = 0; k < n; ++k) out[k] = f[i[k]];\n  return out;\n}\n"
        + code
        + "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
        + '  m.def("reference", &kminer_ref::reference);\n}\n'
    )
    mod = _built(tmp_path, "kminer_ref_widen", source)
    f = torch.tensor([10.0, 20.0, 30.0])
    for dtype in (torch.int32, torch.int64):
        got = mod.reference(f, torch.tensor([2, 0], dtype=dtype), 2)
        assert got.tolist() == [30.0, 10.0]
    with pytest.raises(RuntimeError, match="expected scalar type Long but found Float"):
        mod.reference(f, torch.tensor([2.0, 0.0]), 2)  # refused for another reason: raised


def test_references_batch_like_labels(refrepo, tmp_path):
    texts = [
        (name, reference(refrepo, k, tmp_path)[1])
        for name, k in (("a", "affine_forward_cuda_kernel"), ("g", "gather_rows_kernel"))
    ]
    source, _ = batch_source(texts, module="refs")
    assert "namespace kminer_a {" in source and "namespace kminer_g {" in source
    assert 'm.def_submodule("c_a"); kminer_a::kminer_bind(s);' in source
    assert "PYBIND11_MODULE(TORCH_EXTENSION_NAME" not in source


def _adapted_candidate(
    work, text: str, launcher: str, kernel: str, file: str, context: str = ""
) -> Candidate:
    """A candidate whose label (written to `work`: `context`, then the launcher's `text`)
    exposes kminer's adapter over `launcher`."""
    from wrappers.adapter import adapt

    label = context + text
    sig, code = adapt(parse_signature(text, launcher), label)
    work.mkdir()
    (work / "label.cu").write_text(f"// a label\n{label}\n{code}\n")
    kern = Kernel(name=kernel, file=file, line=2, start_line=2, end_line=5, source="")
    prov = Provenance(repo_url=f"https://x/{kernel}", commit="a" * 40)
    cand = Candidate(id="c" * 16, kernel=kern, provenance=prov)
    cand.wrapper.launcher, cand.wrapper.functions = launcher, [sig.name]
    cand.wrapper.label_path = "label.cu"
    return cand


def _built(tmp_path, name: str, source):
    """The reference source built for the CPU with torch.utils.cpp_extension."""
    from torch.utils.cpp_extension import load

    (tmp_path / "build").mkdir()
    return load(
        name=name,
        sources=[str(source)],
        build_directory=str(tmp_path / "build"),
        extra_cflags=["-w"],
    )


@pytest.mark.slow
def test_reference_builds_on_cpu_and_computes_the_op(refrepo, tmp_path):
    import torch

    ref, _ = reference(refrepo, "affine_forward_cuda_kernel", tmp_path)
    mod = _built(tmp_path, "kminer_ref_affine", tmp_path / ref.path)
    inp = torch.linspace(-2, 3, 300, dtype=torch.float64)
    out = torch.zeros_like(inp)
    # the launcher's order: output, input, beta, alpha, n
    assert mod.reference(out, inp, 0.5, 3.0, inp.numel()) is None
    torch.testing.assert_close(out, inp * 3.0 + 0.5)


def test_a_cpu_function_that_only_raises_is_no_reference(refrepo, tmp_path):
    """Deformable-DETR's CPU functions are `AT_ERROR("Not implement on cpu")`: a test against one
    could only crash, so the twin is refused with a reason."""
    cand = candidate(refrepo, "stub_square_kernel")
    reason = find_reference(cand, REFREPO, tmp_path, refrepo[3])
    assert reason == "stub_square_cpu only raises: the repository has no CPU implementation"


def test_a_cpu_function_whose_first_statement_raises_only_raises():
    """pytorch3d returns after its `AT_ERROR` to please the compiler: still no implementation;
    a check that may pass, or a raise under a condition, is not a refusal."""
    from testgen.reference import _only_raises

    stub = """std::tuple<at::Tensor, at::Tensor> InterpBackwardCpu(const at::Tensor& p) {
      AT_ERROR("Not Implemented");
      return std::make_tuple(p, p);
    }"""
    assert _only_raises(stub)
    assert not _only_raises("at::Tensor f(at::Tensor x) { TORCH_CHECK(x.dim() == 2); return x; }")
    assert not _only_raises('void f(int n) { if (n < 0) { AT_ERROR("n"); } g(n); }')


def test_a_function_template_is_matched_at_the_instantiation_its_label_binds():
    """SparseConvNet binds `cuda_AffineReluTrivialConvolution_updateOutput<float>`: its CPU twin
    is called through the plain signature at that instantiation."""
    from wrappers.signature import specialized

    code = "template <typename T, Int K = 4>\ndouble f(at::Tensor &x, T alpha, T *p, Int n) {}"
    sig = parse_signature(code, "f")
    assert sig.template and sig.params[1] == ("T", "alpha")
    sig.template_args = "float, 8"
    plain = specialized(sig)
    assert plain.template == "" and plain.qualified == "f<float, 8>"
    assert plain.params == [
        ("at::Tensor &", "x"),
        ("float", "alpha"),
        ("float *", "p"),
        ("Int", "n"),
    ]
    assert plain.returns == "double"
    sig.template_args = "float"  # one argument for two parameters: no instantiation to take
    assert specialized(sig) is None


def test_a_header_only_library_the_repository_ships_travels_whole(tmp_path):
    """pytorch_cluster's knn_cpu builds a kd-tree with nanoflann.hpp, a 2000-line header-only
    library in its csrc/cpu/utils: the extracted reference named `nanoflann::` and did not
    build. A header the CPU function's file reaches by #include that declares a namespace the
    extracted code uses is inlined whole, before it; one declaring nothing used is not."""
    (tmp_path / "csrc" / "cpu" / "utils").mkdir(parents=True)
    (tmp_path / "csrc" / "cpu" / "utils" / "tinyflann.hpp").write_text(
        '#pragma once\n#include <vector>\n#include "config.h"\n'
        "namespace tinyflann {\ntemplate <typename T> struct L2 {\n"
        "  static T dist(T a, T b) { return (a - b) * (a - b); }\n};\n}  // namespace tinyflann\n"
    )
    (tmp_path / "csrc" / "cpu" / "utils" / "config.h").write_text("#define TINY_LEAF 10\n")
    (tmp_path / "csrc" / "cpu" / "utils" / "unused.hpp").write_text(
        "namespace unused {\ninline int f() { return 1; }\n}\n"
    )
    (tmp_path / "csrc" / "cpu" / "near_cpu.cpp").write_text(
        '#include <torch/extension.h>\n#include "utils/tinyflann.hpp"\n'
        '#include "utils/unused.hpp"\n\n'
        "torch::Tensor near_cpu(torch::Tensor x) {\n"
        "  auto out = x.clone();\n  float* p = out.data_ptr<float>();\n"
        "  for (int64_t i = 0; i < out.numel(); ++i)\n"
        "    p[i] = tinyflann::L2<float>::dist(p[i], 1.f);\n"
        "  return out;\n}\n"
    )
    refs = RepoRefs(discover(tmp_path))
    item = refs.definition("near_cpu", host_side=True)
    body = refs.body(item)
    shipped = refs.vendored_headers("csrc/cpu/near_cpu.cpp", body)
    assert [rel for rel, _ in shipped] == ["csrc/cpu/utils/tinyflann.hpp"]
    text = shipped[0][1]
    assert "namespace tinyflann {" in text and '#include "config.h"' not in text
    assert refs.vendored_headers("csrc/cpu/near_cpu.cpp", "return x;") == []


def test_a_pointer_launchers_twin_is_called_through_the_labels_own_adapter(tmp_path):
    """A launcher that takes device pointers is exposed by kminer's adapter (wrappers.adapter),
    which the repository never defines: its CPU twin, taking the same pointers and numbers, is
    the reference, called through the same dtype dispatch. A twin that takes other arguments
    is a reason, and so is an adapter that builds objects."""
    import torch

    repo, work = tmp_path / "repo", tmp_path / "work"  # the workdir, outside the repository
    (repo / "csrc" / "cuda").mkdir(parents=True)
    (repo / "csrc" / "cpu").mkdir(parents=True)
    launcher = (
        "template <typename T>\nvoid axpy_cuda(T *out, const T *x, T alpha, int n) {\n"
        "  axpy_kernel<T><<<(n + 255) / 256, 256>>>(out, x, alpha, n);\n}\n"
    )
    (repo / "csrc" / "cuda" / "axpy_cuda.cu").write_text(
        "template <typename T>\n__global__ void axpy_kernel(T *out, const T *x, T alpha, int n) {\n"
        "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "  if (i < n) out[i] += alpha * x[i];\n}\n" + launcher
    )
    (repo / "csrc" / "cpu" / "axpy_cpu.cpp").write_text(
        "template <typename T>\nvoid axpy_cpu(T *out, const T *x, T alpha, int n) {\n"
        "  for (int i = 0; i < n; ++i) out[i] += alpha * x[i];\n}\n"
        "template <typename T>\nvoid scale_cpu(T *out, T alpha, int n) {\n"
        "  for (int i = 0; i < n; ++i) out[i] *= alpha;\n}\n"
    )
    cand = _adapted_candidate(work, launcher, "axpy_cuda", "axpy_kernel", "csrc/cuda/axpy_cuda.cu")
    exposed = cand.wrapper.functions[0]
    refs = RepoRefs(discover(repo))
    ref = find_reference(cand, repo, work, refs)
    assert isinstance(ref, Reference), ref
    assert (ref.function, ref.file) == ("axpy_cpu", "csrc/cpu/axpy_cpu.cpp")
    assert locate(cand, refs) == f"no label function to match: {exposed} has no definition"
    mod = _built(tmp_path, "kminer_ref_axpy", work / ref.path)
    for dtype in (torch.float32, torch.float64):
        out, x = torch.ones(300, dtype=dtype), torch.linspace(-2, 3, 300, dtype=dtype)
        mod.reference(out, x, 0.5, 300)
        torch.testing.assert_close(out, 1 + 0.5 * x)
    # a twin over other arguments is named, not called
    text = (repo / "csrc" / "cpu" / "axpy_cpu.cpp").read_text()
    (repo / "csrc" / "cpu" / "axpy_cpu.cpp").write_text(text.replace("axpy_cpu", "axpy_old"))
    (repo / "csrc" / "cpu" / "scale_cpu.cpp").write_text(
        "template <typename T>\nvoid axpy_cpu(T *out, const T *x, T alpha) {}\n"
    )
    why = locate(cand, RepoRefs(discover(repo)), (work / "label.cu").read_text())
    assert why == "twin axpy_cpu takes 3 arguments, axpy_cuda 4"


def test_the_other_branch_of_a_device_test_is_the_cpu_side_whatever_its_name(tmp_path):
    """Pytorch-Correlation-extension's op function asks `input1.device().is_cuda()` and calls
    `correlation_cuda_forward(...)` or `correlation_cpp_forward(...)` with the same arguments:
    the second is the CPU implementation though no name says `cpu`. A function called with
    other arguments, or without a device test, is not taken."""
    from testgen.reference import _other_device_branch

    op = (
        "torch::Tensor corr_forward(torch::Tensor a, torch::Tensor b, int k) {\n"
        "  if (a.device().is_cuda()) {\n    return corr_cuda_forward(a, b, k);\n"
        "  } else {\n    log_call(a);\n    return corr_cpp_forward(a, b, k);\n  }\n}\n"
    )
    defined = {"corr_cpp_forward": [], "log_call": [], "corr_cuda_forward": []}
    assert _other_device_branch(op, "corr_cuda_forward", defined) == {"corr_cpp_forward"}
    plain = op.replace("a.device().is_cuda()", "k > 0")
    assert _other_device_branch(plain, "corr_cuda_forward", defined) == set()
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "corr_kernel.cu").write_text(
        "__global__ void corr_kernel(float *out, const float *a, int n) {\n"
        "  int i = threadIdx.x;\n  if (i < n) out[i] = a[i] * 2.f;\n}\n"
        "torch::Tensor corr_cuda_forward(torch::Tensor a, torch::Tensor b, int k) {\n"
        "  auto out = torch::zeros_like(a);\n"
        "  corr_kernel<<<1, 256>>>(out.data_ptr<float>(), a.data_ptr<float>(), a.numel());\n"
        "  return out;\n}\n"
    )
    (repo / "src" / "corr.cpp").write_text(
        "#include <torch/extension.h>\n"
        "torch::Tensor corr_cpp_forward(torch::Tensor a, torch::Tensor b, int k) {\n"
        "  return a * 2;\n}\n"
    )
    (repo / "src" / "bind.cpp").write_text(
        "#include <torch/extension.h>\n"
        "torch::Tensor corr_cuda_forward(torch::Tensor a, torch::Tensor b, int k);\n"
        "torch::Tensor corr_cpp_forward(torch::Tensor a, torch::Tensor b, int k);\n"
        + op
        + 'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &corr_forward); }\n'
    )
    kern = Kernel(name="corr_kernel", file="src/corr_kernel.cu", line=1, start_line=1,
                  end_line=4, source="")  # fmt: skip
    cand = Candidate(id="d" * 16, kernel=kern, provenance=Provenance(repo_url="x", commit="a" * 40))
    cand.wrapper.launcher, cand.wrapper.functions = "corr_cuda_forward", ["corr_cuda_forward"]
    found = locate(cand, RepoRefs(discover(repo)))
    assert (found.mechanism, found.cpu.names[0], found.args) == (
        "direct", "corr_cpp_forward", ["a", "b", "k"]
    )  # fmt: skip


def test_a_join_of_the_ops_arguments_before_the_gpu_call_is_undone_for_the_cpu_one(tmp_path):
    """maskrcnn-benchmark's `nms(dets, scores, threshold)` joins boxes and scores into one
    tensor for `nms_cuda(b, threshold)` (`b = at::cat({dets, scores.unsqueeze(1)}, 1)`) and
    hands the CPU function the two apart: the reference takes them back out of the label's
    `boxes` as views, and a recorded call of the op gives the label the joined tensor."""
    import torch

    from testgen.argmap import unjoined
    from testgen.interp import evaluate

    views = unjoined("boxes", "at::cat({dets, scores.unsqueeze(1)}, 1)")
    assert views == {
        "dets": "boxes.narrow(1, 0, boxes.size(1) - 1)",
        "scores": "boxes.select(1, boxes.size(1) - 1)",
    }
    dets, scores = torch.rand(6, 4), torch.rand(6)
    joined = evaluate("at::cat({dets, scores.unsqueeze(1)}, 1)", {"dets": dets, "scores": scores})
    assert torch.equal(joined.narrow(1, 0, joined.size(1) - 1), dets)  # the views, as written
    assert torch.equal(joined.select(1, joined.size(1) - 1), scores)
    three = unjoined("x", "torch::cat({s.unsqueeze(0), a, t.unsqueeze(0)})")
    assert three == {"s": "x.select(0, 0)", "a": "x.narrow(0, 1, x.size(0) - 2)",
                     "t": "x.select(0, x.size(0) - 1)"}  # fmt: skip
    assert unjoined("x", "at::cat({a, b}, 1)") == {}  # two widths unknown: no way back
    assert unjoined("x", "at::cat({a * 2, b.unsqueeze(1)}, 1)") == {}
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "nms.cu").write_text(
        "__global__ void nms_kernel(float *mask, const float *boxes, int n) {\n"
        "  int i = threadIdx.x;\n  if (i < n) mask[i] = boxes[i * 5 + 4];\n}\n"
        "at::Tensor nms_cuda(const at::Tensor boxes, float nms_overlap_thresh) {\n"
        "  auto mask = at::zeros({boxes.size(0)}, boxes.options());\n"
        "  nms_kernel<<<1, 256>>>(mask.data_ptr<float>(), boxes.data_ptr<float>(),"
        " boxes.size(0));\n  return mask;\n}\n"
    )
    (repo / "src" / "nms_cpu.cpp").write_text(
        "#include <torch/extension.h>\n"
        "at::Tensor nms_cpu(const at::Tensor& dets, const at::Tensor& scores, const float t) {\n"
        "  return scores.clone();\n}\n"
    )
    (repo / "src" / "vision.cpp").write_text(
        "#include <torch/extension.h>\n"
        "at::Tensor nms_cuda(const at::Tensor boxes, float nms_overlap_thresh);\n"
        "at::Tensor nms_cpu(const at::Tensor& dets, const at::Tensor& scores, const float t);\n"
        "at::Tensor nms(const at::Tensor& dets, const at::Tensor& scores, const float threshold)"
        " {\n  if (dets.type().is_cuda()) {\n"
        "    auto b = at::cat({dets, scores.unsqueeze(1)}, 1);\n"
        "    return nms_cuda(b, threshold);\n  }\n"
        "  at::Tensor result = nms_cpu(dets, scores, threshold);\n  return result;\n}\n"
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("nms", &nms); }\n'
    )
    kern = Kernel(name="nms_kernel", file="src/nms.cu", line=1, start_line=1, end_line=4,
                  source="")  # fmt: skip
    cand = Candidate(id="e" * 16, kernel=kern, provenance=Provenance(repo_url="x", commit="a" * 40))
    cand.wrapper.launcher, cand.wrapper.functions = "nms_cuda", ["nms_cuda"]
    found = locate(cand, RepoRefs(discover(repo)))
    assert found.cpu.names[0] == "nms_cpu"
    assert found.args == [views["dets"], views["scores"], "nms_overlap_thresh"]


def test_a_twin_taking_one_group_is_looped_as_the_cpu_op_loops_over_the_groups(tmp_path):
    """SparseConvNet's launchers take a rule book (a list of index groups, copied to the GPU a
    group at a time) where the CPU twin takes one group as a pointer and a count. The CPU op's
    own loop over the groups, with what it moves between groups, becomes the reference, its
    arguments renamed to the launcher's. No loop over the groups in the CPU code: a reason."""
    import torch

    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "csrc" / "cuda").mkdir(parents=True)
    (repo / "csrc" / "cpu").mkdir(parents=True)
    types = (
        "#pragma once\n#include <vector>\nusing Int = int32_t;\n"
        "using RuleBook = std::vector<std::vector<Int>>;\n"
    )
    (repo / "csrc" / "types.h").write_text(types)
    launcher = (
        "template <typename T>\nvoid cuda_Pool_ForwardPass(T *in, T *out, Int nPlanes,\n"
        "                            RuleBook _rules) {\n"
        "  for (auto &r : _rules) {\n"
        "    pool_fp<T><<<32, 32>>>(in, out, nPlanes, r.data(), r.size() / 2);\n"
        "    out += nPlanes;\n  }\n}\n"
    )
    (repo / "csrc" / "cuda" / "pool.cu").write_text(
        '#include "../types.h"\ntemplate <typename T>\n'
        "__global__ void pool_fp(T *in, T *out, Int nPlanes, const Int *rules, Int nHot) {\n"
        "  for (Int n = threadIdx.x; n < nHot; n += blockDim.x)\n"
        "    for (Int p = 0; p < nPlanes; p++)\n"
        "      out[rules[2 * n + 1] * nPlanes + p] += in[rules[2 * n] * nPlanes + p];\n}\n"
        + launcher
    )
    cpu = (
        '#include "../types.h"\n#include <torch/extension.h>\n'
        "template <typename T>\n"
        "void Pool_ForwardPass(T *input, T *output, Int planes, const Int *rules, Int nHot) {\n"
        "  for (Int n = 0; n < nHot; n++)\n    for (Int p = 0; p < planes; p++)\n"
        "      output[rules[2 * n + 1] * planes + p] += input[rules[2 * n] * planes + p];\n}\n"
        "template <typename T>\n"
        "void cpu_Pool_updateOutput(at::Tensor &in, at::Tensor &out, const RuleBook &_rules) {\n"
        "  Int nPlanes = in.size(1);\n  auto iF = in.data_ptr<T>();\n"
        "  auto oF = out.data_ptr<T>();\n"
        "  for (auto &r : _rules) {\n    Int nHot = r.size() / 2;\n"
        "    Pool_ForwardPass<T>(iF, oF, nPlanes, &r[0], nHot);\n    oF += nPlanes;\n  }\n}\n"
    )
    (repo / "csrc" / "cpu" / "pool.cpp").write_text(cpu)
    cand = _adapted_candidate(
        work, launcher, "cuda_Pool_ForwardPass", "pool_fp", "csrc/cuda/pool.cu", context=types
    )
    ref = find_reference(cand, repo, work, RepoRefs(discover(repo)))
    assert isinstance(ref, Reference), ref
    assert (ref.function, ref.file) == ("Pool_ForwardPass", "csrc/cpu/pool.cpp")
    text = (work / ref.path).read_text()
    assert "Pool_ForwardPass<T>(in, out, nPlanes, &r[0], nHot);" in text  # renamed
    assert "out += nPlanes;" in text  # what moves between groups
    mod = _built(tmp_path, "kminer_ref_groups", work / ref.path)
    x = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    out = torch.zeros(8, 2)
    mod.reference(x, out, 2, [[0, 1, 3, 0], [2, 2]])  # group 2 lands a row further
    want = torch.zeros(8, 2)
    want[1], want[0], want[3] = x[0], x[3], x[2]
    torch.testing.assert_close(out, want)
    # a loop by index over the groups is read the same way
    indexed = "for (Int i = 0; i < (Int)_rules.size(); ++i) {\n    const auto &r = _rules[i];"
    (repo / "csrc" / "cpu" / "pool.cpp").write_text(
        cpu.replace("for (auto &r : _rules) {", indexed)
    )
    again = find_reference(cand, repo, work, RepoRefs(discover(repo)))
    assert isinstance(again, Reference), again
    text = (work / again.path).read_text()
    assert "i < (Int)_rules.size()" in text and "= _rules[i];" in text
    assert "Pool_ForwardPass<T>(in, out, nPlanes, &r[0], nHot);" in text
    # the CPU op calls the twin once, outside any loop over the groups: no reference
    flat = cpu.replace("for (auto &r : _rules) {", "{ auto &r = _rules[0];")
    (repo / "csrc" / "cpu" / "pool.cpp").write_text(flat)
    why = locate(cand, RepoRefs(discover(repo)), (work / "label.cu").read_text())
    assert why == "no CPU code loops over groups calling Pool_ForwardPass"


_VIEW_H = """#pragma once
namespace tv {
struct CPU {};
struct GPU {};
}  // namespace tv
namespace functor {
template <typename Device, typename T>
struct MaxPool {
  void operator()(const Device &d, T *out, const T *in, const int *idx, int n);
};
}  // namespace functor
"""
_POOL_CU = """#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include "../common/view.h"
template <typename T>
__global__ void maxpool_kernel(T *out, const T *in, const int *idx, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && out[idx[i]] < in[i]) out[idx[i]] = in[i];
}
namespace functor {
template <typename T>
struct MaxPool<tv::GPU, T> {
  void operator()(const tv::GPU &d, T *out, const T *in, const int *idx, int n) {
    maxpool_kernel<T><<<(n + 255) / 256, 256>>>(out, in, idx, n);
  }
};
}  // namespace functor
at::Tensor maxpool_forward_cuda(at::Tensor in, at::Tensor idx, int64_t n_out) {
  at::cuda::CUDAGuard guard(in.device());
  auto device = in.device().type();
  auto out = at::zeros({n_out}, in.options());
  if (device == torch::kCPU) {
    functor::MaxPool<tv::CPU, float>()(tv::CPU(), out.data_ptr<float>(), in.data_ptr<float>(),
                                       idx.data_ptr<int>(), idx.size(0));
  } else {
    functor::MaxPool<tv::GPU, float>()(tv::GPU(), out.data_ptr<float>(), in.data_ptr<float>(),
                                       idx.data_ptr<int>(), idx.size(0));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}
"""
_POOL_CPP = """#include <torch/extension.h>
#include "../common/view.h"
namespace functor {
template <typename T>
struct MaxPool<tv::CPU, T> {
  void operator()(const tv::CPU &d, T *out, const T *in, const int *idx, int n) {
    for (int i = 0; i < n; ++i)
      if (out[idx[i]] < in[i]) out[idx[i]] = in[i];
  }
};
}  // namespace functor
template struct functor::MaxPool<tv::CPU, float>;
"""


def _pool_repo(repo) -> None:
    """A repository whose max-pool launcher calls a CPU or a GPU functor by its tensors' device,
    the CPU specialization in a CPU source of its own."""
    for sub in ("common", "cuda", "cpu"):
        (repo / "csrc" / sub).mkdir(parents=True)
    (repo / "csrc" / "common" / "view.h").write_text(_VIEW_H)
    (repo / "csrc" / "cuda" / "pool.cu").write_text(_POOL_CU)
    (repo / "csrc" / "cpu" / "pool.cpp").write_text(_POOL_CPP)


def test_a_launcher_with_its_own_cpu_branch_is_its_reference_on_the_host(tmp_path):
    """spconv-derived launchers ask where their tensors live and call a functor specialized for
    `tv::CPU` or the GPU; no CPU registration reaches them. The launcher with its GPU branch and
    GPU-only statements cut away, joined by the CPU specialization from the repository's CPU
    sources, is the reference. A CPU branch that only raises is a reason, not a reference."""
    import torch

    repo, work = tmp_path / "repo", tmp_path / "work"
    _pool_repo(repo)
    kern = Kernel(
        name="maxpool_kernel", file="csrc/cuda/pool.cu", line=5, start_line=5, end_line=8, source=""
    )
    cand = Candidate(
        id="d" * 16, kernel=kern, provenance=Provenance(repo_url="https://x/p", commit="b" * 40)
    )
    cand.wrapper.launcher, cand.wrapper.functions = "MaxPool", ["maxpool_forward_cuda"]
    work.mkdir()
    ref = find_reference(cand, repo, work, RepoRefs(discover(repo)))
    assert isinstance(ref, Reference), ref
    assert (ref.function, ref.file) == ("maxpool_forward_cuda", "csrc/cuda/pool.cu")
    text = (work / ref.path).read_text()
    assert "(device branch)" in text and "struct MaxPool<tv::CPU, T>" in text
    assert "tv::GPU()" not in text and "CUDAGuard" not in text and "<<<" not in text
    mod = _built(tmp_path, "kminer_ref_device_branch", work / ref.path)
    x = torch.tensor([3.0, -1.0, 5.0, 2.0])
    idx = torch.tensor([0, 2, 0, 1], dtype=torch.int32)
    torch.testing.assert_close(mod.reference(x, idx, 3), torch.tensor([5.0, 2.0, 0.0]))
    # a CPU branch that only refuses
    call = "functor::MaxPool<tv::CPU, float>()("
    refusing = _POOL_CU.replace(call, f'AT_ERROR("no cpu"); {call}')
    (repo / "csrc" / "cuda" / "pool.cu").write_text(refusing)
    why = locate(cand, RepoRefs(discover(repo)))
    assert why == "maxpool_forward_cuda's CPU branch only raises: no CPU implementation"
    # a launch outside the device tests: the op has no CPU side
    launching = _POOL_CU.replace(
        "  if (device == torch::kCPU) {",
        "  maxpool_kernel<float><<<1, 1>>>(nullptr, nullptr, nullptr, 0);\n"
        "  if (device == torch::kCPU) {",
    )
    (repo / "csrc" / "cuda" / "pool.cu").write_text(launching)
    why = locate(cand, RepoRefs(discover(repo)))
    assert isinstance(why, str) and why.startswith("no CPU function"), why


def test_a_templated_launchers_device_branch_binds_the_labels_instantiation(tmp_path):
    """spconv's index-pair launcher is `template <unsigned NDim>`, its label binding
    `&f<2>`: the reference binds the same instantiation (a bare `&f` names no function)."""
    repo, work = tmp_path / "repo", tmp_path / "work"
    _pool_repo(repo)
    templated = _POOL_CU.replace(
        "at::Tensor maxpool_forward_cuda(",
        "template <unsigned NDim>\nat::Tensor maxpool_forward_cuda(",
    )
    op = "at::Tensor maxpool_2d(at::Tensor in, at::Tensor idx, int64_t n) {\n"
    op += "  return maxpool_forward_cuda<2>(in, idx, n);\n}\n"  # the repository's instantiation
    (repo / "csrc" / "cuda" / "pool.cu").write_text(templated + op)
    kern = Kernel(
        name="maxpool_kernel", file="csrc/cuda/pool.cu", line=5, start_line=5, end_line=8, source=""
    )
    cand = Candidate(
        id="e" * 16, kernel=kern, provenance=Provenance(repo_url="https://x/p", commit="b" * 40)
    )
    cand.wrapper.launcher, cand.wrapper.functions = "MaxPool", ["maxpool_forward_cuda"]
    cand.wrapper.label_path = "label.cu"
    work.mkdir()
    bind = 'm.def("maxpool_forward_cuda", &maxpool_forward_cuda<2>);'
    (work / "label.cu").write_text(
        f"{templated}\nvoid kminer_bind(pybind11::module_& m) {{ {bind} }}\n"
    )
    ref = find_reference(cand, repo, work, RepoRefs(discover(repo)))
    assert isinstance(ref, Reference), ref
    text = (work / ref.path).read_text()
    assert "(device branch)" in text
    assert 'm.def("reference", &maxpool_forward_cuda<2>)' in text


def test_the_label_keeps_the_gpu_side_of_its_launchers_device_tests(tmp_path):
    """The same launcher as a label: it runs only on the GPU, and its CPU side calls a functor
    compiled in a source no label links (an undefined symbol at import, as mmcv's max-pool
    labels had). The label keeps the GPU side; tests of other shapes are left as written."""
    from miner.device_tests import keep_side
    from miner.extract import Extractor
    from wrappers.mined import LauncherIndex

    repo = tmp_path / "repo"
    _pool_repo(repo)
    disc = discover(repo)
    index = LauncherIndex(disc)
    mined = mine_wrapper(kernel(disc, "maxpool_kernel"), Extractor(disc), index)
    assert mined is not None and "maxpool_forward_cuda" in mined.code
    assert "the GPU's side of each device test kept" in mined.code
    assert "tv::CPU()" not in mined.code and "struct MaxPool<tv::CPU" not in mined.code
    assert "functor::MaxPool<tv::GPU, float>()(tv::GPU()" in mined.code
    assert "C10_CUDA_KERNEL_LAUNCH_CHECK();" in mined.code  # the GPU side is kept whole
    # negated tests pick the other side; an `else if` chain and an unbraced branch stay
    code = "{ if (!x.is_cuda()) { c(); } else { g(); } if (x.is_cpu()) { c(); } }"
    assert keep_side(code, code, cpu=False)[0] == "{ { g(); }  }"
    assert keep_side(code, code, cpu=True)[0] == "{ { c(); } { c(); } }"
    for kept in ("{ if (x.is_cuda()) { g(); } else if (y) { c(); } }", "{ if (x.is_cuda()) g(); }"):
        assert keep_side(kept, kept, cpu=True)[0] == kept


_SHIFT_CU = """#include <torch/extension.h>
__global__ void shift_kernel(float *out, const float *in, float k, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + k;
}
at::Tensor shift_forward_cuda(at::Tensor x, double k) {
  auto out = at::empty_like(x);
  shift_kernel<<<(x.numel() + 255) / 256, 256>>>(out.data_ptr<float>(), x.data_ptr<float>(),
                                                 (float)k, x.numel());
  return out;
}
"""
_SHIFT_OP = """#include <torch/extension.h>
at::Tensor shift_forward_cuda(at::Tensor x, double k);
at::Tensor shift_forward_mlu(at::Tensor x, double k) { return x.clone(); }
at::Tensor shift_forward(at::Tensor x, double k) {
  if (x.device().is_cuda()) {
    return shift_forward_cuda(x, k);
  } else if (x.device().type() == at::kMLU) {
    return shift_forward_mlu(x, k);
  } else {
    AT_ERROR("shift is not implemented on CPU");
  }
}
"""


def test_another_accelerators_branch_is_no_cpu_reference(tmp_path):
    """mmcv's op functions send CUDA tensors to the CUDA launcher and MLU or MUSA tensors to
    those backends' functions, with the same arguments; that branch is no CPU implementation
    (mmcv's indice-pair kernels got `get_indice_pairs_forward_mlu` as their reference). A CPU
    branch beside it still is one."""
    repo = tmp_path / "repo"
    (repo / "csrc" / "cuda").mkdir(parents=True)
    (repo / "csrc" / "cuda" / "shift_cuda.cu").write_text(_SHIFT_CU)
    (repo / "csrc" / "shift.cpp").write_text(_SHIFT_OP)
    kern = Kernel(
        name="shift_kernel", file="csrc/cuda/shift_cuda.cu", line=2, start_line=2, end_line=5,
        source="",
    )  # fmt: skip
    cand = Candidate(
        id="e" * 16, kernel=kern, provenance=Provenance(repo_url="https://x/s", commit="c" * 40)
    )
    cand.wrapper.launcher, cand.wrapper.functions = "shift_forward_cuda", ["shift_forward_cuda"]
    why = locate(cand, RepoRefs(discover(repo)))
    assert isinstance(why, str) and why.startswith("no CPU function"), why
    with_cpu = _SHIFT_OP.replace(
        '    AT_ERROR("shift is not implemented on CPU");', "    return shift_host(x, k);"
    ).replace(
        "at::Tensor shift_forward(",
        "at::Tensor shift_host(at::Tensor x, double k) { return x + k; }\n"
        "at::Tensor shift_forward(",
    )
    (repo / "csrc" / "shift.cpp").write_text(with_cpu)
    found = locate(cand, RepoRefs(discover(repo)))
    assert not isinstance(found, str) and found.cpu.names[0] == "shift_host", found


@pytest.mark.slow
def test_a_cpu_twin_written_with_cuda_qualifiers_builds_on_the_host(tmp_path):
    """OpenPCDet's iou3d_cpu.cpp includes <cuda_runtime_api.h> and writes `__device__` on its
    helpers, which CUDA's host_defines.h turns into nothing; a reference leaves CUDA headers out,
    so it defines the qualifiers itself."""
    import torch

    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "csrc" / "cuda").mkdir(parents=True)
    (repo / "csrc" / "cpu").mkdir(parents=True)
    (repo / "csrc" / "cuda" / "span_cuda.cu").write_text(
        "#include <torch/extension.h>\n"
        "__global__ void span_kernel(const float *b, float *out, int n) {\n"
        "  int i = threadIdx.x;\n  if (i < n) out[i] = b[2 * i + 1] - b[2 * i];\n}\n"
        "at::Tensor span_cuda(at::Tensor boxes) {\n"
        "  auto out = at::empty({boxes.size(0)}, boxes.options());\n"
        "  span_kernel<<<1, 256>>>(boxes.data_ptr<float>(), out.data_ptr<float>(), "
        "boxes.size(0));\n  return out;\n}\n"
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("span", &span_cuda); }\n'
    )
    (repo / "csrc" / "cpu" / "span_cpu.cpp").write_text(
        "#include <torch/extension.h>\n#include <cuda_runtime_api.h>\n"
        "struct Point {\n  float lo, hi;\n"
        "  __device__ Point(float a, float b) : lo(a), hi(b) {}\n"
        "  __host__ __device__ __forceinline__ float span() const { return hi - lo; }\n};\n"
        "at::Tensor span_cpu(at::Tensor boxes) {\n"
        "  auto out = at::empty({boxes.size(0)}, boxes.options());\n"
        "  const float *b = boxes.data_ptr<float>();\n"
        "  for (int i = 0; i < boxes.size(0); i++)\n"
        "    out.data_ptr<float>()[i] = Point(b[2 * i], b[2 * i + 1]).span();\n"
        "  return out;\n}\n"
    )
    (cand,), refs = repo_candidates(repo, "span_kernel")
    work.mkdir()
    ref = find_reference(cand, repo, work, refs)
    assert isinstance(ref, Reference) and ref.function == "span_cpu", ref
    text = (work / ref.path).read_text()
    assert "cuda_runtime_api.h" not in text and "#define __device__\n" in text
    mod = _built(tmp_path, "kminer_ref_span", work / ref.path)
    boxes = torch.tensor([[0.0, 2.5], [1.0, 4.0]])
    assert torch.equal(mod.reference(boxes), torch.tensor([2.5, 3.0]))


def test_a_name_two_modules_bind_is_read_as_the_one_on_the_candidates_chain(tmp_path):
    """PyTorch-Encoding builds a `cpu` and a `gpu` module that both bind `aggregate_forward`
    (to Aggregate_Forward_CPU and Aggregate_Forward_CUDA): a call its tests made through the
    GPU path is the CUDA function's, whichever file discovery read first; a candidate's chain
    decides where it names one."""
    from testgen.carry import bound_function

    repo = tmp_path / "repo"
    for side, fn in (("cpu", "Agg_Forward_CPU"), ("gpu", "Agg_Forward_CUDA")):
        (repo / "lib" / side).mkdir(parents=True)
        (repo / "lib" / side / "operator.cpp").write_text(
            "#include <torch/extension.h>\n"
            f"at::Tensor {fn}(const at::Tensor A) {{ return A; }}\n"
            f'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def("agg_forward", &{fn}); }}\n'
        )
    refs = RepoRefs(discover(repo))
    assert bound_function(refs, "agg_forward") == "Agg_Forward_CUDA"  # the GPU sources' own
    for fn in ("Agg_Forward_CPU", "Agg_Forward_CUDA"):
        assert bound_function(refs, "agg_forward", within=("PYBIND11_MODULE", fn)) == fn


def _mode_repo(root, one_cpu: bool = False):
    """One CUDA entry point (`dist_cuda`) whose modes two ops' wrappers fix with constants,
    each op with a CPU function of its own (pytorch3d's point-face and face-point distances)."""
    (root / "src").mkdir(parents=True)
    (root / "src" / "dist.cu").write_text(
        "#include <torch/extension.h>\n"
        "__global__ void dist_kernel(float *out, const float *a, const float *b, int n, int d) {\n"
        "  int i = threadIdx.x;\n  if (i < n) out[i] = a[i] * d + b[i];\n}\n"
        "torch::Tensor dist_cuda(torch::Tensor a, int a_dim, torch::Tensor b, int b_dim) {\n"
        "  auto out = torch::zeros_like(a);\n"
        "  dist_kernel<<<1, 256>>>(out.data_ptr<float>(), a.data_ptr<float>(),\n"
        "                          b.data_ptr<float>(), a.numel(), a_dim * 10 + b_dim);\n"
        "  return out;\n}\n"
        "torch::Tensor pf_cuda(torch::Tensor p, torch::Tensor f) {\n"
        "  return dist_cuda(p, 1, f, 3);\n}\n"
        "torch::Tensor fp_cuda(torch::Tensor p, torch::Tensor f) {\n"
        "  return dist_cuda(f, 3, p, 1);\n}\n"
    )
    (root / "src" / "dist_cpu.cpp").write_text(
        "#include <torch/extension.h>\n"
        "torch::Tensor pf_cpu(torch::Tensor p, torch::Tensor f) { return p * 13 + f; }\n"
        "torch::Tensor fp_cpu(torch::Tensor p, torch::Tensor f) { return f * 31 + p; }\n"
    )
    (root / "src" / "bind.cpp").write_text(
        "#include <torch/extension.h>\n"
        "torch::Tensor pf_cuda(torch::Tensor p, torch::Tensor f);\n"
        "torch::Tensor fp_cuda(torch::Tensor p, torch::Tensor f);\n"
        "torch::Tensor pf_cpu(torch::Tensor p, torch::Tensor f);\n"
        "torch::Tensor fp_cpu(torch::Tensor p, torch::Tensor f);\n"
        "torch::Tensor pf(torch::Tensor p, torch::Tensor f) {\n"
        "  if (p.is_cuda()) { return pf_cuda(p, f); }\n  return pf_cpu(p, f);\n}\n"
        "torch::Tensor fp(torch::Tensor p, torch::Tensor f) {\n"
        "  if (p.is_cuda()) { return fp_cuda(p, f); }\n"
        + ("  return pf_cpu(p, f);\n}\n" if one_cpu else "  return fp_cpu(p, f);\n}\n")
        + "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
        '  m.def("pf", &pf);\n  m.def("fp", &fp);\n}\n'
    )
    kern = Kernel(name="dist_kernel", file="src/dist.cu", line=2, start_line=2, end_line=4,
                  source="")  # fmt: skip
    cand = Candidate(id="e" * 16, kernel=kern, provenance=Provenance(repo_url="x", commit="a" * 40))
    cand.wrapper.launcher, cand.wrapper.functions = "dist_cuda", ["dist_cuda"]
    return cand


def test_ops_that_fix_a_shared_entry_points_modes_each_bring_their_cpu_function(tmp_path):
    """Two ops reach `dist_cuda` through wrappers passing (1, 3) and (3, 1) for its dims: the
    reference is both CPU functions, each under its wrapper's constants, its arguments read back
    through that wrapper (the face-point op passes the faces first)."""
    repo = tmp_path / "repo"
    cand = _mode_repo(repo)
    found = locate(cand, RepoRefs(discover(repo)))
    assert found.mechanism == "mode dispatch", found
    branches = {item.names[0]: (mode, args) for mode, item, args, _, _ in found.branches}
    assert branches == {
        "pf_cpu": ({"a_dim": "1", "b_dim": "3"}, ["a", "b"]),
        "fp_cpu": ({"a_dim": "3", "b_dim": "1"}, ["b", "a"]),
    }
    from testgen.mode_dispatch import distinct

    # one CPU function serving both ops, read back to other arguments for each: two branches
    other = _mode_repo(tmp_path / "one", one_cpu=True)
    found = locate(other, RepoRefs(discover(tmp_path / "one")))
    calls = sorted((it.names[0], m["a_dim"], tuple(a)) for m, it, a, _, _ in found.branches)
    assert calls == [("pf_cpu", "1", ("a", "b")), ("pf_cpu", "3", ("b", "a"))]
    assert not distinct([{"a_dim": "1"}, {"a_dim": "1", "b_dim": "2"}])  # {a_dim: 1} holds both
    assert distinct([{"x": "1.0"}, {"x": "2"}]) and not distinct([{"x": "1.0f"}, {"x": "1"}])


@pytest.mark.slow
def test_a_mode_dispatch_reference_runs_the_cpu_function_of_the_callers_mode(tmp_path):
    import torch

    repo = tmp_path / "repo"
    cand = _mode_repo(repo)
    work = tmp_path / "work"
    ref = find_reference(cand, repo, work, RepoRefs(discover(repo)))
    assert isinstance(ref, Reference) and ref.function == "pf_cpu", ref
    mod = _built(tmp_path, "kminer_ref_modes", work / ref.path)
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0])
    torch.testing.assert_close(mod.reference(a, 1, b, 3), a * 13 + b)  # pf_cpu(p=a, f=b)
    torch.testing.assert_close(mod.reference(a, 3, b, 1), a * 31 + b)  # fp_cpu(p=b, f=a)
    with pytest.raises(RuntimeError, match="no CPU function of the repository"):
        mod.reference(a, 2, b, 1)


def test_a_modules_bindings_are_no_op_function_that_calls_the_cpu_side(tmp_path):
    """torchsparse binds `conv_forward_gather_scatter_cuda` and `..._cpu` in one
    PYBIND11_MODULE: the module names both functions and calls neither, so it is no op function
    whose CPU call maps the label's arguments. The reason given is the twin's own: it takes
    other arguments (an output buffer the CUDA side returns instead)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "conv_cuda.cu").write_text(
        "#include <torch/extension.h>\n"
        "__global__ void conv_kernel(const float *x, float *y, int n) {\n"
        "  int i = threadIdx.x;\n  if (i < n) y[i] = 2 * x[i];\n}\n"
        "at::Tensor conv_cuda(at::Tensor x, int mode) {\n  auto y = torch::zeros_like(x);\n"
        "  conv_kernel<<<1, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());\n"
        "  return y;\n}\n"
    )
    (repo / "conv_cpu.cpp").write_text(
        "#include <torch/extension.h>\n"
        "void conv_cpu(at::Tensor x, at::Tensor y, int mode) { y.copy_(x * 2); }\n"
    )
    (repo / "bind.cpp").write_text(
        "#include <torch/extension.h>\nat::Tensor conv_cuda(at::Tensor x, int mode);\n"
        "void conv_cpu(at::Tensor x, at::Tensor y, int mode);\n"
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
        '  m.def("conv_cuda", &conv_cuda);\n  m.def("conv_cpu", &conv_cpu);\n}\n'
    )
    (cand,), refs = repo_candidates(repo, "conv_kernel")
    assert locate(cand, refs) == "twin conv_cpu takes 3 arguments, conv_cuda 2"
