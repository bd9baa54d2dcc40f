"""The repository's own PyTorch reference, paired with its binding by the recorded values."""

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from miner.discover import discover
from testgen.grad_reference import find_grad_reference
from testgen.inputs import record_repo_calls
from testgen.python_reference import adapter, find_python_reference, pair
from testgen.reference import RepoRefs
from testgen.vendor import vendor_function
from wrappers.through_forward import forward_of

FIXTURE = Path(__file__).parent / "fixtures" / "pyrefrepo"
HOST = [
    ("const at::Tensor&", "x"),
    ("const at::Tensor&", "y"),
    ("at::Tensor&", "out"),
    ("bool", "doubled"),
]


def _recorded(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo)
    return repo, record_repo_calls(repo, tmp_path / "cache")


def test_recorder_pairs_reference_calls_with_the_extension_calls_of_the_same_test(tmp_path):
    _, recorded = _recorded(tmp_path)
    assert len(recorded["scale_add"]) == 4  # 2 sizes x 2 modes: each test went on past `out`
    refs = [r for r in recorded.refs if r.function == "scale_add_ref"]
    assert len(refs) == 4 and all(r.file == "pyref/ops.py" for r in refs)
    for ref in refs:  # its partner is the call of its own test: the same x
        (partner,) = ref.partners
        assert torch.equal(partner.args[0], ref.args[0])
        assert partner.args[3] == (ref.kwargs["mode"] == "double")
    helper = [r for r in recorded.refs if r.function == "unrelated"]
    assert helper and all(r.file == "tests/test_scale_add.py" for r in helper)


def test_pairing_reads_tensors_tables_and_outputs_off_the_pairs(tmp_path):
    repo, recorded = _recorded(tmp_path)
    (found,) = [p for p in pair(recorded.refs, "scale_add", repo, "void") if p.pairs == 4]
    assert found.function == "scale_add_ref"
    assert found.params["x"] == ("arg", 0) and found.params["y"] == ("arg", 1)
    assert found.params["mode"] == ("table", 3, {"False": None, "True": "double"})
    assert found.outputs == [("arg", 2)]  # written into `out`, the tensor it does not read
    # `unrelated` reads a tensor no binding argument holds before the call: never paired
    assert all(p.function != "unrelated" for p in pair(recorded.refs, "scale_add", repo, "void"))


def test_vendored_reference_runs_alone_and_computes_the_op(tmp_path):
    repo, recorded = _recorded(tmp_path)
    cand = SimpleNamespace(id="c0ffee")  # only its id names the reference file
    workdir = tmp_path / "work"
    workdir.mkdir()
    found = find_python_reference(cand, recorded.refs, "scale_add", HOST, "void", repo, workdir)
    assert not isinstance(found, str), found
    ref, pairing = found
    assert (ref.kind, ref.function, ref.file) == ("python", "scale_add_ref", "pyref/ops.py")
    code = (workdir / ref.path).read_text()
    assert "import pyref" not in code and "HALF = 0.5" in code and "def doubled" in code
    namespace: dict = {}
    exec(compile(code, "reference.py", "exec"), namespace)  # no repository on the path
    x, y = torch.arange(4.0), torch.ones(4)
    for flag, factor in ((False, 1.0), (True, 2.0)):
        out = torch.zeros(4)
        assert namespace["reference"](x, y, out, flag) is None
        assert torch.equal(out, (x * 0.5 + y) * factor)
    assert pairing.covers([x, y, out, True])


def test_a_numpy_reference_gets_arrays_and_the_dtype_of_a_tensor(tmp_path):
    repo, recorded = _recorded(tmp_path)
    (found,) = [
        p
        for p in pair(recorded.refs, "scale_add", repo, "void")
        if p.function == "scale_add_groundtruth"
    ]
    assert found.pairs == 2 and found.fixed == {3: "False"}  # only mode None compared with it
    assert found.arrays == ["x", "y"] and found.params["dtype"] == ("dtype", 0)
    assert found.outputs == [("arg", 2)]
    code = vendor_function(repo, found.file, found.function) + adapter(found, [n for _, n in HOST])
    namespace: dict = {}
    exec(compile(code, "reference.py", "exec"), namespace)
    for dtype in (torch.float32, torch.float64):
        x, y = torch.arange(4.0, dtype=dtype), torch.ones(4, dtype=dtype)
        out = torch.zeros(4, dtype=dtype)
        namespace["reference"](x, y, out, False)
        assert torch.equal(out, x * 0.5 + y)


