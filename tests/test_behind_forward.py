"""A backward that takes what only its forward computes is labelled and tested behind it."""

import base64
import io
import re
import shutil
import zlib
from pathlib import Path

import pytest
import torch
from conftest import mined_labels

from curation.instructions import Description, complete_text
from miner.candidate import StageName, Status
from miner.discover import discover
from testgen.generate import generate_for
from testgen.inputs import record_repo_calls
from testgen.reference import RepoRefs
from wrappers.autograd_flow import find_flow
from wrappers.signature import parse_signature
from wrappers.through_forward import glue, needs_forward, runs_alone

FIXTURE = Path(__file__).parent / "fixtures" / "segrepo"


def _inputs(test_file: Path) -> bytes:
    """The base calls a generated test embeds (torch.save, zlib, base64)."""
    text = test_file.read_text()
    chunks = re.search(r"INPUTS = \((.*?)\)\n", text, re.S).group(1)
    return zlib.decompress(base64.b64decode("".join(re.findall(r'"([^"]*)"', chunks))))


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    """The fixture repository mined up to its labels (no build: nvcc is not needed here)."""
    tmp = tmp_path_factory.mktemp("seg")
    repo, work = tmp / "repo", tmp / "work"
    shutil.copytree(FIXTURE, repo)
    return repo, work, mined_labels(repo, work)


def test_the_functions_flow_says_which_forward_result_each_backward_argument_is():
    flow = find_flow(FIXTURE, "segment_mean_forward", "segment_mean_backward")
    assert flow is not None and flow.file == "segops/ops.py"
    assert flow.forward_call == [("arg", 0), ("arg", 1), ("arg", 2)]  # feats.contiguous()
    # zeros_like(feats), the gradient of the Function's output (result 0), results 1 and 2,
    # and the mode the forward was given (through `ctx.mean`)
    assert flow.backward_call == [("zeros", ("arg", 0)), ("out_grad", 0), ("result", 1),
                                  ("result", 2), ("arg", 2)]  # fmt: skip
    assert flow.gradients == [(0, ("buffer", 0))]  # feats' gradient is the zeroed buffer
    assert flow.needs_results() == [2, 3]


def test_a_flow_through_context_attributes_and_a_one_line_unpacking(tmp_path):
    (tmp_path / "op.py").write_text(
        "class F(Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x, mode=1):\n"
        "        out, saved, *rest = ext.op_fwd(x, mode)\n"
        "        ctx.mode = mode\n"
        "        ctx.save_for_backward(saved)\n"
        "        return out\n"
        "    @staticmethod\n"
        "    def backward(ctx, dout):\n"
        "        (saved,) = ctx.saved_tensors\n"
        "        dx = ext.op_bwd(dout, saved, ctx.mode, False)\n"
        "        return dx, None\n"
    )
    flow = find_flow(tmp_path, "op_fwd", "op_bwd")
    assert flow.backward_call == [("out_grad", 0), ("result", 1), ("arg", 1), ("const", False)]
    assert flow.gradients == [(0, ("returned", -1))]  # what the backward returns, whole
    # a backward argument computed in a way not followed: no flow, never a wrong one
    (tmp_path / "op.py").write_text(
        (tmp_path / "op.py").read_text().replace("(dout, saved,", "(dout, saved * 2,")
    )
    assert find_flow(tmp_path, "op_fwd", "op_bwd") is None
    # ... also where the gradient returned is a buffer handed to the call (OpenPCDet's
    # grad wrappers: `grad_features = torch.zeros(...)` from sizes the code computes)
    (tmp_path / "op.py").write_text(
        (tmp_path / "op.py")
        .read_text()
        .replace(
            "dx = ext.op_bwd(dout, saved * 2,", "dx = saved.new_zeros(n)\n        ext.op_bwd(dx, m,"
        )
    )
    assert find_flow(tmp_path, "op_fwd", "op_bwd") is None


