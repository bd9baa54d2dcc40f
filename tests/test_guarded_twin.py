"""The statement a CPU op runs under the condition its CUDA twin launches under
(testgen.guarded_twin): the launcher's reference, on the op's tensors rebuilt from its pointers."""

from __future__ import annotations

import pytest
from test_reference import _adapted_candidate, _built

from miner.candidate import Reference
from miner.discover import discover
from testgen.reference import RepoRefs, find_reference, locate

KERNEL = (
    "using Int = int;\n"
    "template <typename T>\n"
    "__global__ void fill_bias_(T *out, T *bias, Int nPlanes, Int nActive) {\n"
    "  Int n = blockIdx.x * 32 + threadIdx.x;\n"
    "  for (Int row = blockIdx.y; row < nActive; row += gridDim.y)\n"
    "    out[row * nPlanes + n] = bias[n];\n"
    "}\n"
)
LAUNCHER = (
    "template <typename T>\n"
    "void fill_bias(T *oF, T *b, Int nPlanes, Int nActive) {\n"
    "  fill_bias_<T><<<dim3(nPlanes / 32, 64), 32>>>(oF, b, nPlanes, nActive);\n"
    "}\n"
)
CUDA_OP = (
    "template <typename T>\n"
    "void cuda_Linear_updateOutput(Book &m, at::Tensor &input, at::Tensor &output,\n"
    "                              at::Tensor &weight, at::Tensor &bias) {\n"
    "  Int nActive = m.getNActive();\n  Int op = weight.size(1);\n"
    "  output.resize_({nActive, op});\n"
    "  auto oF = output.data_ptr<T>();\n"
    "  if (bias.numel())\n    fill_bias<T>(oF, bias.data_ptr<T>(), op, nActive);\n"
    "  else\n    output.zero_();\n}\n"
)
CPU_OP = (
    "template <typename T>\n"
    "void cpu_Linear_updateOutput(Book &m, at::Tensor &input, at::Tensor &output,\n"
    "                             at::Tensor &weight, at::Tensor &bias) {\n"
    "  Int nActive = m.getNActive();\n"
    "  output.resize_({nActive, weight.size(1)});\n"
    "  if (nActive and weight.numel()) output.mul_(2);\n"
    "  if (bias.numel() and nActive)\n    output.copy_(bias);\n  else\n    output.zero_();\n"
    "  output.addmm_(input, weight);\n}\n"
)


@pytest.mark.slow
def test_the_statement_under_the_launchers_condition_is_its_reference(tmp_path):
    """`cuda_Linear_updateOutput` fills the output with the bias by `fill_bias` under
    `if (bias.numel())`; its twin runs `output.copy_(bias)` under `if (bias.numel() and
    nActive)`: that statement, on the output viewed as the CUDA op sizes it (the launcher's
    `nActive` rows of `nPlanes`, passed as `weight.size(1)`), is the reference, not the
    statement under another condition, nor the rest of the op."""
    import torch

    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "cuda").mkdir(parents=True)
    (repo / "cpu").mkdir()
    (repo / "cuda" / "linear.cu").write_text(KERNEL + LAUNCHER + CUDA_OP)
    (repo / "cpu" / "linear.cpp").write_text("using Int = int;\n" + CPU_OP)
    cand = _adapted_candidate(work, LAUNCHER, "fill_bias", "fill_bias_", "cuda/linear.cu", KERNEL)
    refs = RepoRefs(discover(repo))
    loc = locate(cand, refs, (work / "label.cu").read_text())
    assert not isinstance(loc, str), loc
    assert (loc.mechanism, loc.cpu.names[0]) == ("guarded twin", "cpu_Linear_updateOutput")
    helper = loc.group_helper[1]
    assert "auto output = oF.view({nActive, nPlanes});" in helper
    assert "output.copy_(bias);" in helper and "mul_" not in helper and "addmm_" not in helper
    assert "using Int = int;" in helper  # the label's alias, which the adapter's casts read
    ref = find_reference(cand, repo, work, refs)
    assert isinstance(ref, Reference), ref
    mod = _built(tmp_path, "kminer_ref_bias", work / ref.path)
    out, bias = torch.zeros(3, 4), torch.arange(4.0)
    mod.reference(out, bias, 4, 3)
    torch.testing.assert_close(out, bias.expand(3, 4))
    # a CPU op that copies under another condition has no such statement
    (repo / "cpu" / "linear.cpp").write_text(
        "using Int = int;\n" + CPU_OP.replace("bias.numel() and nActive", "nActive")
    )
    assert isinstance(locate(cand, RepoRefs(discover(repo)), (work / "label.cu").read_text()), str)