def test_adapter_refuses_calls_outside_the_recorded_pairs(tmp_path):
    repo, recorded = _recorded(tmp_path)
    (found,) = [p for p in pair(recorded.refs, "scale_add", repo, "void") if p.pairs == 4]
    found.fixed = {3: "True"}
    namespace: dict = {"scale_add_ref": lambda x, y, mode=None: x}
    exec(adapter(found, ["x", "y", "out", "doubled"]), namespace)
    try:
        namespace["reference"](torch.ones(1), torch.ones(1), torch.zeros(1), False)
    except RuntimeError as e:  # a RuntimeError: the test reports the case invalid
        assert "paired only with True" in str(e)
    else:
        raise AssertionError("a call outside the pairs was computed")


def test_vendoring_refuses_third_party_imports_and_follows_repository_helpers(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "util.py").write_text("def norm(t):\n    return t / t.sum()\n")
    (tmp_path / "pkg" / "ops.py").write_text(
        "import einops\nimport torch\nfrom pkg.util import norm\n\n"
        "def good_ref(t):\n    return norm(torch.exp(t))\n\n"
        "def bad_ref(t):\n    return einops.rearrange(t, 'a b -> b a')\n"
    )
    good = vendor_function(tmp_path, "pkg/ops.py", "good_ref")
    assert good.startswith("import torch") and "def norm(t)" in good
    assert good.index("def norm") < good.index("def good_ref")
    assert vendor_function(tmp_path, "pkg/ops.py", "bad_ref") == (
        "!needs `einops` (only torch, numpy and the standard library travel)"
    )


