"""Extensions written for an old torch (THC, `.type()` dispatch, AT_CHECK) build on today's,
without editing the mined kernel; and a 2018-style repository's script tests give inputs.

The fixture `legacyrepo` is such a repository: a `setup.py` that builds `_ext` through a
variable (`extension = CUDAExtension`), a CUDA file with THC's state, allocator, cuBLAS wrapper
and checks, a CPU twin with `.type()` dispatch, and `testcuda.py`, checks run as a script.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, needs_nvcc

from wrappers.legacy import COMPAT_CPU, COMPAT_CUDA, header_lines, modernize

LEGACY = FIXTURES / "legacyrepo"
MODERN_INCLUDES = ["#include <ATen/ATen.h>", "#include <THC/THCAtomics.cuh>"]
MODERN_CODE = (
    "at::Tensor f(const at::Tensor& x) {\n"
    '  TORCH_CHECK(x.type().is_cuda(), "cuda");\n'
    '  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "f", [&] { k<<<1, 1>>>(x.data_ptr()); });\n'
    "  return x;\n}\n"
)


def test_code_of_today_is_left_byte_for_byte():
    """THCAtomics.cuh still ships with torch, and `.type().is_cuda()` still works: no block."""
    done = modernize(MODERN_INCLUDES, [MODERN_CODE, ""])
    assert done.includes == MODERN_INCLUDES and done.codes == [MODERN_CODE, ""]
    assert done.rewrites == [] and header_lines(done.rewrites) == []


def test_old_code_gets_the_blocks_and_every_rewrite_is_listed():
    includes = [
        "#include <ATen/ATen.h>",
        "#include <THC/THC.h>",
        '  #include "THC/THCDeviceUtils.cuh"',
    ]
    code = (
        "extern THCState *state;\n"
        "at::Tensor f(const at::Tensor& x) {\n"
        '  AT_CHECK(x.numel() > 0, "empty");\n'
        '  AT_DISPATCH_FLOATING_TYPES(x.type(), "f", [&] {});\n'
        "  THCudaBlas_Sgemm(state, 'n', 'n', 1, 1, 1, 1.f, 0, 1, 0, 1, 0.f, 0, 1);\n"
        "  return x;\n}\n"
    )
    done = modernize(includes, [code, "void g() {}"])
    assert done.includes == ["#include <ATen/ATen.h>", COMPAT_CPU, COMPAT_CUDA]
    assert done.codes[0].startswith("THCState *state = kminer_thc_state();\n")
    assert done.codes[1] == "void g() {}"
    assert done.rewrites == [
        "dropped #include <THC/THC.h>",
        'dropped #include "THC/THCDeviceUtils.cuh"',
        "extern THCState *state -> defined here (as nullptr)",
        "compat block for AT_CHECK, x.type() dispatch",
        "compat block for THC (state, streams, malloc, cuBLAS, checks)",
    ]
    assert header_lines(done.rewrites)[0].startswith("// kminer: legacy torch API")


def test_lazy_init_cuda_as_the_state_is_rewritten_and_a_defined_state_kept():
    code = "THCState *state = at::globalContext().lazyInitCUDA();\nextern THCState *state;\n"
    done = modernize([], [code])
    assert done.codes == ["THCState *state = kminer_thc_state();\nextern THCState *state;\n"]
    assert done.rewrites[0] == "lazyInitCUDA() as THCState -> kminer_thc_state() (1x)"
    assert COMPAT_CUDA in done.includes


def test_a_repository_defining_thc_names_itself_keeps_its_own():
    """Without a THC header, THCCeilDiv is the repository's: the CUDA block would redefine it."""
    code = "template <typename T> T THCCeilDiv(T a, T b) { return (a + b - 1) / b; }\n"
    assert modernize(["#include <ATen/ATen.h>"], [code]).rewrites == []


def test_a_cpu_reference_gets_the_cpu_block_only():
    code = 'void f(at::Tensor x) { AT_DISPATCH_ALL_TYPES(x.type(), "f", [&] {}); }'
    done = modernize(["#include <THC/THC.h>"], [code], cuda=False)
    assert done.includes == [COMPAT_CPU] and COMPAT_CUDA not in done.includes