BWD_LAUNCHER = (
    "template <typename T>\n"
    "void bias_grad(T *d_oF, T *d_b, Int nPlanes, Int nActive) {\n"
    "  bias_grad_<T><<<dim3(nPlanes / 32, 32), 32>>>(d_oF, d_b, nPlanes, nActive);\n"
    "}\n"
)
BWD_KERNEL = (
    "using Int = int;\n"
    "template <typename T>\n"
    "__global__ void bias_grad_(T *d_oF, T *d_b, Int nPlanes, Int nActive) {\n"
    "  Int n = blockIdx.x * 32 + threadIdx.x;\n  double t = 0;\n"
    "  for (Int row = blockIdx.y; row < nActive; row += gridDim.y) t += d_oF[row * nPlanes + n];\n"
    "  atomicAdd(&d_b[n], t);\n}\n"
)
BWD_CUDA_OP = (
    "template <typename T>\n"
    "void cuda_Linear_backward(Book &m, at::Tensor &d_output, at::Tensor &weight,\n"
    "                          at::Tensor &d_bias) {\n"
    "  Int nActive = m.getNActive();\n  Int op = weight.size(1);\n"
    "  if (d_bias.numel()) {\n    auto db = d_bias.data_ptr<T>();\n"
    "    bias_grad<T>(d_output.data_ptr<T>(), db, op, nActive);\n  }\n}\n"
)
BWD_CPU_OP = (
    "using Int = int;\n"
    "template <typename T>\n"
    "void cpu_Linear_backward(Book &m, at::Tensor &d_output, at::Tensor &weight,\n"
    "                         at::Tensor &d_bias) {\n"
    "  Int nActive = m.getNActive();\n"
    "  if (nActive and d_bias.numel())\n    at::sum_out(d_bias, d_output, {0}, false);\n}\n"
)


@pytest.mark.slow
def test_a_guarded_statement_refuses_a_call_it_would_resize_or_add_to(tmp_path):
    """`at::sum_out(d_bias, d_output, {0}, false)` under the bias gradient launcher's
    condition: the reference of a launcher that adds into `d_b` in place. A flat `d_output`
    would make it resize `d_bias` to a scalar, which no launch can do: refused, as is a
    `d_bias` that is not handed cleared."""
    import torch

    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "cuda").mkdir(parents=True)
    (repo / "cpu").mkdir()
    (repo / "cuda" / "grad.cu").write_text(BWD_KERNEL + BWD_LAUNCHER + BWD_CUDA_OP)
    (repo / "cpu" / "grad.cpp").write_text(BWD_CPU_OP)
    cand = _adapted_candidate(
        work, BWD_LAUNCHER, "bias_grad", "bias_grad_", "cuda/grad.cu", BWD_KERNEL
    )
    refs = RepoRefs(discover(repo))
    loc = locate(cand, refs, (work / "label.cu").read_text())
    assert not isinstance(loc, str), loc
    assert (loc.mechanism, loc.cpu.names[0]) == ("guarded twin", "cpu_Linear_backward")
    ref = find_reference(cand, repo, work, refs)
    assert isinstance(ref, Reference), ref
    mod = _built(tmp_path, "kminer_ref_bias_grad", work / ref.path)
    d_out, d_b = torch.arange(12.0).reshape(3, 4), torch.zeros(4)
    mod.reference(d_out, d_b, 4, 3)
    torch.testing.assert_close(d_b, d_out.sum(0))
    with pytest.raises(RuntimeError, match="resized"):
        mod.reference(d_out.reshape(-1), torch.zeros(4), 4, 3)
    with pytest.raises(RuntimeError, match="!= 0"):
        mod.reference(d_out, torch.ones(4), 4, 3)