def test_a_frameworks_probes_and_version_helper_travel_as_stand_ins(tmp_path):
    """OpenMMLab's `_upfirdn2d_ref` reaches `conv2d`, which asks mmengine whether torch is new
    enough (`digit_version`) and whether a MUSA device is there: those two travel as
    stand-ins (no accelerator on the CPU, versions compared as numbers); any other name of the
    framework still refuses the reference."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "gradfix.py").write_text(
        "import torch\nfrom mmengine.device import is_musa_available\n"
        "from mmengine.utils import digit_version as dv\n"
        "from mmengine.registry import MODELS\n\n"
        "def conv(x, w):\n"
        "    if is_musa_available() or dv(torch.__version__) < dv('1.10.0rc1'):\n"
        "        raise RuntimeError('custom op path')\n"
        "    return torch.nn.functional.conv1d(x, w)\n\n"
        "def registered(x):\n    return MODELS.build(x)\n"
    )
    (tmp_path / "pkg" / "ops.py").write_text(
        "from pkg.gradfix import conv\n\n\ndef filt_ref(x, w):\n    return conv(x, w) * 2\n"
    )
    source = vendor_function(tmp_path, "pkg/ops.py", "filt_ref")
    namespace: dict = {}
    exec(source, namespace)
    x, w = torch.randn(1, 1, 9), torch.randn(1, 1, 3)
    assert torch.allclose(namespace["filt_ref"](x, w), 2 * torch.nn.functional.conv1d(x, w))
    versions = ["1.9.0", "1.10.0rc1", "1.10.0", "1.10.1", "2.13.0+cpu"]
    assert sorted(versions, key=namespace["dv"]) == versions
    assert vendor_function(tmp_path, "pkg/gradfix.py", "registered") == (
        "!needs `mmengine.registry` (only torch, numpy and the standard library travel)"
    )


def test_a_helper_that_reaches_the_extension_on_cuda_travels_with_a_stand_in(tmp_path):
    """mmcv's `_filtered_lrelu_ref` calls `bias_act`, which calls the extension (loaded at
    import: `ext_module = ext_loader.load_ext(...)`) for CUDA tensors and a pure-PyTorch path
    for CPU ones. The names that cannot travel stand in as objects that raise when used: the
    CPU path runs, the CUDA path fails loudly; the reference reading one itself is refused."""
    (tmp_path / "pkg" / "utils").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "utils" / "__init__.py").write_text("from .loader import load_ext\n")
    (tmp_path / "pkg" / "ops.py").write_text(
        "import torch\nfrom .utils import ext_loader\n\n"
        "ext_module = ext_loader.load_ext('_ext', ['act'])\n\n\n"
        "def act(x):\n    if x.is_cuda:\n        return ext_module.act(x)\n"
        "    return torch.relu(x) * 2\n\n\n"
        "def act_ref(x):\n    return act(x) + 1\n\n\n"
        "def direct_ref(x):\n    return ext_module.act(x)\n"
    )
    source = vendor_function(tmp_path, "pkg/ops.py", "act_ref")
    namespace: dict = {}
    exec(source, namespace)
    x = torch.tensor([-1.0, 2.0])
    assert namespace["act_ref"](x).tolist() == [1.0, 5.0]
    with pytest.raises(RuntimeError, match="ext_loader"):
        namespace["ext_module"].act(x)
    assert vendor_function(tmp_path, "pkg/ops.py", "direct_ref").startswith("!`ext_loader`")


BACKWARD_HOST = [
    ("const at::Tensor&", "x"),
    ("const at::Tensor&", "y"),
    ("const at::Tensor&", "grad_out"),
    ("at::Tensor&", "grad_x"),
    ("at::Tensor&", "grad_y"),
    ("bool", "doubled"),
]


def test_forward_of_a_backward_binding_is_named_like_it():
    names = {"ms_deform_attn_forward", "ms_deform_attn_backward", "nms", "roi_align_forward"}
    assert forward_of("ms_deform_attn_backward", names) == "ms_deform_attn_forward"
    assert forward_of("causal_conv1d_bwd", {"causal_conv1d_fwd", "causal_conv1d_update"}) == (
        "causal_conv1d_fwd"
    )
    assert forward_of("scale_add_backward", {"scale_add"}) == "scale_add"
    assert forward_of("roi_align_forward", names) is None  # not a backward op
    assert forward_of("nms_backward", {"roi_align_forward"}) is None


def test_backward_binding_is_checked_against_autograd_of_the_forward_reference(tmp_path):
    repo, recorded = _recorded(tmp_path)
    assert "scale_add_backward" not in recorded  # the tests never reach the backward
    workdir = tmp_path / "work"
    workdir.mkdir()
    refs = RepoRefs(discover(repo))
    found = find_grad_reference(
        SimpleNamespace(id="bwd"),
        recorded,
        refs,
        "scale_add_backward",
        BACKWARD_HOST,
        "void",
        workdir,
        lambda call: list(call.args),  # the binding is the host function
    )
    assert not isinstance(found, str), found
    ref, calls = found
    assert (ref.kind, ref.function) == ("python", "autograd of scale_add_ref")
    # one backward call per recorded forward call: its x and y, a gradient shaped like its
    # output, zero buffers for the gradients it writes, its mode
    assert len(calls) == 4 and {c.args[5] for c in calls} == {True, False}
    for c in calls:
        x, y, grad_out, grad_x, grad_y, _ = c.args
        assert grad_out.shape == x.shape and not torch.equal(grad_out, torch.zeros_like(x))
        assert torch.equal(grad_x, torch.zeros_like(x)) and torch.equal(grad_y, torch.zeros_like(y))
    namespace: dict = {}
    exec(compile((workdir / ref.path).read_text(), "reference.py", "exec"), namespace)
    x, y, g = torch.randn(6), torch.randn(6), torch.randn(6)
    for flag, factor in ((False, 1.0), (True, 2.0)):
        gx, gy = torch.zeros(6), torch.zeros(6)
        with torch.no_grad():  # as a test calls it
            namespace["reference"](x, y, g, gx, gy, flag)
        assert torch.allclose(gx, g * 0.5 * factor) and torch.allclose(gy, g * factor)


def test_a_wrapper_with_a_pytorch_fallback_is_run_on_both_devices(tmp_path):
    """`axpby` calls the extension for CUDA inputs and `axpby_ref` otherwise, and each test
    reaches only one path; the recorder runs it again on the other device, so each reference
    call is paired with exactly the extension call of the same arguments."""
    repo, recorded = _recorded(tmp_path)
    refs = [r for r in recorded.refs if r.function == "axpby_ref"]
    assert len(refs) == 2  # the CPU test's call, and the CUDA test's, rerun on the CPU
    by_size = {r.args[0].numel(): r for r in refs}
    assert set(by_size) == {6, 27}
    for ref in refs:
        (partner,) = ref.partners
        assert partner.function == "axpby"
        assert all(torch.equal(partner.args[k], ref.args[k]) for k in (0, 1))
        assert partner.args[3:5] == ref.args[2:4]  # alpha, beta: (2.0, 0.5) and (1.0, 3.0)
    (found,) = [p for p in pair(recorded.refs, "axpby", repo, "void") if p.function == "axpby_ref"]
    assert found.params == {
        "x": ("arg", 0),
        "y": ("arg", 1),
        "alpha": ("arg", 3),
        "beta": ("arg", 4),
    }
    assert found.outputs == [("arg", 2)]
    assert found.fixed == {5: "empty tensor"}  # the unused slot: an empty tensor, as recorded


def test_a_list_parameter_is_read_off_several_binding_arguments():
    """`padding=[2, 1]` against `padx0=2, padx1=2, pady0=1, pady1=1`; a test that passed one
    number passed it for each."""
    from testgen.inputs import RecordedCall
    from testgen.python_reference import _scalar_source

    calls = [
        RecordedCall("up", [torch.ones(2), 2, 2, 1, 1]),
        RecordedCall("up", [torch.ones(2), 1, 1, 1, 1]),
        RecordedCall("up", [torch.ones(2), 0, 0, 0, 0]),
    ]
    pairs = [(c, {"padding": v}) for c, v in zip(calls, [[2, 1], 1, 0], strict=True)]
    assert _scalar_source(pairs, "padding") == ("list", [1, 3])
    pairs[1] = (RecordedCall("up", [torch.ones(2), 1, 1, 0, 0]), {"padding": 1})
    assert _scalar_source(pairs, "padding") is None  # pady0 = pady1 = 0 where the test said 1


def test_backward_parameters_are_read_by_name_optional_marks_included():
    """causal-conv1d's backward binding: C++'s trailing `_` marks optionals, `dout` is the
    gradient of the output written into `out`, `dfinal_states_` that of `final_states_out_`
    (absent when no paired forward call asked for it)."""
    from testgen.grad_reference import _role

    fwd = [
        "x",
        "weight",
        "bias_",
        "seq_idx_",
        "initial_states_",
        "out",
        "final_states_out_",
        "silu_activation",
    ]
    assert _role("dout", fwd, {"out"}) == ("out_grad", "out")
    assert _role("dx", fwd, {"out"}) == ("grad", "x")
    assert _role("dbias_", fwd, {"out"}) == ("grad", "bias_")
    assert _role("dinitial_states_", fwd, {"out"}) == ("grad", "initial_states_")
    assert _role("dfinal_states_", fwd, {"out"}) == ("absent", "final_states_out_")
    assert _role("dfinal_states_", fwd, {"out", "final_states_out_"}) == (
        "out_grad",
        "final_states_out_",
    )
    assert _role("silu_activation", fwd, {"out"}) == ("input", "silu_activation")
    assert _role("grad_output", ["input", "output"], {"output"}) == ("out_grad", "output")
    assert _role("top_grad", ["input"], set()) == ("out_grad",)


MAMBA_STYLE_BACKWARD = """
std::vector<at::Tensor> scan_bwd(const at::Tensor &u, const at::Tensor &delta,
                                 const c10::optional<at::Tensor> &z_,
                                 const at::Tensor &dout, const c10::optional<at::Tensor> &out_,
                                 c10::optional<at::Tensor> &dz_, bool recompute_out_z) {
    at::Tensor du = torch::empty_like(u), ddelta = torch::empty_like(delta), dz, out_z;
    std::vector<at::Tensor> result = {du, ddelta.to(delta.dtype(), false)};
    if (z_.has_value()) { result.push_back(dz); }
    if (recompute_out_z) { result.push_back(out_z); }
    return result;
}
"""


def test_a_backward_returning_its_gradients_is_read_in_its_returns_order():
    """mamba's selective_scan_bwd returns `{du, ddelta, ...}` and pushes `dz` when it has z,
    then `out_z` (no gradient: the list stops there); a braced return reads the same."""
    from testgen.grad_reference import returned_order

    fwd = ["u", "delta", "z_", "delta_softplus"]
    assert returned_order(MAMBA_STYLE_BACKWARD, fwd) == [0, 1, 2]
    assert returned_order("return {grad_delta, grad_u};", fwd) == [1, 0]
    assert returned_order("return {out, du};", fwd) is None  # `out` is no gradient
    assert returned_order("du.copy_(x); return;", fwd) is None


def test_backward_parameters_the_forward_never_takes_are_absent_or_off():
    """The forward's saved results (`x_`, `out_`: optional) are not given and a mode of the
    backward alone (`recompute_out_z`) is off; a required tensor the forward never names
    leaves the backward without a plan."""
    from testgen.grad_reference import _unpaired

    assert _unpaired("const c10::optional<at::Tensor> &") == ("absent",)
    assert _unpaired("std::optional<torch::Tensor>") == ("absent",)
    assert _unpaired("bool") == ("off",) and _unpaired("const bool &") == ("off",)
    assert _unpaired("const at::Tensor &") is None
    assert _unpaired("int64_t") is None


def test_a_forward_call_is_also_made_without_its_optional_tensors():
    """A backward handed none of the forward's saved results runs on calls without the
    optional input that needs them (mamba: `z_` needs `out_`)."""
    from testgen.grad_reference import _without_optionals
    from testgen.inputs import RecordedCall
    from testgen.python_reference import Pairing

    params = [("const at::Tensor &", "u"), ("const c10::optional<at::Tensor> &", "z_")]
    pairing = Pairing("scan_ref", "ops.py", {"u": ("arg", 0), "z": ("arg", 1)}, [("return",)])
    with_z = RecordedCall("fwd", [torch.ones(3), torch.ones(3)], {}, "tests/t.py")
    without_z = RecordedCall("fwd", [torch.ones(3), None], {}, "tests/t.py")
    (made,) = _without_optionals([with_z, without_z], params, pairing)
    assert made.args[1] is None and torch.equal(made.args[0], with_z.args[0])
    pairing.fixed = {1: "tensor"}  # a pairing that never saw it absent does not cover it
    assert _without_optionals([with_z], params, pairing) == []


def test_a_gradient_buffer_the_reference_never_reads_may_stay_unread():
    """A backward handed a buffer it writes and also returns (`dz_`) pairs with a reference
    that never reads it; any other float tensor the reference leaves unread still means the
    pair is not this op."""
    from testgen.inputs import RecordedCall, RefCall
    from testgen.python_reference import _pair_all

    bound = []
    for n in (3, 5):
        x, g = torch.randn(n), torch.randn(n)
        call = RecordedCall("bwd", [x, g, torch.zeros(n)], {}, "tests/t.py")
        bound.append(
            (call, RefCall("kminer_backward", "ops.py", [x, g], {}, [2 * g]), {"x": x, "g": g})
        )
    assert _pair_all(bound, "ops.py", "kminer_backward", "std::vector<at::Tensor>") is None
    found = _pair_all(bound, "ops.py", "kminer_backward", "std::vector<at::Tensor>", frozenset({2}))
    assert found is not None and found.params == {"g": ("arg", 1), "x": ("arg", 0)}
    assert found.outputs == [("return",)]


def test_a_call_kminer_made_is_a_made_case_though_carried_like_a_recorded_one():
    """A backward call made from a forward call's gradient: the label may refuse it (an
    invalid case), where a call the repository's own test made must pass."""
    from testgen.cases import BaseCall, plan
    from testgen.inputs import RecordedCall

    made = RecordedCall("bwd", [torch.ones(4)], {}, "tests/t.py", made=True)
    recorded = RecordedCall("bwd", [torch.ones(5)], {}, "tests/t.py")
    base = [BaseCall([torch.ones(4)], "tests/t.py", call=made)]
    base.append(BaseCall([torch.ones(5)], "tests/t.py", call=recorded))
    cases = {c["id"]: c["made"] for c in plan(base, ["float32"]).cases}
    assert cases["recorded_0"] is True and cases["recorded_1"] is False