def test_script_tests_of_a_top_level_extension_are_recorded(tmp_path):
    """`testcuda.py` has no pytest tests: it runs as `__main__`, each statement going on after
    a failure; `import _ext as _backend` is the extension setup.py builds, so it records."""
    from testgen.inputs import record_repo_calls, repo_test_files

    repo = tmp_path / "repo"
    shutil.copytree(LEGACY, repo)
    assert repo_test_files(repo) == [repo / "testcuda.py"]
    calls = record_repo_calls(repo, tmp_path / "cache")
    scale = [
        (tuple(c.args[0].shape), str(c.args[0].dtype), c.args[1]) for c in calls["scale_forward"]
    ]
    assert scale == [
        ((2, 300), "torch.float32", 3.0),
        ((517,), "torch.float64", -0.5),
        ((3, 33), "torch.float32", 0.25),  # the loop's two rounds, after failed statements
        ((64, 33), "torch.float32", 0.25),
    ]
    assert [tuple(a.shape) for a in calls["linear_forward"][0].args] == [(5, 7), (7, 3), (3,)]


def _git(repo: Path) -> None:
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "legacy"]):
        subprocess.run(
            ["git", "-c", "user.email=k@m", "-c", "user.name=k", *argv], cwd=repo, check=True
        )


@needs_nvcc
@pytest.mark.slow
def test_a_legacy_repository_mines_to_tests_on_todays_torch(tmp_path):
    """Labels build with the compatibility block, the CPU twins are references, and the script
    test gives each op its cases."""
    import json

    from typer.testing import CliRunner

    from miner.cli.app import app

    repo = tmp_path / "repo"
    shutil.copytree(LEGACY, repo)
    _git(repo)
    wd = tmp_path / "wd"
    res = CliRunner().invoke(app, ["mine", str(repo), "--workdir", str(wd), "--llm", "none"])
    assert res.exit_code == 0, res.output
    listed = CliRunner().invoke(app, ["candidates", "--workdir", str(wd), "--json"])
    rows = {r["kernel"]: r for r in map(json.loads, listed.stdout.splitlines())}
    assert set(rows) == {"scale_kernel", "add_rows_kernel"}
    for row in rows.values():
        assert row["stages"]["build"]["status"] == "ok", row["stages"]["build"]
        testgen = row["stages"]["testgen"]
        assert (testgen["status"], testgen["reference_kind"], testgen["cases_source"]) == (
            "ok",
            "cpp",
            "mined",
        )
    label = (wd / rows["add_rows_kernel"]["label"]).read_text()
    assert "//   dropped #include <THC/THC.h>" in label
    assert "THCState *state = kminer_thc_state();" in label
    assert "\n#include <THC/THC.h>" not in label
    assert "__global__ void add_rows_kernel" in label  # the kernel itself as the repository has it
    # the kernel calls THCCeilDiv, which only the removed THC headers defined: its unit gets it
    # (no torch), its label from the legacy block (built above)
    assert rows["add_rows_kernel"]["stages"]["compile"]["status"] == "ok"
    unit = (wd / rows["add_rows_kernel"]["unit"]).read_text()
    assert "#ifndef KMINER_THC_DEVICE_UTILS" in unit and "ATen" not in unit
    assert "#define KMINER_THC_DEVICE_UTILS 1" in label
    # a label made from the unit's text (rule, LLM) has both blocks: the legacy block, among
    # the includes, defines the guard first, so the unit's copy is skipped
    from wrappers.label import unit_parts

    includes, body = unit_parts(unit)
    done = modernize([*includes, "#include <THC/THC.h>"], [body, ""])
    text = "\n".join([*done.includes, *done.codes])
    first = text.index("#define KMINER_THC_DEVICE_UTILS 1")
    assert text.index("#ifndef KMINER_THC_DEVICE_UTILS", first) > first  # the unit's, after
    assert text.count("T THCCeilDiv(T a, T b)") == 2


@pytest.mark.gpu
def test_the_compat_block_runs_old_host_code_on_the_gpu(tmp_path):
    """THC's allocator, stream, cuBLAS and checks and `.type()` dispatch, on a real GPU."""
    import torch
    from torch.utils import cpp_extension

    host = (LEGACY / "src" / "cuda" / "scale_cuda.cu").read_text()
    includes = [ln for ln in host.splitlines() if ln.startswith("#include")]
    code = "\n".join(ln for ln in host.splitlines() if not ln.startswith("#include"))
    done = modernize(includes, [code])
    source = "\n".join(
        [
            "#include <torch/extension.h>",
            *done.includes,
            done.codes[0],
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
            '  m.def("scale", &scale_forward_cuda); m.def("linear", &linear_forward_cuda);',
            "}",
        ]
    )
    (tmp_path / "legacy.cu").write_text(source)
    module = cpp_extension.load(
        "kminer_legacy", [str(tmp_path / "legacy.cu")], build_directory=str(tmp_path)
    )
    x = torch.randn(1000, device="cuda", dtype=torch.float64)
    torch.testing.assert_close(module.scale(x, 2.5), 2.5 * x)
    a, b, bias = (torch.randn(*s, device="cuda") for s in ((33, 17), (17, 9), (9,)))
    torch.testing.assert_close(module.linear(a, b, bias), a @ b + bias, rtol=1e-4, atol=1e-4)