SCAN_FUNCTION = """
class ScanFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, B, D=None, z=None, softplus=False, return_last_state=False):
        if u.stride(-1) != 1:
            u = u.contiguous()
        if B.dim() == 3:
            B = rearrange(B, "b n l -> b 1 n l")
            ctx.squeeze_B = True
        out, x, *rest = ext.scan_fwd(u, B, D, z, softplus)
        ctx.softplus = softplus
        ctx.has_z = z is not None
        last = x[:, :, -1]
        if not ctx.has_z:
            ctx.save_for_backward(u, B, D, x)
            return out if not return_last_state else (out, last)
        else:
            ctx.save_for_backward(u, B, D, z, x, out)
            out_z = rest[0]
            return out_z if not return_last_state else (out_z, last)

    @staticmethod
    def backward(ctx, dout, *args):
        if not ctx.has_z:
            u, B, D, x = ctx.saved_tensors
            z = None
            out = None
        else:
            u, B, D, z, x, out = ctx.saved_tensors
        du, dB, dD, *rest = ext.scan_bwd(u, B, D, z, dout, x, out, None, ctx.softplus)
        dz = rest[0] if ctx.has_z else None
        dB = dB.squeeze(1) if getattr(ctx, "squeeze_B", False) else dB
        return du, dB, dD if D is not None else None, dz, None, None
"""


def test_a_flow_through_reshapes_the_rest_of_an_unpacking_and_values_or_none(tmp_path):
    """mamba's selective scan: the binding's own arguments either side of a reshape, a result
    picked from `*rest`, a gradient that is the value or None by a mode, forward results the
    backward takes as optional tensors."""
    (tmp_path / "scan.py").write_text(SCAN_FUNCTION)
    flow = find_flow(tmp_path, "scan_fwd", "scan_bwd")
    assert flow.forward_call == [("arg", k) for k in range(5)]  # B after `rearrange` too
    # dout is the gradient of what the Function returns, the forward's third result (out_z)
    assert flow.outputs == [("result", 2)]
    assert flow.backward_call == [("arg", 0), ("arg", 1), ("arg", 2), ("arg", 3),
                                  ("out_grad", 2), ("result", 1), ("result", 0),
                                  ("const", None), ("arg", 4)]  # fmt: skip
    # dB through its squeeze, dD or None, dz from the rest of the unpacking
    assert flow.gradients == [(0, ("returned", 0)), (1, ("returned", 1)),
                              (2, ("returned", 2)), (3, ("returned", 3))]  # fmt: skip
    opt = "const c10::optional<at::Tensor> &"
    bwd = parse_signature(
        f"std::vector<at::Tensor> scan_bwd(const at::Tensor& u, const at::Tensor& B, {opt} D, "
        f"{opt} z, const at::Tensor& dout, {opt} x, {opt} out, {opt} dz, bool sp) {{}}",
        "scan_bwd",
        "",
    )
    fwd = parse_signature(
        f"std::vector<at::Tensor> scan_fwd(const at::Tensor& u, const at::Tensor& B, {opt} D, "
        f"{opt} z, bool sp) {{}}",
        "scan_fwd",
        "",
    )
    # the results are optional: the glue is tried, the backward can still be tested alone
    assert needs_forward(flow, bwd) and runs_alone(flow, bwd)
    _, code = glue(flow, fwd, bwd)
    call = "scan_bwd(u, B, D, z, kminer_grad_2.contiguous(), kminer_fwd.at(1), kminer_fwd.at(0), "
    assert call + "c10::nullopt, sp);" in code
    # a literal for a non-const reference (mamba's `c10::optional<at::Tensor>& dz_`): a local
    mutable = parse_signature(
        str(bwd.returns) + " scan_bwd(" + ", ".join(
            f"{t.replace('const ', '') if n == 'dz' else t} {n}" for t, n in bwd.params
        ) + ") {}", "scan_bwd", "",
    )  # fmt: skip
    _, code = glue(flow, fwd, mutable)
    assert "  c10::optional<at::Tensor> & kminer_arg_7 = c10::nullopt;" not in code
    assert "  c10::optional<at::Tensor> kminer_arg_7 = c10::nullopt;" in code
    assert "kminer_fwd.at(0), kminer_arg_7, sp);" in code
    returned = ", ".join(f"kminer_bwd.at({i})" for i in range(4))
    assert f"return {{{returned}}};" in code
    # a reshape of something else, or a value-or-something-else, is not followed
    changed = SCAN_FUNCTION.replace("dz = rest[0] if", "dz = rest[1] * 2 if")
    (tmp_path / "scan.py").write_text(changed)
    assert (3, ("returned", 3)) not in find_flow(tmp_path, "scan_fwd", "scan_bwd").gradients