def test_a_function_that_made_the_ops_inputs_is_no_reference(tmp_path):
    """longcw/RoIAlign.pytorch's test calls `image, boxes, index = generate_data(...)` and hands
    the image on to the op: its result has the shape of the op's output buffer, and paired
    with the op it made a test that fails a correct kernel. A function that returned what the
    op then took is left out; one that computes from the op's inputs still pairs."""
    from testgen.inputs import RecordedCall, RefCall

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_op.py").write_text(
        "import numpy as np\n\n"
        "def generate_data(n, c):\n    return np.random.randn(n, c).astype(np.float32)\n\n"
        "def doubled_ref(x):\n    return x * 2\n"
    )
    refs = []
    for n in (3,):  # one pair, as there: its numbers are constants
        image = torch.randn(n, 4)
        call = RecordedCall("forward", [image, torch.zeros(n, 4)], {}, "tests/test_op.py")
        made = RefCall("generate_data", "tests/test_op.py", [n, 4], {}, [image.numpy()], [call])
        ref = RefCall("doubled_ref", "tests/test_op.py", [image], {}, [image * 2], [call])
        refs += [made, ref]
    found = pair(refs, "forward", tmp_path, "void")
    assert [p.function for p in found] == ["doubled_ref"]
    assert found[0].params["x"] == ("arg", 0) and found[0].outputs == [("arg", 1)]