def test_th_cpu_blas_of_the_compat_block_multiplies_as_blas_does(tmp_path):
    """THFloatBlas_gemm/gemv (column-major, transposes, beta == 0 never reads C) against the
    same products written out, compiled with the host compiler."""
    from wrappers.legacy import CPU_BLAS

    assert "THFloatBlas_gemm" in modernize([], ["THFloatBlas_gemm('n', 'n', 1, 1, 1)"]).rewrites[0]
    program = tmp_path / "blas.cpp"
    program.write_text(
        "#include <cstdint>\n#include <cstdio>\n#include <cmath>\n"
        + CPU_BLAS
        + r"""
int main() {
  // A is 2x3 and B is 3x2, both column-major; C = A B is 2x2
  float a[6] = {1, 4, 2, 5, 3, 6}, b[6] = {7, 9, 11, 8, 10, 12}, c[4];
  for (float& v : c) v = NAN;  // beta == 0: never read
  THFloatBlas_gemm('n', 'n', 2, 2, 3, 1.f, a, 2, b, 3, 0.f, c, 2);
  float at[6] = {1, 2, 3, 4, 5, 6}, c2[4] = {1, 1, 1, 1};  // A stored transposed (3x2)
  THFloatBlas_gemm('t', 'n', 2, 2, 3, 2.f, at, 3, b, 3, 1.f, c2, 2);
  double x[3] = {1, -1, 2}, y[2];
  double ad[6] = {1, 4, 2, 5, 3, 6};
  THDoubleBlas_gemv('n', 2, 3, 1.0, ad, 2, x, 1, 0.0, y, 1);
  double x2[2] = {1, 1}, y2[3] = {0, 0, 0};
  THDoubleBlas_gemv('t', 2, 3, 1.0, ad, 2, x2, 1, 0.0, y2, 1);
  printf("%g %g %g %g|%g %g %g %g|%g %g|%g %g %g\n", c[0], c[1], c[2], c[3], c2[0], c2[1],
         c2[2], c2[3], y[0], y[1], y2[0], y2[1], y2[2]);
}
"""
    )
    exe = tmp_path / "blas"
    subprocess.run(["g++", "-std=c++17", str(program), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    # A B = [[58, 64], [139, 154]] (column-major: 58 139 64 154); 2 A B + 1; A x; A^T [1, 1]
    assert out.split() == ["58", "139", "64", "154|117", "279", "129", "309|5", "11|5", "7", "9"]


def test_a_pointer_launcher_taking_a_stream_launches_on_the_current_one():
    """faster-rcnn.pytorch (torch.utils.ffi, 2018) launches from `int ROIPoolForwardLaucher(
    const float *bottom_data, ..., int *argmax_data, cudaStream_t stream)`, called from C code
    on THCudaTensor that today's torch cannot build: the launcher itself is bound, each pointer
    a tensor and the stream torch's current one (no binding parameter)."""
    from wrappers.adapter import adapt
    from wrappers.signature import parse_signature

    launcher = (
        "int ROIPoolForwardLaucher(const float *bottom_data, const float spatial_scale,\n"
        "    const int num_rois, float *top_data, int *argmax_data, cudaStream_t stream) {\n"
        "  ROIPoolForward<<<num_rois, 256, 0, stream>>>(bottom_data, spatial_scale, top_data,\n"
        "                                              argmax_data);\n  return 1;\n}\n"
    )
    sig, text = adapt(parse_signature(launcher, "ROIPoolForwardLaucher"), launcher)
    assert [n for _, n in sig.params] == [
        "bottom_data", "spatial_scale", "num_rois", "top_data", "argmax_data"
    ]  # fmt: skip
    assert "argmax_data.data_ptr<int>(), at::cuda::getCurrentCUDAStream()));" in text