def test_the_glue_runs_the_forward_then_the_backward_on_its_results():
    flow = find_flow(FIXTURE, "segment_mean_forward", "segment_mean_backward")
    fwd = parse_signature(
        "std::vector<at::Tensor> segment_mean_forward(const at::Tensor& feats, "
        "const at::Tensor& keys, bool mean) {}",
        "segment_mean_forward",
        "",
    )
    bwd = parse_signature(
        "void segment_mean_backward(at::Tensor& grad_feats, const at::Tensor& grad_means, "
        "const at::Tensor& row_key, const at::Tensor& rows_per_key, bool mean) {}",
        "segment_mean_backward",
        "",
    )
    sig, code = glue(flow, fwd, bwd)
    assert sig.name == "segment_mean_backward_through_forward"
    assert [n for _, n in sig.params] == ["feats", "keys", "mean", "kminer_grad_0"]
    assert "auto kminer_fwd = segment_mean_forward(feats, keys, mean);" in code
    assert "at::Tensor kminer_buffer_0 = at::zeros_like(feats);" in code
    call = "segment_mean_backward(kminer_buffer_0, kminer_grad_0.contiguous(), kminer_fwd.at(1), "
    assert call + "kminer_fwd.at(2), mean);" in code  # (a result a mode leaves out: an error)
    assert "return {kminer_buffer_0};" in code
    # a forward of another arity than the Function passes: no glue
    short = parse_signature("std::vector<at::Tensor> f(const at::Tensor& feats) {}", "f", "")
    assert glue(flow, short, bwd) is None


def test_only_the_backward_that_needs_its_forwards_results_gets_the_glue(mined):
    _, work, cands = mined
    back = cands["segment_mean_backward_kernel"]
    assert back.wrapper.functions == ["segment_mean_backward_through_forward",
                                      "segment_mean_backward"]  # fmt: skip
    info = back.wrapper.op_map["through_forward"]
    assert info["forward"] == "segment_mean_forward" and info["out_grads"] == ["0"]
    label = (work / back.wrapper.label_path).read_text()
    # the forward's kernels and host function travel in the backward's label
    assert "__global__ void segment_sum_kernel" in label
    assert "std::vector<at::Tensor> segment_mean_forward(" in label
    assert 'm.def("segment_mean_backward_through_forward"' in label
    for name in ("segment_sum_kernel", "segment_divide_kernel"):
        assert cands[name].wrapper.functions == ["segment_mean_forward"]
        assert "through_forward" not in cands[name].wrapper.op_map