def test_a_check_at_a_modules_top_level_is_recorded_before_its_timing_loop_is_cut(tmp_path):
    """ChamferDistancePytorch's unit_test.py checks each op at its top level (the op against
    `chamfer_python.distChamfer`), then times both for 100 steps, for three ops in turn: its
    import outlasted the recording, and the calls were lost with it. The import is now cut at
    the file's budget with the calls kept, each call of the file's own functions made as it is
    imported has a share of that time (so the next op's check still runs), and a module named
    as a reference (`*_python.py`) has each of its functions recorded as a possible one."""
    import subprocess
    import sys

    from testgen.standalone import RECORDER

    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo)
    shutil.rmtree(repo / "tests")
    (repo / "pyref" / "plain_python.py").write_text(
        "def scaled(x, y, mode=None):\n    return x * 0.5 + y\n"
    )
    (repo / "unit_test.py").write_text(
        "import time\n"
        "import torch\n"
        "import pyref.plain_python as plain\n"
        "from pyref.ops import scale_add\n\n\n"
        "def test_scale(fn, n):  # takes arguments: pytest cannot run it itself\n"
        "    x, y = torch.randn(n, device='cuda'), torch.randn(n, device='cuda')\n"
        "    assert torch.allclose(fn(x, y), plain.scaled(x, y))\n\n\n"
        "def timing(n):  # it outlasts any budget\n"
        "    while True:\n"
        "        time.sleep(0.05)\n\n\n"
        "for n in (8, 5):\n"
        "    test_scale(scale_add, n)\n"
        "    timing(n)\n"
        "while True:  # and so does what follows\n"
        "    time.sleep(0.05)\n"
    )
    out = tmp_path / "calls.pt"
    env = {**os.environ, "KMINER_RECORD_BUDGET_S": "6", "KMINER_RECORD_CALL_SHARE_S": "1"}
    argv = [sys.executable, str(RECORDER), str(repo), str(repo / "unit_test.py"), str(out)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    raw = torch.load(out, weights_only=True)
    assert [(c[0], c[1][0].shape[0]) for c in raw["calls"]] == [("scale_add", 8), ("scale_add", 5)]
    assert raw["calls"][0][6] == "pyref_ext"  # the module it went to
    refs = [r for r in raw["refs"] if r[1] == "scaled"]
    assert [r[2][0].shape[0] for r in refs] == [8, 5]
    assert refs[0][0] == "pyref/plain_python.py"


def test_calls_to_a_module_named_after_another_kernels_file_are_not_this_kernels():
    """ChamferDistancePytorch builds chamfer_2D, chamfer_3D and chamfer_5D, each binding
    `forward`: the recorder keeps which module a call went to, and a kernel of chamfer3D/ takes
    neither chamfer_2D's calls (its kernel would read 3 floats a point of 2-float points) nor
    another's; a module named after no kernel file (`mmcv._ext`) serves every kernel."""
    from testgen.inputs import Recorded, RecordedCall

    files = ["chamfer2D/chamfer2D.cu", "chamfer3D/chamfer3D.cu", "ops/roi_align_cuda.cu"]
    recorded = Recorded(
        {
            "forward": [
                RecordedCall("forward", [], module=m) for m in ("chamfer_2D", "chamfer_3D")
            ],
            "roi_align_forward": [RecordedCall("roi_align_forward", [], module="mmcv._ext")],
        }
    )
    shared = {"forward"}  # the name kernels of several files are reached by
    mine = recorded.for_source("chamfer3D/chamfer3D.cu", files, shared)
    assert [c.module for c in mine["forward"]] == ["chamfer_3D"]
    assert [c.module for c in mine["roi_align_forward"]] == ["mmcv._ext"]
    assert mine.refs is recorded.refs
    other = recorded.for_source(
        "chamfer6D/chamfer6D.cu", [*files, "chamfer6D/chamfer6D.cu"], shared
    )
    assert other["forward"] == []  # both are another kernel's
    alone = recorded.for_source("roi_align_cuda.cu", ["roi_align_cuda.cu"], shared)
    assert len(alone["forward"]) == 2  # no kernel file names either module: both kept
    # a name one kernel's file alone is reached by keeps every call, whatever the module's
    # name (an extension `chamfer_2D` that also bound the 3D op)
    assert len(recorded.for_source("chamfer3D/chamfer3D.cu", files, set())["forward"]) == 2


def test_the_package_finds_its_own_installed_version(tmp_path):
    """InternImage's DCNv3 reads its own distribution's version as it is imported
    (`pkg_resources.get_distribution('DCNv3').version`) to choose how many arguments its
    extension takes: the recorder answers with the version its setup.py installs, through
    pkg_resources and importlib.metadata, so the package imports and its calls are recorded
    with the arguments the installed one passes."""
    repo = tmp_path / "repo"
    (repo / "tinyops").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "setup.py").write_text(
        "from setuptools import setup\nfrom torch.utils.cpp_extension import CUDAExtension\n"
        "setup(name='Tiny-Ops', version='1.1',\n"
        "      ext_modules=[CUDAExtension('tinyops_ext', ['op.cu'])])\n"
    )
    (repo / "tinyops" / "__init__.py").write_text("")
    (repo / "tinyops" / "func.py").write_text(
        "import importlib.metadata\nimport pkg_resources\nimport tinyops_ext\n"
        "VERSION = float(pkg_resources.get_distribution('tiny_ops').version)\n"
        "SAME = importlib.metadata.version('tiny-ops') == '1.1'\n"
        "def op(x):\n"
        "    args = [x, 2.0]\n"
        "    if VERSION > 1.0 and SAME:\n"
        "        args.append(True)\n"
        "    return tinyops_ext.forward(*args)\n"
    )
    (repo / "tests" / "test_op.py").write_text(
        "import torch\nfrom tinyops.func import op\n\ndef test_op():\n    op(torch.ones(3))\n"
    )
    recorded = record_repo_calls(repo, tmp_path / "cache")
    (call,) = recorded["forward"]
    assert len(call.args) == 3 and call.args[2] is True