def test_the_backward_is_checked_against_autograd_through_the_forward_reference(mined):
    repo, work, cands = mined
    cand = cands["segment_mean_backward_kernel"]
    refs = RepoRefs(discover(repo))
    recorded = record_repo_calls(repo, work / "record_cache")
    generate_for(cand, refs, recorded, work)
    done = cand.stage(StageName.TESTGEN)
    assert done.status == Status.OK, done.detail
    assert done.metrics["cases_source"] == "forward" and done.metrics["num_cases"] >= 3
    # one reference per mode the tests check, each paired with the calls of its mode
    assert cand.reference.function == "autograd of segment_mean_ref and segment_sum_ref"
    namespace: dict = {}
    exec(compile((work / cand.reference.path).read_text(), "reference.py", "exec"), namespace)
    feats, keys = torch.rand(12, 3), torch.tensor([0, 2, 2, 5, 0, 0, 5, 2, 2, 9, 0, 2])
    grad = torch.randn(4, 3)  # one row per key, keys sorted: 0, 2, 5, 9
    _, key_of_row, counts = torch.unique(keys, return_inverse=True, return_counts=True)
    got = namespace["reference"](feats, keys, True, grad)
    assert torch.allclose(got, grad[key_of_row] / counts[key_of_row, None])
    assert torch.allclose(namespace["reference"](feats, keys, False, grad), grad[key_of_row])
    modes = {b[2] for b in torch.load(io.BytesIO(_inputs(work / cand.tests.path)))}
    assert modes == {True, False}  # the cases run both
    test = (work / cand.tests.path).read_text()
    assert "segment_mean_backward_through_forward" in test
    # the row's task says what the glue computes, without the repository's words for it
    task = complete_text(cand, (work / cand.wrapper.label_path).read_text(), Description("", ""))
    assert "The backward of `segment_mean_forward`" in task and "`kminer_grad_0`" in task


def test_the_reference_output_goes_where_the_function_returns_it_from():
    """The tests compare their PyTorch function with the autograd Function, whose first output
    is mamba's third binding result (`out_z`): the gradient of that result is what the
    reference's first output is differentiated against, not the binding's first result."""
    from testgen.behind_forward import _slots
    from testgen.python_reference import Pairing

    p = Pairing("scan_ref", "ops.py", outputs=[("return",), ("return",)])
    assert _slots(p, None) == [0, 1]  # no flow outputs: position for position
    assert _slots(p, [["result", 2]]) == [2, None]  # `last_state`: from no result of the flow
    assert _slots(p, [["result", 1], ["arg", 0]]) == [1, None]


def test_a_backward_taking_its_forwards_results_as_optional_falls_back_to_its_own_test(
    tmp_path,
):
    """Where the glue finds no reference and every forward result the backward takes is
    optional, the backward is tested alone as before: its host function comes first again and
    the glue's reason is kept."""
    repo, work = tmp_path / "repo", tmp_path / "work"
    shutil.copytree(FIXTURE, repo)
    cu = repo / "csrc" / "segment.cu"
    text = cu.read_text()
    for name in ("row_key", "rows_per_key"):
        text = text.replace(f"const at::Tensor& {name}", f"const c10::optional<at::Tensor>& {name}")
        text = text.replace(f"{name}.data_ptr<int>()", f"{name}.value().data_ptr<int>()")
    cu.write_text(text)
    tests = repo / "tests" / "test_segment.py"  # no PyTorch function beside the op any more
    tests.write_text(
        re.sub(r"expected = segment_\w+_ref\(.*\)", "expected = None", tests.read_text())
    )
    tests.write_text(
        tests.read_text().replace("assert torch.allclose(out.cpu(), expected)", "pass")
    )
    cand = mined_labels(repo, work)["segment_mean_backward_kernel"]
    info = cand.wrapper.op_map["through_forward"]
    assert info["alone"] and cand.wrapper.functions[0].endswith("_through_forward")
    generate_for(cand, RepoRefs(discover(repo)), record_repo_calls(repo, work / "rec"), work)
    assert cand.wrapper.functions == ["segment_mean_backward",
                                      "segment_mean_backward_through_forward"]  # fmt: skip
    assert "through_forward" not in cand.wrapper.op_map
    assert "no PyTorch function" in cand.wrapper.op_map["not_through_forward"]
    assert cand.stage(StageName.TESTGEN).status == Status.SKIPPED  # (no reference alone either)
