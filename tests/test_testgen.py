"""Cases and test_code (testgen.cases, testgen.testcode, testgen.stage) on tests/fixtures/refrepo:
recorded binding calls carried down to the launcher, the derived cases, the rendered test, and
(slow) the rendered test run on CPU against a right and a wrong implementation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import slow_package
from test_reference import candidate, kernel

from miner.candidate import Reason, StageName, StageResult, Status
from testgen.carry import carry_down, pybind_arg_names
from testgen.cases import (
    BaseCall,
    channel_tiling,
    label_dtypes,
    plan,
    tile_times,
)
from testgen.generate import generate_for
from testgen.inputs import RecordedCall
from testgen.interp import Unmappable, evaluate, run_statements
from wrappers.label import render_label
from wrappers.mined import mine_wrapper

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("n", 7),
        ("3", 3),
        ("2.5f", 2.5),
        ("true", True),
        ("n * 2 + 1", 15),
        ("-n / 2", -3),  # C++ truncates toward zero; Python's // would give -4
        ("x.size(1)", 4),
        ("x.numel() / n", 1),
        ("(int)n", 7),
        ("static_cast<int>(n)", 7),
    ],
)
def test_evaluate_reads_the_expressions_launchers_get(expr, want):
    env = {"n": 7, "x": torch.zeros(2, 4)}
    assert evaluate(expr, env) == want


@pytest.mark.parametrize("expr", ["f(n)", "x.data_ptr()", "m", "n << 2", "__import__('os')"])
def test_evaluate_refuses_what_it_cannot_follow(expr):
    with pytest.raises(Unmappable):
        evaluate(expr, {"n": 7, "x": torch.zeros(2)})


def test_recorded_call_is_carried_through_the_dispatch_to_the_launcher(refrepo):
    cand = candidate(refrepo, "affine_forward_cuda_kernel")
    x, out = torch.arange(6.0), torch.zeros(6)
    args = carry_down(RecordedCall("affine_forward", [x, out, 2.0, 0.5]), cand, refrepo[3])
    # affine_forward → affine_forward_impl → DISPATCH → affine_forward_cuda →
    # AffineForwardCUDAKernelLauncher(output, input, beta, alpha, input.numel())
    assert args[0] is out and args[1] is x
    assert args[2:] == [0.5, 2.0, 6]


def test_computed_launcher_argument_is_evaluated(refrepo):
    cand = candidate(refrepo, "shift_forward_cuda_kernel")
    x, out = torch.ones(3), torch.zeros(3)
    args = carry_down(RecordedCall("shift_forward", [x, out, 3]), cand, refrepo[3])
    assert args[2] == 6  # shift_forward_cuda passes `by * 2`


def test_ops_behind_autograd_functions_reach_their_launcher_through_apply(refrepo):
    cand = candidate(refrepo, "pool_kernel")
    op = cand.wrapper.op_map
    # pool_cuda ← pool_fw ← PoolSum/PoolMax::forward ← pool_sum/pool_max (K::apply) ← .op(...)
    assert set(op["python_names"]) == {"pool_sum", "pool_max"}
    assert {"pool_fw", "pool_sum", "pool_max"} <= set(op["chain"])
    mat, weight = torch.arange(4.0), torch.full((4,), 2.0)
    args = carry_down(RecordedCall("pool_sum", [mat, weight]), cand, refrepo[3])
    assert args[0] is mat and args[1] is weight and args[2] == "sum"  # `if (has_weight) o = w;`
    args = carry_down(RecordedCall("pool_sum", [mat, None]), cand, refrepo[3])
    assert args[0] is mat and args[1] is None
    args = carry_down(RecordedCall("pool_max", [mat]), cand, refrepo[3])
    assert args[0] is mat and args[1] is None and args[2] == "max"


def test_optionals_and_unbraced_ifs_are_followed():
    env = {"o": None, "x": torch.ones(2), "flag": True}
    assert evaluate("o.has_value() ? o.value() : x", env) is env["x"]
    assert evaluate("x.has_value()", env) is True
    body = "{ std::optional<torch::Tensor> w = std::nullopt; if (flag) w = x; int k = 1; }"
    assert run_statements(body, env)["w"] is env["x"]
    assert run_statements(body, {**env, "flag": False})["w"] is None
    with pytest.raises(Unmappable):
        evaluate("o.value()", env)


def test_call_that_does_not_fit_the_binding_is_unmappable(refrepo):
    cand = candidate(refrepo, "affine_forward_cuda_kernel")
    with pytest.raises(Unmappable, match="does not fit affine_forward"):
        carry_down(RecordedCall("affine_forward", [torch.ones(2)]), cand, refrepo[3])


def test_pybind_keyword_names_come_from_py_arg():
    text = (
        'm.def("roi_forward", &roi_forward, "doc", py::arg("input"),\n'
        '      py::arg("pooled_height"), py::arg("scale"));\n'
        'm.def("other", &other, py::arg("z"));'
    )
    refs = SimpleNamespace(disc=SimpleNamespace(models={"p.cpp": SimpleNamespace(text=text)}))
    assert pybind_arg_names(refs, "roi_forward") == ["input", "pooled_height", "scale"]
    assert pybind_arg_names(refs, "missing") is None


def test_a_binding_named_unlike_its_function_is_carried_to_that_function():
    """mamba binds `selective_scan_fwd` as `fwd`: the recorded `fwd(...)` calls are calls of
    `selective_scan_fwd`, whose parameters name their arguments (they found no definition of
    `fwd` before, so the test got no cases and its PyTorch reference no pairs)."""
    from testgen.carry import bound_function, defined_name

    text = 'PYBIND11_MODULE(m, m) {\n  m.def("fwd", &selective_scan_fwd, "doc");\n}'
    params = {"selective_scan_fwd": ["u", "delta", "softplus"]}
    refs = SimpleNamespace(
        disc=SimpleNamespace(models={"s.cpp": SimpleNamespace(text=text)}),
        params_of=params.get,
        registry={},  # no op registered per device (TORCH_LIBRARY_IMPL)
    )
    assert bound_function(refs, "fwd") == "selective_scan_fwd"
    assert bound_function(refs, "bwd") is None
    assert defined_name(refs, "fwd") == "selective_scan_fwd"
    assert defined_name(refs, "selective_scan_fwd") == "selective_scan_fwd"
    cand = SimpleNamespace(
        wrapper=SimpleNamespace(
            op_map={"python_name": "fwd", "chain": ["launch", "selective_scan_fwd"]},
            functions=["selective_scan_fwd"],
            launcher="launch",
        )
    )
    u, delta = torch.ones(2), torch.zeros(2)
    assert carry_down(RecordedCall("fwd", [u, delta, True]), cand, refs) == [u, delta, True]


def test_dtypes_follow_the_dispatch_macro():
    assert label_dtypes("AT_DISPATCH_FLOATING_TYPES_AND_HALF(x") == [
        "float32",
        "float64",
        "float16",
    ]
    assert label_dtypes("AT_DISPATCH_FLOATING_TYPES(x") == ["float32", "float64"]
    assert label_dtypes("x.data_ptr<float>()") == ["float32"]


def roi_call(channels: int = 2) -> list:
    feats = torch.randn(1, channels, 4, 4)
    rois = torch.tensor([[0.0, 0.0, 0.0, 3.0, 3.0]])
    return [feats, rois, torch.zeros(1, channels, 2, 2), 2, 2, 0.5, 1, True]


def test_channel_tiling_takes_the_data_and_its_outputs():
    assert channel_tiling(roi_call(channels=3)) == [0, 2]
    # an integer argument equal to C may be the channel count: not tiled
    assert channel_tiling([*roi_call(channels=2)[:3], 2]) is None
    # with C = 1, only an argument named like a channel count blocks it
    one = roi_call(channels=1)
    assert channel_tiling(one, ["in", "rois", "out", "h", "w", "s", "ratio", "al"]) == [0, 2]
    assert channel_tiling(one, ["in", "rois", "out", "h", "w", "s", "channels", "al"]) is None
    # a tensor with a multiple of C at dim 1 mixes channels with something else
    mixed = [torch.randn(2, 3, 4, 4), torch.zeros(6, 6, 4, 4)]
    assert channel_tiling(mixed) is None
    # boxes (2-D data) are not channels
    assert channel_tiling([torch.randn(5, 4), torch.zeros(5, 5)]) is None
    # a per-channel vector (fused bias + activation: x [N, C, H, W], bias [C]) goes along
    biased = [torch.randn(2, 3, 2, 2), torch.randn(3), torch.empty(0), 3 + 1, 0]
    assert channel_tiling(biased) == [0, 1]
    # 2-D data [N, C] is widened only beside such a vector (its dim 1 is then channels)
    assert channel_tiling([torch.randn(1, 3), torch.randn(3), torch.empty(0), 0, 1]) == [0, 1]
    assert channel_tiling([torch.randn(1, 3), torch.randn(4), 0, 1]) is None
    # points of D coordinates beside a kernel size and a flag per coordinate (spline_conv's
    # pseudo [E, D], kernel_size [D], is_open_spline [D]): D is no channel count (x513 copies
    # made 2^1026 weights and the reference died of it)
    pseudo = [torch.rand(4, 2), torch.tensor([5, 5]), torch.tensor([1, 1], dtype=torch.uint8), 1]
    assert channel_tiling(pseudo) is None
    # tiny data gets a third, large widening so loops over several blocks are reached
    assert tile_times(3) == [3, 37, 1367] and tile_times(4 * 64 * 8) == [3, 37]


def test_plan_has_five_cases_over_three_shapes_from_one_recorded_call():
    p = plan([BaseCall(roi_call(channels=3), "tests/test_roi.py")], ["float32", "float64"])
    ids = [c["id"] for c in p.cases]
    assert ids == [
        "recorded_0",
        "flag7_flipped_of_0",  # `aligned`, a mode the recorded call never varies
        "nonzero2_of_0",  # the output buffer, zeros as recorded: drawn at random in the test
        "edge_zeros",
        "edge_negative",
        "edge_large",
        "channels_x3",
        "channels_x37",
        "channels_x87",  # 48 values x 37 stay under 4096: one widening past it
        "typical_float64",
    ]
    assert p.shapes == 4 and len(p.cases) >= 5
    assert p.cases[6]["tile"] == {"args": [0, 2], "times": 3}


def test_a_widened_case_stays_within_the_size_a_test_holds():
    """37 copies of a large call's channels (ChamferDistancePytorch: 32 clouds of 2000
    points became 74000 a cloud) are minutes of a CPU reference comparing every pair: the
    widening that would pass MAX_ELEMENTS comes from a smaller recorded call instead, and
    none is made when no call is small enough."""
    from testgen.cases import MAX_ELEMENTS

    big = roi_call(channels=3)
    big[0], big[2] = torch.randn(2, 3, 128, 128), torch.zeros(2, 3, 2, 2)  # x3 fits, x37 not
    small = roi_call(channels=3)
    p = plan([BaseCall(big, "t.py"), BaseCall(small, "t.py")], ["float32"])
    tiles = {c["id"]: c["base"] for c in p.cases if c["tile"]}
    assert tiles == {"channels_x3": 0, "channels_x37": 1}
    for c in p.cases:
        if c["tile"]:
            args = p.base[c["base"]].args
            extra = sum(args[i].numel() for i in c["tile"]["args"]) * (c["tile"]["times"] - 1)
            assert sum(a.numel() for a in args if hasattr(a, "numel")) + extra <= MAX_ELEMENTS
    alone = plan([BaseCall(big, "t.py")], ["float32"])
    assert [c["id"] for c in alone.cases if c["tile"]] == ["channels_x3"]


def test_an_index_tensors_absent_entries_are_filled_in_one_case_each():
    """pytorch3d's rasterizer backward kernels: pix_to_face (N, H, W, K) holds -1 where a pixel
    has fewer than K faces, and the last pixel is background in every recorded image, so a loop
    one element short passed every case. The filled call names a face at every entry, each one
    its own image holds; it is kminer's call (made), the recorded one is unchanged, and tensors
    with no -1 (or other negatives: no sentinel) and the probe's whole calls get none."""
    from testgen.sentinels import filled_calls

    pix = torch.tensor(
        [[[[0, 2], [1, -1]], [[-1, -1], [-1, -1]]], [[[5, -1], [-1, -1]], [[6, 7], [-1, -1]]]]
    )
    grads = torch.randn(2, 2, 2, 2)
    calls = [BaseCall([grads, pix, 0.5], "tests/test_blend.py")]
    p = plan(calls, ["float32"], ["grad", "pix_to_face", "sigma"])
    filled = [c for c in p.cases if c["id"].startswith("filled")]
    assert [c["id"] for c in filled] == ["filled1_of_0"] and filled[0]["made"]
    args = p.base[filled[0]["base"]].args
    assert bool((args[1] >= 0).all()) and torch.equal(args[0], grads)
    assert set(args[1][0].unique().tolist()) <= {0, 1, 2} and set(args[1][1].unique().tolist()) <= {
        5,
        6,
        7,
    }
    assert torch.equal(args[1][pix >= 0], pix[pix >= 0])  # present entries keep their index
    assert int((p.base[0].args[1] == -1).sum()) == 10  # the recorded call as it was
    assert filled_calls([grads, torch.tensor([0, 1, 2]), torch.tensor([-2, -1, 3])]) == []
    assert not [
        c for c in plan(calls, ["float32"], whole=True).cases if c["id"].startswith("filled")
    ]


def _plan_module():
    """The test template's `_prepare` (how a case's arguments are made), run on its own."""
    from types import SimpleNamespace

    text = (ROOT / "prompts" / "test_code.py.j2").read_text()
    start = text.index("\ndef _prepare(")
    scope: dict = {"LARGE": 1000.0}
    exec("import torch\n", scope)
    exec(text[start : text.index("\ndef ", start + 1)], scope)
    return SimpleNamespace(_prepare=scope["_prepare"])


def test_a_floating_input_zero_in_every_recorded_call_is_filled_in_one_case():
    """pytorch3d's face areas/normals backward: its test's loss uses the areas only, so the
    normals' gradient is zeros in every recorded call and a wrong sign in the terms it scales
    passed every case. One made case fills it with random values, and one more does on the
    smallest cut of a recorded call (the whole mesh holds degenerate faces, where fused rounding
    left the first case outside the contract); the recorded calls keep their zeros, and a
    position nonzero in some recorded call is left alone."""
    grad_areas, verts = torch.rand(6), torch.rand(5, 3)
    faces = torch.tensor([[0, 1, 2], [1, 2, 3], [2, 3, 4], [0, 2, 4], [0, 1, 3], [1, 3, 4]])
    calls = [
        BaseCall([grad_areas, torch.zeros(6, 3), verts, faces], "tests/test_normals.py"),
        BaseCall([grad_areas[:4], torch.zeros(4, 3), verts, faces[:4]], "tests/test_normals.py"),
    ]
    p = plan(calls, ["float32"], ["grad_areas", "grad_normals", "verts", "faces"])
    made = [c for c in p.cases if c["id"].startswith("nonzero")]
    assert [(c["id"], c["base"], c["nonzero"], c["made"]) for c in made] == [
        ("nonzero1_of_0", 0, [1], True),
        ("nonzero1_of_2", 2, [1], True),  # the smallest cut of a recorded call, too
    ]
    cut = p.base[2]
    assert cut.rows_of is not None and len(cut.args[3]) < len(p.base[cut.rows_of].args[3])
    module = _plan_module()
    args = module._prepare(p.base[0].args, made[0])
    assert bool(args[1].abs().gt(0).all()) and args[1].dtype == torch.float32
    assert torch.equal(args[0], grad_areas) and torch.equal(args[3], faces)
    assert torch.equal(module._prepare(p.base[0].args, made[0])[1], args[1])  # a fixed draw
    assert not bool(module._prepare(p.base[0].args, p.cases[0])[1].any())  # recorded: zeros
    some = [calls[0], BaseCall([grad_areas, torch.ones(6, 3), verts, faces], "t.py")]
    assert not [c for c in plan(some, ["float32"]).cases if c["id"].startswith("nonzero")]


def test_a_flag_the_recorded_calls_never_vary_is_flipped_once():
    """SparseConvNet's batch norm is recorded under a training script only (train=True): its
    inference kernel is reached by the same call with the flag flipped."""
    x = torch.randn(6, 4)
    calls = [BaseCall([x, torch.zeros(4), True, 0.1, False, True], "ex.py")]
    calls.append(BaseCall([x[:3], torch.zeros(4), True, 0.2, True, True], "ex.py"))
    names = ["input", "mean", "train", "eps", "relu", "verbose"]
    p = plan(calls, ["float32"], names)
    flips = [c for c in p.cases if c.get("flag") is not None]
    assert [(c["id"], c["flag"], c["was"]) for c in flips] == [("flag2_flipped_of_0", 2, True)]
    flipped = p.base[flips[0]["base"]].args
    assert flipped[2] is False and flipped[4] is False and flipped[5] is True  # only `train`
    assert flipped[0] is x and p.base[0].args[2] is True  # the recorded call is unchanged
    assert all(c.get("flag") is None for c in p.cases if c not in flips)


def test_a_string_mode_is_crossed_onto_a_kind_of_shape_it_was_never_recorded_with():
    """pytorch_scatter's segment_coo: the tests reduce broadcast rows (src of rank 3) by sum
    and mean only, and flat rows by min and max; min/max over broadcast rows runs a kernel of
    its own (the arg broadcast), reached only by crossing the mode onto that shape."""
    flat, idx = torch.randn(6), torch.tensor([0, 0, 1, 1, 2, 2])
    wide, widx = torch.randn(2, 3, 2), torch.zeros(2, 3, dtype=torch.long)
    calls = [
        BaseCall([flat, idx, None, "sum"], "t.py"),
        BaseCall([wide, widx, None, "sum"], "t.py"),
        BaseCall([flat, idx, None, "max"], "t.py"),
        BaseCall([flat, idx, torch.zeros(3), "min"], "t.py"),
    ]
    p = plan(calls, ["float32"], ["src", "index", "out", "reduce"])
    crossed = {
        (c["id"], p.base[c["base"]].args[3], c["was"]) for c in p.cases if c.get("flag") == 3
    }
    assert ("mode3_max_of_1", "max", "sum") in crossed  # max onto the broadcast rows
    assert ("mode3_min_of_1", "min", "sum") in crossed
    assert ("mode3_sum_of_3", "sum", "min") in crossed  # sum with an output given
    assert all(p.base[c["base"]].args[0] is not None for c in p.cases)
    assert calls[1].args[3] == "sum"  # the recorded call is unchanged
    half = [BaseCall([b.args[0].half(), *b.args[1:]], "t.py") for b in calls]
    crossed_half = [c for c in plan(half, ["float32", "float64"]).cases if c.get("flag") == 3]
    assert crossed_half and all(c["dtype"] == "float32" for c in crossed_half)  # ints judged
    assert all(c["dtype"] is None for c in p.cases if c.get("flag") == 3)  # float32 as recorded
    one_mode = plan([BaseCall([flat, idx, None, "sum"], "t.py")] * 2, ["float32"])
    assert not [c for c in one_mode.cases if c.get("flag") is not None]  # nothing to cross
    named = ["x", "log_level"]
    verbose = plan([BaseCall([flat, "a"], "t.py"), BaseCall([wide, "b"], "t.py")], [], named)
    assert not [c for c in verbose.cases if c.get("flag") is not None]


def test_data_recorded_in_half_or_double_gets_its_float32_case():
    """pytorch_scatter's tests call in float16: the plan's other dtypes used to start after
    float32, so no case judged in float32 what half precision cannot (integer argmins among
    near ties), and float64 data got a second float64 case instead."""
    x = torch.randn(6, 4)
    for recorded, want in (
        (torch.float16, ["typical_float32", "typical_float64"]),
        (torch.float64, ["typical_float32", "typical_float16"]),
        (torch.float32, ["typical_float64", "typical_float16"]),
    ):
        p = plan([BaseCall([x.to(recorded), 0.5], "t.py")], ["float32", "float64", "float16"])
        assert [c["id"] for c in p.cases if c["id"].startswith("typical_")] == want


def test_boxes_get_no_zeros_case():
    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0]])
    p = plan([BaseCall([boxes, torch.tensor([0.9, 0.8]), 0.5], "t.py")], ["float32"])
    assert "edge_zeros" not in [c["id"] for c in p.cases]
    assert "edge_negative" in [c["id"] for c in p.cases]


def test_edge_values_go_past_regions_that_lead_with_a_batch_index():
    """RoIAlign's backward binding takes `rois (K, 5)` = [b, x1, y1, x2, y2] before the
    gradient: negated or enlarged, column 0 indexed outside the batch and the CPU twin wrote
    outside its buffer (PyTorch-Encoding's test passed its cases, then died at exit). The edge
    values now go in the gradient; boxes without a batch column keep them."""
    rois = torch.tensor([[0.0, 1.5, 1.0, 6.2, 5.0], [1.0, 0.0, 2.0, 3.0, 7.5]])
    grad = torch.randn(2, 3, 2, 2)
    p = plan([BaseCall([rois, grad, 2, 3, 8, 8, 2, 2, 0.5, 2], "t.py")], ["float32"])
    edges = [c for c in p.cases if c["edge"]]
    assert {c["id"] for c in edges} == {"edge_zeros", "edge_negative", "edge_large"}
    assert all(c["edge_arg"] == 1 for c in edges)
    text = (ROOT / "prompts" / "test_code.py.j2").read_text()
    start = text.index("\ndef _prepare(")
    scope: dict = {"LARGE": 1000.0}
    exec("import torch\n", scope)
    exec(text[start : text.index("\ndef ", start + 1)], scope)
    negated = scope["_prepare"]([rois, grad, 2], edges[1])
    assert torch.equal(negated[0], rois) and torch.equal(negated[1], -grad)
    old_case = {k: v for k, v in edges[1].items() if k != "edge_arg"}  # a test rendered before
    assert torch.equal(scope["_prepare"]([rois, grad, 2], old_case)[0], -rois)
    beyond = rois.clone()
    beyond[1, 0] = 7.0  # no batch of 8 is stated: a coordinate, not an index
    p = plan([BaseCall([beyond, grad, 2, 3], "t.py")], ["float32"])
    assert all(c["edge_arg"] == 0 for c in p.cases if c["edge"])
    # a drafted call none of whose edge values its reference ran clean gets none, in any mode
    modes = [BaseCall([grad, m], "t.py", edges=()) for m in (1, 2)]
    assert not [c for c in plan(modes, ["float32"], whole=True).cases if c["edge"]]


def write_label(refrepo, cand, workdir) -> None:
    """The label as the wrap stage writes it, and a passed build stage."""
    disc, extractor, index, _ = refrepo
    mined = mine_wrapper(kernel(disc, cand.kernel.name), extractor, index)
    label = render_label(
        cand_id=cand.id,
        kernel=cand.kernel.name,
        repo_url=cand.provenance.repo_url,
        commit=cand.provenance.commit,
        file=cand.kernel.file,
        line=cand.kernel.line,
        license="MIT",
        strategy="mined",
        launcher=mined.chain[-1],
        includes=mined.includes,
        device_code=mined.code,
        host_code="",
        functions=mined.functions(),
    )
    (workdir / "labels").mkdir(exist_ok=True)
    (workdir / "labels" / f"{cand.id}.cu").write_text(label.text)
    cand.wrapper.label_path = f"labels/{cand.id}.cu"
    cand.wrapper.label_hash = label.hash
    cand.set_stage(StageName.BUILD, StageResult(status=Status.OK))


def affine_recorded() -> dict:
    calls = []
    for n in (5, 300, 1000):
        x = torch.linspace(-3, 3, n)
        calls.append(RecordedCall("affine_forward", [x, torch.zeros(n), 2.0, 0.5], {}, "t.py"))
    return {"affine_forward": calls}


def test_generate_for_writes_test_variants_and_metrics(refrepo, tmp_path):
    cand = candidate(refrepo, "affine_forward_cuda_kernel")
    write_label(refrepo, cand, tmp_path)
    generate_for(cand, refrepo[3], affine_recorded(), tmp_path)
    r = cand.stage(StageName.TESTGEN)
    assert r.status == Status.OK, r.detail
    assert r.metrics["reference_kind"] == "cpp"
    assert r.metrics["num_cases"] == cand.tests.num_cases >= 5
    # 3 recorded lengths, fewer rows of them (the count `n` follows): 1, 3 (of 5), 151, and
    # 4003 rows drawn from the 1000 of the largest
    assert r.metrics["num_shapes"] == cand.tests.num_shapes == 8
    assert cand.tests.dtypes == ["float32", "float64"]
    kinds = cand.tests.variant_kinds  # each kind's best first, then its alternates
    assert sorted(set(kinds)) == ["no_write", "off_by_one", "op_swap"] and len(kinds) > 3
    assert kinds == sorted(kinds, key=["no_write", "off_by_one", "op_swap"].index)
    assert all((tmp_path / v).is_file() for v in cand.tests.variants)
    text = (tmp_path / cand.tests.path).read_text()
    compile(text, cand.tests.path, "exec")
    assert 'FUNCTION = "AffineForwardCUDAKernelLauncher"' in text
    assert "affine_forward_cpu" in text and "rtol" in text
    # fewer rows made at the binding and carried down (the count `n` follows)
    assert "binding_0_of_0" in text and "recorded call 0 (t.py) with the first 3 rows" in text
    assert "random_rows4003_of_2" in text and "4003 rows drawn from recorded call 2" in text


def test_new_tests_forget_the_last_verdict(refrepo, tmp_path):
    cand = candidate(refrepo, "affine_forward_cuda_kernel")
    write_label(refrepo, cand, tmp_path)
    cand.set_stage(StageName.VERIFY, StageResult(status=Status.OK, metrics={"outcome": "pass"}))
    generate_for(cand, refrepo[3], affine_recorded(), tmp_path)
    assert (
        cand.stage(StageName.TESTGEN).status == Status.OK and cand.stage(StageName.VERIFY) is None
    )


def test_generate_for_without_calls_is_no_cases(refrepo, tmp_path, monkeypatch):
    monkeypatch.setenv("KMINER_PROBE", "off")
    cand = candidate(refrepo, "affine_forward_cuda_kernel")
    write_label(refrepo, cand, tmp_path)
    generate_for(cand, refrepo[3], {}, tmp_path)
    r = cand.stage(StageName.TESTGEN)
    assert (r.status, r.reason.value) == (Status.SKIPPED, "no_cases")
    assert "never call affine_forward" in r.detail
    assert cand.reference.kind == "cpp"  # the reference is kept for when cases come


@pytest.mark.slow
def test_an_op_no_test_calls_gets_calls_its_cpu_reference_runs_clean(refrepo, tmp_path):
    """The probe (testgen/probe_inputs.py) drafts affine_forward's calls and keeps those its
    CPU implementation, built with AddressSanitizer, runs clean: the test is made from them."""
    cand = candidate(refrepo, "affine_forward_cuda_kernel")
    write_label(refrepo, cand, tmp_path)
    generate_for(cand, refrepo[3], {}, tmp_path)
    r = cand.stage(StageName.TESTGEN)
    assert r.status == Status.OK, r.detail
    assert r.metrics["cases_source"] == cand.tests.cases_source == "probe"
    assert r.metrics["reference_kind"] == "cpp" and r.metrics["num_shapes"] >= 3
    text = (tmp_path / cand.tests.path).read_text()
    assert "built with AddressSanitizer, ran clean" in text  # who made the inputs, stated
    assert list((tmp_path / "probes").rglob("*.so"))  # the ASan build, cached in the workdir


CPU_AFFINE = """#include <torch/extension.h>
void AffineForwardCUDAKernelLauncher(at::Tensor out, const at::Tensor in, const float b,
                                     const float a, const int n) {
  AT_DISPATCH_FLOATING_TYPES(in.scalar_type(), "affine", [&] {
    auto* o = out.data_ptr<scalar_t>();
    auto* i = in.data_ptr<scalar_t>();
    for (int k = 0; k < n; ++k) o[k] = a * i[k] + b%s;
  });
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("AffineForwardCUDAKernelLauncher", &AffineForwardCUDAKernelLauncher);
}
"""


@pytest.mark.slow
def test_rendered_test_passes_the_right_code_and_fails_a_wrong_one(refrepo, tmp_path):
    """The generated file, run by pytest in a subprocess on CPU implementations: the right one
    passes with every case within tolerance, one off by 1e-3 on the last element fails."""
    cand = candidate(refrepo, "affine_forward_cuda_kernel")
    write_label(refrepo, cand, tmp_path)
    generate_for(cand, refrepo[3], affine_recorded(), tmp_path)
    good, bad, noisy, drawn = (tmp_path / f"{n}.cpp" for n in ("good", "bad", "noisy", "drawn"))
    good.write_text(CPU_AFFINE % "")
    bad.write_text(CPU_AFFINE % " + (k == n - 1 ? 1e-3 : 0)")
    # another last element on every call (a race, a random start): no case can judge it
    noisy.write_text(CPU_AFFINE % " + (k == n - 1 ? ((++calls) % 2 ? 1.0 : -1.0) : 0)")
    noisy.write_text(noisy.read_text().replace("void Affine", "static int calls = 0;\nvoid Affine"))
    # a host function that draws a random number (a random walk's start) repeats itself under
    # one seed, and no seed makes the CPU's draw equal the GPU's: it must be run under another
    drawn.write_text(
        CPU_AFFINE % " + (k == n - 1 ? at::rand({1}, in.options()).item<scalar_t>() : 0)"
    )
    impls = (good, bad, noisy, drawn)
    outcomes = {impl.stem: _run_generated(tmp_path, cand, impl) for impl in impls}
    code, rep = outcomes["good"]
    assert code == 0 and rep["outcome"] == "pass", rep
    assert len(rep["cases"]) == cand.tests.num_cases
    assert all(c["ok"] and c["max_abs"] < 1e-4 for c in rep["cases"])
    assert {c["dtype"] for c in rep["cases"]} == {"float32", "float64"}
    code, rep = outcomes["bad"]
    assert code != 0 and rep["outcome"] == "mismatch"  # a wrong kernel repeats itself
    assert any(not c["ok"] and c["max_abs"] >= 5e-4 for c in rep["cases"])
    code, rep = outcomes["noisy"]
    assert code != 0 and rep["outcome"] == "nondeterministic", rep
    assert all(c["ok"] is None and "run again" in c["note"] for c in rep["cases"])
    code, rep = outcomes["drawn"]
    assert code != 0 and rep["outcome"] == "nondeterministic", rep


MODE_LABEL = """#include <torch/extension.h>
__global__ void mode_kernel(const float* x, float* y, int mode, int n) {
  int i = threadIdx.x;
  if (i >= n) return;
  if (mode == 0) {
    y[i] = x[i] * 2.0f;
  } else {
    y[i] = x[i] + 3.0f;
  }
}
void launch_mode(at::Tensor x, at::Tensor y, int mode) {
  int n = x.numel();
  mode_kernel<<<1, 32>>>(x.data_ptr<float>(), y.data_ptr<float>(), mode, n);
}
"""


def test_branches_no_case_reaches_get_no_variant():
    from testgen.reach import dead_spans, kernel_scalars
    from testgen.variants import VariantKind, derive_variants

    x = torch.ones(5)
    params = ["x", "y", "mode", "n"]
    known = kernel_scalars(
        MODE_LABEL, "mode_kernel", "launch_mode", params, {"x": x, "y": x, "mode": 1}
    )
    assert known == {"mode": 1, "n": 5}
    dead = dead_spans(MODE_LABEL, "mode_kernel", known)
    assert [MODE_LABEL[a:b] for a, b in dead] == ["{\n    y[i] = x[i] * 2.0f;\n  }"]
    swaps = [
        v for v in derive_variants(MODE_LABEL, "mode_kernel", dead) if v.kind == VariantKind.OP_SWAP
    ]
    assert swaps and all("x[i] * 2.0f" in v.text for v in swaps)  # the dead branch is untouched
    assert "x[i] - 3.0f" in swaps[0].text
    # mode 0 reaches the first branch: the `else` is dead instead
    known0 = kernel_scalars(
        MODE_LABEL, "mode_kernel", "launch_mode", params, {"x": x, "y": x, "mode": 0}
    )
    assert [MODE_LABEL[a:b] for a, b in dead_spans(MODE_LABEL, "mode_kernel", known0)] == [
        "else {\n    y[i] = x[i] + 3.0f;\n  }"
    ]


FALLTHROUGH = """void im2col_forward(Tensor input, Tensor offset, Tensor columns, int kh, int kw) {
  const int batch = input.size(0);
  const int channels = input.size(1);
  int unused = weird_call(input);
  columns = at::zeros({channels * kh * kw, input.size(2) * input.size(3)}, input.options());
  for (int b = 0; b < batch; b++) {
    im2col_impl(input[b], offset[b], channels, kh, kw, columns);
  }
}"""


def test_statements_before_the_call_are_run_in_order():
    x = torch.randn(2, 3, 4, 5)
    env = {"input": x, "offset": torch.zeros(2, 8, 4, 5), "columns": torch.zeros(1), "kh": 2}
    env["kw"] = 2
    at = FALLTHROUGH.index("im2col_impl")
    out = run_statements(FALLTHROUGH, env, at)
    assert (out["batch"], out["channels"], out["b"]) == (2, 3, 0)
    assert "unused" not in out  # a call the interpreter cannot follow leaves the name unknown
    cols = out["columns"]
    assert cols.shape == (12, 20) and cols.dtype == x.dtype
    assert cols.abs().sum() > 0  # an op's own buffer gets seeded random values
    assert torch.equal(cols, run_statements(FALLTHROUGH, env, at)["columns"])  # fixed seed
    assert torch.equal(evaluate("input[b]", out), x[0])
    assert evaluate("input.view({batch, -1}).size(1)", out) == 60
    assert evaluate("x.ndimension() == 4 && !(kh > 3)", {**out, "x": x}) is True


def test_ternary_and_normalizing_reassignment():
    src, index = torch.zeros(2, 5), torch.zeros(2, 5, dtype=torch.long)
    env = {"src": src, "index": index, "dim": -1}
    body = """{
  dim = dim < 0 ? src.dim() + dim : dim;
  index = broadcast(index, src, dim);
  auto other = mystery(src);
  auto result = scatter_fw(src, index, dim, "min");
}"""
    out = run_statements(body, env, body.index("auto result"))
    assert out["dim"] == 1  # the ternary, as C++ reads it
    assert out["index"] is index  # `x = f(x, ...)` beside tensors of x's shape: kept
    narrow = {**env, "index": torch.zeros(2, 1, dtype=torch.long)}  # f would expand it
    assert "index" not in run_statements(body, narrow, body.index("auto result"))
    assert "other" not in out  # anything else unknown stays unknown
    assert evaluate('"min"', out) == "min"
    assert evaluate("a ? b : c", {"a": 0, "b": 1, "c": 2}) == 2


def test_only_the_branch_taken_runs_and_vectors_come_out_of_tensors():
    body = """{
  int batch = 1;
  if (input.ndimension() == 3) {
    batch = 0;
    input = input.view({1, input.size(0), input.size(1), input.size(2)});
  } else {
    batch = 2;
  }
  std::vector<float> size_v(size.data_ptr<float>(), size.data_ptr<float>() + size.numel());
  if (unknown_flag) {
    input = impossible(input, 3);
  }
  launch(input, size_v, batch);
}"""
    x = torch.zeros(2, 3, 4, 5)
    env = {"input": x, "size": torch.tensor([0.5, 0.25, 1.0])}
    out = run_statements(body, env, body.index("launch("))
    assert out["batch"] == 2  # the else branch: a 4-D input
    assert out["input"] is x  # the 3-D branch's view (invalid here) never ran
    assert out["size_v"] == [0.5, 0.25, 1.0]


def test_timing_takes_the_gpu_alone_and_waiting_timing_goes_first(refrepo, tmp_path, monkeypatch):
    """The generated test's KMINER_GPU_LOCK: a timing waits for the shared holders under way,
    and a test that asks for the GPU while a timing waits comes after it."""
    import importlib.util
    import threading
    import time

    cand = candidate(refrepo, "affine_forward_cuda_kernel")
    write_label(refrepo, cand, tmp_path)
    generate_for(cand, refrepo[3], affine_recorded(), tmp_path)
    monkeypatch.setenv("KMINER_GPU_LOCK", str(tmp_path / "gpu.lock"))
    spec = importlib.util.spec_from_file_location("gen_test", tmp_path / cand.tests.path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    events = []

    def hold(name, alone, seconds, delay):
        time.sleep(delay)
        with mod._gpu(alone):
            events.append((name, "in"))
            time.sleep(seconds)
            events.append((name, "out"))

    threads = [
        threading.Thread(target=hold, args=("cases", False, 0.6, 0.0)),
        threading.Thread(target=hold, args=("timing", True, 0.3, 0.2)),
        threading.Thread(target=hold, args=("later", False, 0.1, 0.4)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert events == [
        ("cases", "in"),
        ("cases", "out"),
        ("timing", "in"),
        ("timing", "out"),
        ("later", "in"),
        ("later", "out"),
    ]


def test_base_calls_spread_over_modes_before_shapes():
    """scatter's arg kernel runs for min and max only: those calls must be among the few kept,
    however many sum calls of other shapes the repository's tests make."""
    from testgen.cases import _diverse, mode_key

    def call(n, reduce, out=None):
        return BaseCall([torch.rand(n), torch.zeros(n, dtype=torch.long), out, reduce], "t.py")

    found = [call(n, "sum") for n in range(2, 12)] + [call(3, "min"), call(4, "max")]
    found.append(call(5, "sum", out=torch.zeros(1)))  # an optional out given: the same mode
    assert mode_key(found[-1].args) == mode_key(found[0].args)
    kept = _diverse(found)
    assert [b.args[3] for b in kept][:3] == ["sum", "min", "max"] and len(kept) == 8
    p = plan(kept, ["float32"])
    large = {kept[c["base"]].args[3] for c in p.cases if c["edge"] == "large"}
    assert large == {"sum", "min", "max"}


def test_base_calls_spread_over_sizes_reach_each_side_of_a_launch_threshold():
    """ms_deform_attn picks one of six backward kernels by `channels` (<= 32, 64..1024, > 1024
    and a multiple of 1024, ...): the kept calls must span the sizes the tests use, not stop
    at the first few they list."""
    from testgen.cases import _diverse

    channels = [2, 30, 32, 64, 71, 1025, 2048, 3096, 4096, 5000]
    found = [BaseCall([torch.rand(1, 3, c), "sum"], "t.py") for c in channels]
    kept = [b.args[0].shape[-1] for b in _diverse(found)]
    assert kept[0] == 2  # the first call stays the typical case
    assert len(kept) == 8 and {30, 5000} <= set(kept)  # the smallest and the largest
    assert {64, 1025, 2048} & set(kept) and len({c > 1024 for c in kept}) == 2


def test_atomic_slots_make_outputs_order_free():
    from testgen.testcode import order_free_reason

    assert "atomicAdd(count, 1)" in order_free_reason("    int slot = atomicAdd(count, 1);\n")
    assert order_free_reason("coors_order[i] = atomicAdd(coors_count, 1);")
    assert order_free_reason("atomicAdd(out + i, v);\n") == ""  # a sum: its order is no output
    assert order_free_reason("if (atomicAdd(&n, 0) == 3) ok = 1;") == ""
    assert order_free_reason("old = atomicCAS(addr, assumed, v);") == ""  # an atomic max loop


def compact_recorded() -> dict:
    calls = []
    for n in (6, 200, 1000):
        x = torch.linspace(-3, 3, n)
        calls.append(RecordedCall("compact_forward", [x, torch.zeros(n), False], {}, "t.py"))
    return {"compact_forward": calls}


CPU_COMPACT = """#include <torch/extension.h>
int NondeterministicCompactCUDAKernelLauncher(const at::Tensor input, at::Tensor output) {
  int kept = 0;
  const int n = input.numel();
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "compact", [&] {
    auto* in = input.data_ptr<scalar_t>();
    auto* out = output.data_ptr<scalar_t>();
    for (int i = n - 1; i >= %s; --i)  // from the end: another order than the reference's
      if (in[i] > 0) out[kept++] = in[i];
  });
  return kept;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("NondeterministicCompactCUDAKernelLauncher", &NondeterministicCompactCUDAKernelLauncher);
}
"""


def _generated_with_impls(refrepo, tmp_path, kernel, recorded, good_src, bad_src):
    """(candidate, good.cpp, bad.cpp): the kernel's test generated from `recorded`, beside a
    right and a wrong CPU implementation to run it on."""
    cand = candidate(refrepo, kernel)
    write_label(refrepo, cand, tmp_path)
    generate_for(cand, refrepo[3], recorded, tmp_path)
    good, bad = tmp_path / "good.cpp", tmp_path / "bad.cpp"
    good.write_text(good_src)
    bad.write_text(bad_src)
    return cand, good, bad


def _run_generated(tmp_path, cand, impl: Path, **extra: str) -> tuple[int, dict]:
    report = tmp_path / f"{impl.stem}.json"
    env = {
        **os.environ,
        "KMINER_IMPL": str(impl),
        "KMINER_REFERENCE": str(tmp_path / cand.reference.path),
        "KMINER_BUILD_DIR": str(tmp_path / "build"),
        "KMINER_REPORT": str(report),
        **extra,
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*cmd, str(tmp_path / cand.tests.path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return proc.returncode, json.loads(report.read_text())


def test_nondeterministic_op_gets_an_order_free_test(refrepo, tmp_path):
    cand = candidate(refrepo, "compact_any_order_cuda_kernel")
    write_label(refrepo, cand, tmp_path)
    generate_for(cand, refrepo[3], compact_recorded(), tmp_path)
    r = cand.stage(StageName.TESTGEN)
    assert r.status == Status.OK, r.detail
    assert r.metrics["order_free"].startswith("slots taken from an atomic counter")
    text = (tmp_path / cand.tests.path).read_text()
    assert "ORDER_FREE = True" in text and "nondeterministic by nature" in text
    assert cand.reference.function == "compact_forward_cpu"


@pytest.mark.slow
def test_order_free_test_passes_any_order_and_fails_a_lost_value(refrepo, tmp_path):
    """Run on CPU: an implementation that keeps the values in reverse order passes; one that
    skips the first input (a lost value, and a count one short) fails."""
    cand, good, bad = _generated_with_impls(
        refrepo, tmp_path, "compact_any_order_cuda_kernel", compact_recorded(),
        CPU_COMPACT % "0", CPU_COMPACT % "1",
    )  # fmt: skip
    code, rep = _run_generated(tmp_path, cand, good)
    assert code == 0 and rep["outcome"] == "pass", rep
    code, rep = _run_generated(tmp_path, cand, bad)
    assert code != 0 and rep["outcome"] == "mismatch", rep


def _case(cid: str, made: bool, **fields) -> dict:
    """A case of the plan as the generated test holds it (testgen.cases.plan)."""
    return {"id": cid, "base": 0, "dtype": None, "edge": None, "tile": None, "made": made} | fields


def _generated_test_module(refrepo, tmp_path):
    """The compact kernel's generated test file, imported (its helpers, no test run)."""
    import importlib.util

    cand = candidate(refrepo, "compact_any_order_cuda_kernel")
    write_label(refrepo, cand, tmp_path)
    generate_for(cand, refrepo[3], compact_recorded(), tmp_path)
    spec = importlib.util.spec_from_file_location("generated", tmp_path / cand.tests.path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_indices_into_a_table_of_rows_in_any_order_are_compared_by_the_rows_they_name(
    refrepo, tmp_path
):
    """A sparse convolution's outputs: the distinct output cells (a table its threads fill in
    sorted order, its CPU twin in the order it finds them) and pairs (input row, output row)
    per kernel offset. The reference's output-row indices are renumbered to the label's order
    of the same cells; input-row indices, which agree as they are, are left alone; a label
    that pairs an input with another cell, or holds other cells, fails."""
    module = _generated_test_module(refrepo, tmp_path)
    assert module.ORDER_FREE
    cells_ref = torch.tensor([[0, 5, 5], [0, 1, 2], [1, 0, 0]], dtype=torch.int32)
    cells_gpu = torch.tensor([[0, 1, 2], [0, 5, 5], [1, 0, 0]], dtype=torch.int32)  # sorted
    # pairs[offset, 0 | 1, k]: input row k pairs with output row; -1 past each offset's count
    pairs_ref = torch.tensor([[[0, 1, 2, -1], [0, 1, 2, -1]], [[1, 0, -1, -1], [0, 2, -1, -1]]])
    pairs_gpu = torch.tensor([[[2, 0, 1, -1], [2, 1, 0, -1]], [[0, 1, -1, -1], [2, 1, -1, -1]]])
    counts = torch.tensor([3, 2])
    want = [cells_ref, pairs_ref.int(), counts]
    assert module._compare([cells_gpu, pairs_gpu.int(), counts], want, "float32")[0]
    wrong = pairs_gpu.clone()
    wrong[1, 1, 0] = 0  # input 0 paired with cell [0, 1, 2] instead of [0, 5, 5]
    assert not module._compare([cells_gpu, wrong.int(), counts], want, "float32")[0]
    other = cells_gpu.clone()
    other[2, 2] = 1  # a cell the reference does not hold
    assert not module._compare([other, pairs_gpu.int(), counts], want, "float32")[0]
    renumbered = module._renumbered([cells_gpu, pairs_gpu.int(), counts], want)
    assert torch.equal(renumbered[1][:, 0], pairs_ref[:, 0].int())  # input rows untouched
    assert renumbered[1].dtype == torch.int32


def test_order_free_holds_where_an_output_names_the_reversed_rows(refrepo, tmp_path):
    """The order-free check reruns the reference with the data's rows reversed. An output that
    names those rows (the faces a raster bin holds) is read with row i as row n-1-i: the same
    faces, so the property holds; a bin capped below what it finds keeps other faces."""
    module = _generated_test_module(refrepo, tmp_path)
    x = torch.tensor([[1.0], [-2.0], [3.0], [4.0], [-5.0]])

    def picks(slots):
        class Reference:  # the rows holding a positive value, by index, in `slots` slots
            @staticmethod
            def reference(x):
                found = (x[:, 0] > 0).nonzero().flatten()[:slots]
                out = torch.full((slots,), -1, dtype=torch.long)
                out[: len(found)] = found
                return out

        return Reference

    for slots, holds in ((4, True), (2, False)):
        want, _ = module._reference(picks(slots), [x])
        assert module._order_free_holds(picks(slots), [x], want, "float32") is holds, slots


def test_outputs_sorted_by_the_repository_compare_along_their_last_dim(refrepo, tmp_path):
    """SORTED_LAST (testgen/caller_sorts.py): each row's values in any order match, another
    multiset in a row does not, and without the flag order still counts."""
    module = _generated_test_module(refrepo, tmp_path)
    module.ORDER_FREE = False
    want = [torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.tensor([[0, 1, 2], [2, 0, 1]])]
    got = [torch.tensor([[3.0, 1.0, 2.0], [4.0, 6.0, 5.0]]), torch.tensor([[2, 0, 1], [0, 1, 2]])]
    module.SORTED_LAST = False
    assert not module._compare(got, want, "float32")[0]
    module.SORTED_LAST = True
    assert module._compare(got, want, "float32")[0]
    moved = [got[0], torch.tensor([[2, 0, 1], [0, 1, 1]])]  # a row's values, not only its order
    assert not module._compare(moved, want, "float32")[0]
    across = [torch.tensor([[1.0, 2.0, 4.0], [3.0, 5.0, 6.0]]), got[1]]  # between rows: no
    assert not module._compare(across, want, "float32")[0]
    # a float64 label against a reference that ran in float32: float32's tolerance
    module.SORTED_LAST = False
    w32 = torch.tensor([1.0, 2.0, 3.0])
    g64 = w32.double() * (1 + 3e-6)
    assert module._compare([g64], [w32], "float64")[0]
    assert not module._compare([g64], [w32.double()], "float64")[0]


def test_only_memory_a_label_never_wrote_is_told_from_nondeterminism(refrepo, tmp_path):
    """A wrong kernel that skips its output left, in a label-allocated tensor, whatever the
    allocator held: run again it differed, and the case was excused as nondeterministic. Run
    twice on memory filled with two different bytes, such a label differs only in elements
    that hold each run's byte throughout, and is judged by its mismatch instead."""
    module = _generated_test_module(refrepo, tmp_path)
    a_byte, b_byte = module.POISON

    def filled(byte, n, dtype):
        return torch.full((n * torch.empty(0, dtype=dtype).element_size(),), byte,
                          dtype=torch.uint8).view(dtype)  # fmt: skip

    written = torch.arange(4, dtype=torch.float32)
    a = torch.cat([written, filled(a_byte, 3, torch.float32)])
    b = torch.cat([written, filled(b_byte, 3, torch.float32)])
    assert module._only_unwritten_differs([a], [b])
    ints_a, ints_b = filled(a_byte, 2, torch.int64), filled(b_byte, 2, torch.int64)
    assert module._only_unwritten_differs([a, ints_a], [b, ints_b])
    assert module._only_unwritten_differs([torch.empty(0), a], [torch.empty(0), b])
    start_a, start_b = torch.tensor(3), torch.tensor(7)  # fps's one random start index (0-dim)
    assert not module._only_unwritten_differs([start_a, a], [start_b, b])
    raced = b.clone()
    raced[0] += 1.0  # a written element that differs: a race, not unwritten memory
    assert not module._only_unwritten_differs([a], [raced])
    once = b.clone()
    once[4] = 5.0  # written in one run only: not the same unwritten elements both times
    assert not module._only_unwritten_differs([a], [once])
    module.DEVICE = "cpu"  # off the GPU a plain rerun, compared with the first run
    steady = SimpleNamespace(**{module.FUNCTION: lambda x: x * 2})
    got = module._outputs([torch.ones(3)], torch.ones(3) * 2)
    assert module._label_unstable([torch.ones(3)], got, "float32", steady) is False
    noisy = SimpleNamespace(**{module.FUNCTION: lambda x: x * 2 + torch.rand(3)})
    assert module._label_unstable([torch.ones(3)], got, "float32", noisy) is True


def test_a_case_whose_reference_runs_too_long_is_left_out(refrepo, tmp_path):
    """A Python reference that loops over rows is fine on the recorded inputs and endless on
    their x37 tiling: that case is invalid (left out with its reason), not the whole test's
    timeout."""
    import time
    from types import SimpleNamespace

    module = _generated_test_module(refrepo, tmp_path)
    module.REFERENCE_CASE_S = 1
    endless = SimpleNamespace(reference=lambda *args: time.sleep(60))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="took over 1s"):
        module._reference(endless, [torch.ones(3), torch.zeros(3), False])
    assert time.monotonic() - started < 10
    quick = SimpleNamespace(reference=lambda x, out, flag: [out.copy_(x * 2), None][1])
    got, note = module._reference(quick, [torch.ones(3), torch.zeros(3), False])
    assert note == "" and any(torch.equal(g, torch.full((3,), 2.0)) for g in got)


def test_the_reference_is_never_cut_off_in_an_import(refrepo, tmp_path, monkeypatch):
    """torch's first backward imports sympy: an alarm raised between sympy's submodules left
    the package without `sympy.printing`, and every later backward of the run failed with an
    AttributeError (DCNv3's backward kernels on the H200). The alarm waits for the import."""
    import importlib
    import sys
    import time
    from types import SimpleNamespace

    slow_package(tmp_path, "slowpkg_kminer", 1.6)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = _generated_test_module(refrepo, tmp_path)
    module.REFERENCE_CASE_S = 1

    def reference(x, out, flag):
        out.copy_(x * importlib.import_module("slowpkg_kminer").second.VALUE)

    started = time.monotonic()
    got, note = module._reference(
        SimpleNamespace(reference=reference), [torch.ones(3), torch.zeros(3), False]
    )
    assert note == ""  # run as it came, not retried in another dtype
    assert time.monotonic() - started >= 1.5  # the alarm rang during the import, and waited
    assert any(torch.equal(g, torch.full((3,), 7.0)) for g in got)
    assert sys.modules["slowpkg_kminer"].second.VALUE == 7


def test_a_test_writes_what_it_judged_as_it_goes(refrepo, tmp_path, monkeypatch):
    """A test cut off at its time limit (DCNv3's forward on the H100, in the reference at
    180 s) left no report, so nothing said which cases it had judged, or whether they
    differed: each case's result is in the report as soon as it is judged (`cases_so_far`);
    a run that ends has its `cases`."""
    import json
    from types import SimpleNamespace

    module = _generated_test_module(refrepo, tmp_path)
    report = tmp_path / "report.json"
    monkeypatch.setenv("KMINER_REPORT", str(report))
    module.DEVICE, module.PHASE, module.ISOLATE = "cpu", "run", False
    module.CASES = [_case("c0", False), _case("c1", False)]
    module._base_calls = lambda: [[torch.ones(3), torch.zeros(3), False]]
    seen = []

    def reference(x, out, flag):
        seen.append(json.loads(report.read_text()) if report.exists() else {})
        out.copy_(x * 2)

    label = SimpleNamespace(**{module.FUNCTION: lambda x, out, flag: [out.copy_(x * 2), None][1]})
    module._load = lambda kind, path: (
        label if kind == "label" else SimpleNamespace(reference=reference)
    )
    test = next(getattr(module, n) for n in dir(module) if n.startswith("test_"))
    test()
    assert "cases_so_far" not in seen[0]  # the first case: nothing judged yet
    assert [c["id"] for c in seen[-1]["cases_so_far"]] == ["c0"]  # the second: the first's
    assert seen[-1]["cases_so_far"][0]["ok"] is True
    final = json.loads(report.read_text())
    assert "cases_so_far" not in final and [c["id"] for c in final["cases"]] == ["c0", "c1"]


def test_the_reference_has_a_time_for_the_whole_run(refrepo, tmp_path):
    """Cases each under the per-case limit still add up past the run's time limit (a CPU
    reference comparing every pair of 64000 points): once the run's reference time is spent,
    the cases left are left out with SLOW_NOTE, which the runner passes to the variants' runs
    (a variant must not be judged on a case the label never was)."""
    import time
    from types import SimpleNamespace

    from testgen.standalone.runner import outside_cases

    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    module.REFERENCE_RUN_S = 2
    slow = SimpleNamespace(reference=lambda x, out, flag: [time.sleep(0.2), out.copy_(x)][0])
    label = SimpleNamespace(**{module.FUNCTION: lambda x, out, flag: [out.copy_(x), None][1]})
    base = [[torch.ones(3), torch.zeros(3), False]]
    results = [module._run_case(_case(f"c{i}", False), base, label, slow) for i in range(12)]
    assert results[0]["ok"] is True
    last = results[-1]
    assert last["ok"] is None and last["note"].startswith("invalid: left out for time")
    assert "went to the cases before" in results[-1]["note"]
    assert module._REFERENCE_SPENT[0] < 3  # a case left out costs no reference time
    assert set(outside_cases(results)) == {r["id"] for r in results if r["ok"] is None}


def test_a_half_case_whose_result_overflows_float16_is_left_out(refrepo, tmp_path):
    """Large edge values in float16: the reference (run in float32) gives 1e5 where a half
    kernel can only give inf; that case says nothing about the kernel."""
    from types import SimpleNamespace

    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    case = _case("c", made=True)
    x = torch.full((4,), 400.0, dtype=torch.float16)
    base = [[x, torch.zeros(4, dtype=torch.float16), False]]
    label = SimpleNamespace(**{module.FUNCTION: lambda x, out, flag: [out.copy_(x * x), 4][1]})
    squares = SimpleNamespace(reference=lambda x, out, flag: [out.copy_(x * x), 4][1])
    result = module._run_case(case, base, label, squares)
    assert result["ok"] is None and "overflows float16" in result["note"]
    base[0][0] = torch.full((4,), 100.0, dtype=torch.float16)  # 1e4 fits: compared
    assert module._run_case(case, base, label, squares)["ok"] is True


def test_an_enlarged_case_whose_reference_overflows_is_left_out(refrepo, tmp_path):
    """exp() of edge values x 1e4 is inf on the CPU and 1e271 on the GPU: noise, not a kernel
    error. The same overflow in a recorded case is compared (inf must match inf)."""
    from types import SimpleNamespace

    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    big = torch.full((4,), 800.0, dtype=torch.float64)
    base = [[big, torch.zeros(4, dtype=torch.float64), False]]
    exp = SimpleNamespace(reference=lambda x, out, flag: [out.copy_(x.exp()), None][1])
    finite = SimpleNamespace(**{module.FUNCTION: lambda x, out, flag: [out.fill_(1e300), 0][1]})
    case = _case("edge_large", made=True, edge="large")
    left_out = module._run_case(case, base, finite, exp)
    assert left_out["ok"] is None and "overflows on enlarged values" in left_out["note"]
    recorded = {**case, "id": "recorded_0", "edge": None, "made": False}
    recorded = module._run_case(recorded, base, finite, exp)
    assert recorded["ok"] is False


def test_a_case_a_python_reference_asserts_against_is_left_out(refrepo, tmp_path):
    """`assert bias.shape[0] == x.shape[1]` in the repository's PyTorch reference: a derived
    case it refuses is invalid with the reason, not a failed test; the others are compared."""
    from types import SimpleNamespace

    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    case = _case("c", made=True)
    base = [[torch.ones(4), torch.zeros(4), False], [torch.ones(5), torch.zeros(5), False]]

    def picky(x, out, flag):
        assert x.numel() == 4, "four values only"
        out.copy_(x * 2)

    label = SimpleNamespace(**{module.FUNCTION: lambda x, out, flag: [out.copy_(x * 2), None][1]})
    assert module._run_case(case, base, label, SimpleNamespace(reference=picky))["ok"] is True
    refused = module._run_case({**case, "base": 1}, base, label, SimpleNamespace(reference=picky))
    assert refused["ok"] is None and "AssertionError: four values only" in refused["note"]


def test_a_recorded_dtype_the_labels_dispatch_leaves_out_is_not_a_crash(refrepo, tmp_path):
    """pytorch_spline_conv's tests call its ops in bfloat16; its CUDA dispatch
    (AT_DISPATCH_FLOATING_TYPES) takes none, and neither does its CPU reference. The reference
    runs upcast, the label refuses the dtype: that recorded case is invalid with the reason,
    not the test's crash; any other error of the label still fails the test."""
    from types import SimpleNamespace

    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    case = _case("recorded_0", made=False)
    base = [[torch.ones(4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16), False]]

    def dispatch(x, out, flag):
        if x.dtype == torch.bfloat16:
            raise NotImplementedError("\"basis_fw\" not implemented for 'BFloat16'")
        out.copy_(x * 2)

    label = SimpleNamespace(**{module.FUNCTION: dispatch})
    left_out = module._run_case(case, base, label, SimpleNamespace(reference=dispatch))
    assert left_out["ok"] is None and "not implemented for 'BFloat16'" in left_out["note"]

    def broken(x, out, flag):
        raise RuntimeError("shape mismatch in the kernel's host code")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        module._run_case(
            case,
            base,
            SimpleNamespace(**{module.FUNCTION: broken}),
            SimpleNamespace(reference=dispatch),
        )


def test_a_label_revised_without_its_kernel_is_upstream_failed_not_a_crash(refrepo, tmp_path):
    cand = candidate(refrepo, "compact_any_order_cuda_kernel")
    write_label(refrepo, cand, tmp_path)
    (tmp_path / cand.wrapper.label_path).write_text("// curator: comment only\n")
    generate_for(cand, refrepo[3], compact_recorded(), tmp_path)
    r = cand.stage(StageName.TESTGEN)
    assert (r.status, r.reason) == (Status.SKIPPED, Reason.UPSTREAM_FAILED)
    assert "compact_any_order_cuda_kernel" in r.detail


def rendered_module(refrepo, tmp_path):
    """The generated test file of the affine kernel, imported as a module: its helpers are
    called directly on hand-made outputs."""
    import types

    cand = candidate(refrepo, "affine_forward_cuda_kernel")
    write_label(refrepo, cand, tmp_path)
    generate_for(cand, refrepo[3], affine_recorded(), tmp_path)
    module = types.ModuleType("rendered")
    module.__file__ = str(tmp_path / cand.tests.path)
    exec(compile((tmp_path / cand.tests.path).read_text(), "rendered", "exec"), module.__dict__)
    return module


def test_a_case_decided_by_tied_values_is_not_blamed_on_the_kernel(refrepo, tmp_path):
    """mmcv's NMS keeps one of two boxes of the same score: the CPU sort and the GPU sort order
    them differently. The rendered test breaks the ties both ways; a result that is the
    reference's under one of them is not the kernel's fault, and any other result still is."""
    import types

    import torch

    module = rendered_module(refrepo, tmp_path)

    def keep_best(scores, boxes):  # an NMS in one line: the first best-scored box's index
        return torch.tensor([int(torch.argmax(scores))]), boxes[int(torch.argmax(scores))]

    reference = types.SimpleNamespace(reference=keep_best)
    scores, boxes = torch.tensor([0.9, 0.9, 0.4, 0.3]), torch.arange(8.0).reshape(4, 2)
    other_tie = [scores, boxes, torch.tensor([1]), boxes[1]]  # (the inputs are outputs too)
    why = module._tie_broken([scores, boxes], other_tie, "float32", reference)
    assert why.startswith("ties: equal values of argument 0")
    wrong = [scores, boxes, torch.tensor([2]), boxes[2]]
    assert module._tie_broken([scores, boxes], wrong, "float32", reference) == ""
    distinct = torch.tensor([0.9, 0.8, 0.4, 0.3])  # no tie: no excuse
    assert module._tie_broken([distinct, boxes], other_tie, "float32", reference) == ""
    nudged = module._nudged(scores, 1e-4, later_first=True)
    assert nudged.unique().numel() == 4 and nudged[1] > nudged[0]
    assert nudged[2:].equal(scores[2:])  # values without an equal are left as they are
    assert torch.allclose(nudged, scores, rtol=1e-5, atol=0)  # far below the tolerance


def test_a_half_case_does_not_judge_indices_picked_among_near_ties(refrepo, tmp_path):
    """mmcv's chamfer distance in float16: the distances match, the argmin index differs where
    two distances are equal at float16 resolution. Only a float16 case with every floating
    output right is left out; any floating difference, or float32, still fails."""
    import torch

    module = rendered_module(refrepo, tmp_path)
    dist = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)
    want = [dist.float(), torch.tensor([0, 4, 2])]
    got = [dist, torch.tensor([0, 5, 2])]
    assert module._half_picks(got, want, "float16").startswith("float16 picks")
    assert module._half_picks(got, want, "float32") == ""
    far = [dist + 0.5, torch.tensor([0, 5, 2])]
    assert module._half_picks(far, want, "float16") == ""
    assert module._half_picks([dist.float()], [dist.float()], "float16") == ""  # no integers


def test_a_python_reference_returning_other_outputs_is_compared_where_shapes_meet(
    refrepo, tmp_path
):
    """mamba: `selective_scan_ref` returns the gated output and the last state; the binding
    returns `out`, the scan states and the gated `out_z`. The gated output is compared with the
    binding's nearest output of its shape; the last state, of no shape the binding returns, is
    left out; a label whose every such output is wrong still fails."""
    module = _generated_test_module(refrepo, tmp_path)
    module.PYTHON_REFERENCE = True
    u = torch.rand(2, 3)
    out, gated, states = torch.rand(2, 3), torch.rand(2, 3), torch.rand(2, 1, 6)
    last = torch.rand(2, 4)
    seen, expected = module._matched([u, out, states, gated], [u, gated.clone(), last], 1)
    assert len(seen) == len(expected) == 2 and seen[1] is gated
    assert module._compare(seen, expected, "float32")[0]
    wrong = module._matched([u, out, states, out * 2], [u, gated.clone(), last], 1)
    assert not module._compare(*wrong, "float32")[0]
    unmatched = module._matched([u, states], [u, last], 1)
    assert unmatched == ([u, states], [u, last])  # same lengths: compared as they are
    nothing = module._matched([u, states, states], [u, last], 1)
    assert not module._compare(*nothing, "float32")[0]  # no shape in common: the case fails
    module.PYTHON_REFERENCE = False  # a C++ twin returns what the label returns
    assert module._matched([u, out, gated], [u, gated], 1) == ([u, out, gated], [u, gated])


def test_boolean_outputs_are_compared_exactly(refrepo, tmp_path):
    """A mask (pytorch_sparse's non_diag_mask) is compared element for element like integers;
    arithmetic on it (`abs` of a bool) crashed the test before any case ran."""
    module = _generated_test_module(refrepo, tmp_path)
    mask = torch.tensor([True, False, True])
    ok, max_abs, _ = module._compare([mask.clone()], [mask], "float32")
    assert ok and max_abs == 0.0
    ok, max_abs, _ = module._compare([~mask], [mask], "float32")
    assert not ok and max_abs == 1.0


def test_a_flipped_flag_is_judged_only_where_the_reference_depends_on_it(refrepo, tmp_path):
    """A case made by flipping a boolean: compared where the reference's result changes with
    it; where it does not (the CPU code may ignore the mode), or where the label refuses the
    mode, invalid with the reason, never a failure of the kernel."""
    from types import SimpleNamespace

    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    case = _case("flag2_flipped_of_0", made=True)
    case["flag"], case["was"] = 2, True
    base = [[torch.ones(4), torch.zeros(4), False]]  # recorded with True: the flipped call

    def modal(x, out, train):
        out.copy_(x * (2 if train else 3))

    def blind(x, out, train):
        out.copy_(x * 2)

    label = SimpleNamespace(**{module.FUNCTION: modal})
    assert module._run_case(case, base, label, SimpleNamespace(reference=modal))["ok"] is True
    wrong = SimpleNamespace(**{module.FUNCTION: blind})
    assert module._run_case(case, base, wrong, SimpleNamespace(reference=modal))["ok"] is False
    ignored = module._run_case(case, base, label, SimpleNamespace(reference=blind))
    assert ignored["ok"] is None and "same result with the flag either way" in ignored["note"]

    def refuses(x, out, train):
        raise RuntimeError("train must be false")

    refused = module._run_case(case, base, SimpleNamespace(**{module.FUNCTION: refuses}),
                               SimpleNamespace(reference=modal))  # fmt: skip
    assert refused["ok"] is None and "train must be false" in refused["note"]


def test_a_flipped_mode_compares_only_what_the_label_writes_in_it(refrepo, tmp_path):
    """SparseConvNet's batch norm in inference mode: the CUDA pass leaves the saved statistics
    as passed, the CPU twin rewrites them. The flipped case compares the output it writes; a
    label that writes nothing at all is still judged (and fails)."""
    from types import SimpleNamespace

    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    case = _case("flag2_flipped_of_0", made=True)
    case["flag"], case["was"] = 2, True
    base = [[torch.ones(4), torch.zeros(4), False]]

    def cpu(x, out, train):
        out.copy_(x * (2 if train else 3))
        x.fill_(7.0)  # rewrites a statistic in every mode

    def gpu(x, out, train):
        out.copy_(x * (2 if train else 3))
        if train:
            x.fill_(7.0)

    ref = SimpleNamespace(reference=cpu)
    assert module._run_case(case, base, SimpleNamespace(**{module.FUNCTION: gpu}), ref)["ok"]
    idle = SimpleNamespace(**{module.FUNCTION: lambda x, out, train: None})
    assert module._run_case(case, base, idle, ref)["ok"] is False
    recorded = {**case, "flag": None}  # a recorded case compares every output
    assert (
        module._run_case(recorded, base, SimpleNamespace(**{module.FUNCTION: gpu}), ref)["ok"]
        is False
    )

    def cpu_noisy(x, out, train):  # rewrites the statistic with leftovers: another each run
        out.copy_(x * (2 if train else 3))
        x.copy_(torch.rand(x.shape))

    def wrong(x, out, train):
        out.copy_(x * 5)

    noisy = SimpleNamespace(reference=cpu_noisy)
    module.ORDER_FREE = ""  # (the fixture's kernel is order-free; this case's op is not)
    judged = module._run_case(case, base, SimpleNamespace(**{module.FUNCTION: wrong}), noisy)
    assert judged["ok"] is False, judged["note"]  # not excused by a statistic the case leaves out
    assert module._run_case(case, base, SimpleNamespace(**{module.FUNCTION: gpu}), noisy)["ok"]


def test_a_reference_that_refuses_every_case_is_no_mismatch(refrepo, tmp_path):
    """pytorch3d's interp_face_attrs: the reference refused every recorded call, and the test
    reported `mismatch`, a verdict on a kernel no case had judged. It is `no_cases`."""
    cand, good, _ = _generated_with_impls(
        refrepo, tmp_path, "affine_forward_cuda_kernel", affine_recorded(), CPU_AFFINE % "", ""
    )
    text = (tmp_path / cand.reference.path).read_text()
    name = cand.reference.exposed or cand.reference.function
    at = text.index("{", text.index(name + "("))
    refusing = tmp_path / "refusing.cpp"
    # an index past a dimension (c10::IndexError: Python's IndexError) is a refusal too
    refusing.write_text(text[: at + 1] + ' TORCH_CHECK_INDEX(false, "refused");' + text[at + 1 :])
    code, rep = _run_generated(tmp_path, cand, good, KMINER_REFERENCE=str(refusing))
    assert code != 0 and rep["outcome"] == "no_cases", rep
    assert rep["cases"] and all(c["ok"] is None for c in rep["cases"])
    # the label's own host code refusing an input kminer made (rows past the recorded 1000),
    # before any kernel ran: that case is left out; refusing a recorded call fails the test
    for limit, passes in ((1001, True), (999, False)):
        picky = tmp_path / f"picky{limit}.cpp"
        check = f'  TORCH_CHECK(n < {limit}, "too many");\n  AT_DISPATCH'
        picky.write_text((CPU_AFFINE % "").replace("  AT_DISPATCH", check, 1))
        code, rep = _run_generated(tmp_path, cand, picky)
        refused = [c for c in rep["cases"] if "too many" in c["note"]]
        if passes:
            assert code == 0 and rep["outcome"] == "pass" and refused, rep
            assert all(c["ok"] is None and not c["id"].startswith("recorded_") for c in refused)
        else:
            assert code != 0 and rep["outcome"] != "pass", rep


def test_a_variants_run_reads_the_reference_outputs_the_labels_run_left(refrepo, tmp_path):
    """KMINER_REF_CACHE: the label's run writes each case's reference outputs; a wrong
    variant's run of the same test reads them instead of computing the reference again (a
    CPU rotated NMS over 8003 boxes took 8 s, nine runs of it outlasted a device call). Read,
    not recomputed: a tampered entry changes the case's verdict (the runner lets only the
    label's run write there). A folder it cannot write to is no error."""
    import torch

    cand, good, bad = _generated_with_impls(
        refrepo, tmp_path, "affine_forward_cuda_kernel", affine_recorded(),
        CPU_AFFINE % "", CPU_AFFINE % " + (k == n - 1 ? 1e-3 : 0)",
    )  # fmt: skip
    cache = tmp_path / "refcache"
    cache.mkdir()
    code, rep = _run_generated(tmp_path, cand, good, KMINER_REF_CACHE=str(cache))
    assert code == 0 and rep["outcome"] == "pass", rep
    entries = sorted(cache.glob("*.pt"))
    assert len(entries) == len([c for c in rep["cases"] if c["ok"] is not None])
    stamps = [e.stat().st_mtime_ns for e in entries]
    code, rep = _run_generated(tmp_path, cand, bad, KMINER_REF_CACHE=str(cache))
    assert code != 0 and rep["outcome"] == "mismatch"
    assert [e.stat().st_mtime_ns for e in sorted(cache.glob("*.pt"))] == stamps  # read, not redone
    assert len([c for c in rep["cases"] if c["ok"] is False]) > 1
    env = {"KMINER_REF_CACHE": str(cache), "KMINER_STOP_EARLY": "1"}  # as the runner's variants
    code, early = _run_generated(tmp_path, cand, bad, **env)
    assert code != 0 and early["outcome"] == "mismatch"
    assert [c["ok"] for c in early["cases"]][-1] is False
    assert len(early["cases"]) < len(rep["cases"]) and early["cases"][-1] == next(
        c for c in rep["cases"] if c["ok"] is False
    )  # the same first miss, and nothing after it
    # a cache that cannot be written (a path through a file, refused even to root) is no error
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    code, rep = _run_generated(tmp_path, cand, good, KMINER_REF_CACHE=str(blocked / "cache"))
    assert code == 0 and rep["outcome"] == "pass", rep
    (want, note), rng = torch.load(entries[0], weights_only=True)
    torch.save((([w * 0 + 7 if isinstance(w, torch.Tensor) else w for w in want], note), rng),
               entries[0])  # fmt: skip
    code, rep = _run_generated(tmp_path, cand, good, KMINER_REF_CACHE=str(cache))
    # the tampered case differs, and the reference computed again disagrees with what was
    # read: it is left out as unrepeatable, never passed on the tampered values
    left_out = [c for c in rep["cases"] if c["ok"] is None and "reference gives" in c["note"]]
    assert len(left_out) == 1, rep


def test_a_label_unstable_where_the_repositorys_kernel_was_judged_fails(refrepo, tmp_path):
    """A kernel that reads memory it never wrote (NMS's host loop over an unwritten mask) gives
    another result each run: excused as nondeterministic, unless the repository's kernel was
    judged on that case (it passed there, KMINER_JUDGED; embedded in a published row's test),
    where it fails. The verified run's passing cases are what gets embedded."""
    from curation.rows import with_calibration

    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    draws = iter(range(1, 100))
    label = SimpleNamespace(**{module.FUNCTION: lambda x: x * 2 + next(draws)})  # never repeats
    reference = SimpleNamespace(reference=lambda x: x * 2)
    base = [[torch.arange(1.0, 7.0)]]
    case = _case("recorded_0", made=False)
    out = module._run_case(case, base, label, reference)
    assert out["ok"] is None and out["note"].startswith("invalid: nondeterministic")
    module.JUDGED.add("recorded_0")
    try:
        assert module._run_case(case, base, label, reference)["ok"] is False
    finally:
        module.JUDGED.discard("recorded_0")
    text = next((tmp_path / "tests").glob("*.py")).read_text()
    passed = [{"id": "recorded_0", "ok": True, "note": ""}, {"id": "rows_3", "ok": None}]
    published = with_calibration(text, passed)
    scope: dict = {}
    exec(next(ln for ln in published.splitlines() if ln.startswith("JUDGED = ")), scope)
    assert scope["JUDGED"] == {"recorded_0"}
    assert "\nJUDGED = set()\n" in text


def test_a_made_case_the_label_disagrees_on_is_outside_the_contract(refrepo, tmp_path):
    """Calibration (KMINER_CALIBRATE, the label's run): where the repository's own kernel and
    its reference disagree on an input kminer made, the input is outside the op's contract,
    and the case is left out with that note; on a recorded input the test still fails. The
    variants' runs (KMINER_OUTSIDE) and the published row's test (embedded) leave it out."""
    from curation.rows import with_calibration
    from testgen.standalone.runner import outside_cases

    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    label = SimpleNamespace(**{module.FUNCTION: lambda x: x * 2})
    reference = SimpleNamespace(reference=lambda x: x * 3)  # they disagree on every input
    base = [[torch.arange(1.0, 7.0)]]
    made = _case("channels_x3", made=True)
    recorded = _case("recorded_0", made=False)
    module.CALIBRATE = False
    assert module._run_case(made, base, label, reference)["ok"] is False
    module.CALIBRATE = True
    out = module._run_case(made, base, label, reference)
    assert out["ok"] is None and out["note"].startswith("invalid: outside the op's contract")
    assert module._run_case(recorded, base, label, reference)["ok"] is False
    agreeing = SimpleNamespace(reference=lambda x: x * 2)
    assert module._run_case(made, base, label, agreeing)["ok"] is True  # nothing to excuse

    found = outside_cases([out, {"id": "recorded_0", "note": "", "ok": False}])
    assert list(found) == ["channels_x3"]
    module.CALIBRATE = False
    module.OUTSIDE.update(found)  # a variant's run: the label's finding, whatever it computes
    again = module._run_case(made, base, label, reference)
    assert again["ok"] is None and again["note"] == out["note"]
    text = next((tmp_path / "tests").glob("*.py")).read_text()
    published = with_calibration(text, [out])
    assert "\nOUTSIDE = {}\n" in text and "\nOUTSIDE = {}\n" not in published
    assert with_calibration(text, [{"id": "recorded_0", "note": "", "ok": False}]) == text
    scope: dict = {}
    exec(next(ln for ln in published.splitlines() if ln.startswith("OUTSIDE = {")), scope)
    assert scope["OUTSIDE"] == found


def test_made_cases_that_end_the_process_are_found_in_one_test_run(refrepo, tmp_path):
    """KMINER_ISOLATE: the label's host code ends the process on some inputs kminer made (an
    `assert(false)` where no tile divides the planes). A child process runs the made cases in
    turn, noting each before and after; the one it noted last when it died is named, with how,
    and the next child goes on after it. A case that only raises is none of them."""
    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    # the child's side, in this process: each wanted case noted before and after it runs
    label = SimpleNamespace(**{module.FUNCTION: lambda x: x * 2})
    reference = SimpleNamespace(reference=lambda x: x * 2)
    module.CASES = [_case(f"made_{i}", made=True) for i in range(3)]
    progress = tmp_path / "progress.txt"
    module._child_cases(["made_0", "made_2"], progress, lambda: (label, reference))
    assert progress.read_text().split() == [
        "start:made_0", "ref", "refdone", "done:made_0",
        "start:made_2", "ref", "refdone", "done:made_2",
    ]  # fmt: skip

    def children(*steps):
        """A spawn whose child, for each id `i`, notes `start:{i}`, runs `steps` (lines of
        Python that may note more or end the child), then notes `done:{i}`."""
        body = "".join(f"    {step}\n" for step in steps)
        script = (
            "import json, os, sys\n"
            "out = open(sys.argv[2], 'a')\n"
            "note = lambda w: (out.write(w + '\\n'), out.flush())\n"
            "for i in json.loads(sys.argv[1]):\n"
            f"    note(f'start:{{i}}')\n{body}    note(f'done:{{i}}')\n"
        )

        def spawn(ids, progress):
            argv = [sys.executable, "-c", script, json.dumps(ids), str(progress)]
            return subprocess.Popen(argv, stderr=subprocess.DEVNULL)

        return spawn

    # the parent's side: children that die on made_1 and made_3 (one by SIGABRT, one by exit)
    spawn = children("if i == 'made_1': os.abort()", "if i == 'made_3': os._exit(3)")

    why = "outside the op's contract: the repository's code ended the process on this input "
    ended = module._ending_cases([f"made_{i}" for i in range(5)], spawn)
    assert ended == {
        "made_1": why + "kminer made (run killed by SIGABRT)",
        "made_3": why + "kminer made (run exited with 3)",
    }
    assert module._ending_cases(["made_0", "made_2"], spawn) == {}

    # a CUDA fault loses the child's context: it ends the child there, named as what it was
    # (pyg-lib's spline backward faulted on every drafted call; caught, every later case of
    # the child failed too and none was named)
    def faulting(case, *_):  # the case's run, as a kernel's illegal address ends it
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    progress = tmp_path / "faulted.txt"
    module._run_case = faulting
    pid = os.fork()
    if pid == 0:  # the child, as _spawn_child's would be
        try:
            module._child_cases(["made_0", "made_1"], progress, lambda: (label, reference))
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == module.CUDA_FAULT_EXIT
    assert progress.read_text().split() == ["start:made_0"]

    def spawn_faulting(ids, progress):
        script = (
            "import json, sys\n"
            "ids = json.loads(sys.argv[1])\n"
            "open(sys.argv[2], 'a').write(f'start:{ids[0]}\\n')\n"
            f"sys.exit({module.CUDA_FAULT_EXIT} if ids[0] == 'made_1' else 0)\n"
        )
        argv = [sys.executable, "-c", script, json.dumps(ids), str(progress)]
        return subprocess.Popen(argv, stderr=subprocess.DEVNULL)

    ended = module._ending_cases(["made_1", "made_2"], spawn_faulting)
    assert ended == {"made_1": why + "kminer made (a CUDA fault)"}

    # the reference itself ends the process (pyg-lib's CPU scatter faulted on a recorded call
    # its op's dispatcher would have broadcast first): that case is left out, recorded or
    # made; a recorded case the label ends is not (it stays the test's crash)
    spawn_in = children(
        "note('ref')",
        "if i == 'recorded_1': os.kill(os.getpid(), 11)",
        "note('refdone')",
        "if i == 'recorded_2': os.abort()",
    )
    ids = ["recorded_0", "recorded_1", "recorded_2", "made_0"]
    ended = module._ending_cases(ids, spawn_in, made=["made_0"])
    assert ended == {
        "recorded_1": "outside the op's contract: the repository's reference ended the process "
        "on this input (run killed by SIGSEGV)"
    }


def test_an_ill_conditioned_element_is_held_to_how_far_the_reference_itself_moves(
    refrepo, tmp_path
):
    """pytorch3d's face normals: a near-degenerate triangle's normal moves past the tolerance
    when the vertices move by an ulp, so a kernel that rounds otherwise (a fused multiply-add)
    differs there. Such elements are allowed the reference's own move under a few-ulp
    perturbation of its inputs; a wrong value where the result is well conditioned still fails,
    and so does an integer output the perturbation never moves."""
    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    case = _case("recorded_0", made=False)
    x = torch.tensor([1.0, 1.0 + 2**-23, 1.0 + 2**-22, 1.0 - 2**-24])
    base = [[x]]

    def amplified(v, wide):  # cancels the leading digits: only the last bits of v are left
        big = (v.double() if wide else v) * 3e7
        return [(big - 3e7).float(), v * 2, torch.argmin((v - 1.0).abs()[:2]).reshape(1)]

    reference = SimpleNamespace(reference=lambda v: amplified(v, False))
    label = SimpleNamespace(**{module.FUNCTION: lambda v: amplified(v, True)})
    plain = module._compare(
        module._outputs([x.clone()], label.__dict__[module.FUNCTION](x.clone())),
        module._outputs([x.clone()], reference.reference(x.clone())),
        "float32",
    )
    assert not plain[0]  # the rounding alone fails the plain comparison
    result = module._run_case(case, base, label, reference)
    assert result["ok"] is True and result["note"].startswith("ill-conditioned"), result

    def wrong(v):  # off where the result is well conditioned
        out = amplified(v, True)
        return [out[0], v * 2 + 1e-2, out[2]]

    bad = SimpleNamespace(**{module.FUNCTION: wrong})
    assert module._run_case(case, base, bad, reference)["ok"] is False

    def far_index(v):  # an index no few-ulp move of the inputs makes the reference pick
        out = amplified(v, True)
        return [out[0], out[1], torch.tensor([3])]

    far = SimpleNamespace(**{module.FUNCTION: far_index})
    steady = SimpleNamespace(reference=lambda v: [*amplified(v, False)[:2], torch.tensor([0])])
    assert module._run_case(case, base, far, steady)["ok"] is False


def test_a_fault_on_a_made_case_is_named_for_the_runner_to_leave_it_out(refrepo, tmp_path):
    """A CUDA fault ends the process (the context is lost): in the label's calibrating run,
    one on an input kminer made is named in the report (`outside_crash`) and still raised;
    on a recorded input, or outside calibration, nothing is named."""
    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"

    def faulting(v):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    label = SimpleNamespace(**{module.FUNCTION: faulting})
    reference = SimpleNamespace(reference=lambda v: v * 2)
    base = [[torch.ones(4)]]
    made = _case("rows2_of_0", made=True)
    for calibrate, case, named in ((True, made, True), (True, {**made, "made": False}, False),
                                   (False, made, False)):  # fmt: skip
        module.CALIBRATE = calibrate
        module.REPORT.pop("outside_crash", None)
        with pytest.raises(RuntimeError, match="illegal memory access"):
            module._run_case(case, base, label, reference)
        found = module.REPORT.get("outside_crash") or {}
        assert (list(found) == ["rows2_of_0"]) is named, (calibrate, case["made"])
        if named:
            assert found["rows2_of_0"].startswith("outside the op's contract: the repository's")


def test_a_fault_when_a_differing_made_case_runs_again_is_named_too(refrepo, tmp_path):
    """A case that differs is run again to see whether the label repeats itself; pytorch3d's
    PaddedToPacked read memory it never wrote on an input kminer made and faulted only in that
    rerun, which crashed the whole test. The rerun's fault is named like the first run's."""
    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    runs = []

    def faults_again(v):
        runs.append(1)
        if len(runs) > 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return v * 3  # differs from the reference

    label = SimpleNamespace(**{module.FUNCTION: faults_again})
    reference = SimpleNamespace(reference=lambda v: v * 2)
    module.CALIBRATE = True
    module.REPORT.pop("outside_crash", None)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        module._run_case(_case("binding_0_of_0", made=True), [[torch.ones(4)]], label, reference)
    assert list(module.REPORT.get("outside_crash") or {}) == ["binding_0_of_0"] and len(runs) == 2


def test_a_recorded_case_only_fused_rounding_moves_is_left_out_of_later_runs(refrepo, tmp_path):
    """pytorch3d's face normals: on a triangle with two corners at one vertex the CPU computes
    `ay * az - az * ay` as exactly 0, the GPU's fused multiply-add leaves its rounding error,
    and the clamp `max(norm, 1e-6)` magnifies it to 1e-2: a mismatch of the repository's own
    kernel on its own calls. In the label's run, when the label built without fused
    multiply-adds gives the reference's result there, the case is left out (as the runner
    leaves out cases outside the contract); when it differs too, or in a variant's run, the
    case stands as judged."""
    from testgen.standalone.runner import outside_cases

    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    x = torch.rand(8) + 0.5
    reference = SimpleNamespace(reference=lambda v: v * 2)

    def fused(v):  # off by 1e-2 where the cancellation was
        return v * 2 + (v == v.max()).to(v.dtype) * 0.01

    label = SimpleNamespace(**{module.FUNCTION: fused})
    unfused = SimpleNamespace(**{module.FUNCTION: lambda v: v * 2})
    case = _case("recorded_0", made=False)
    module.CALIBRATE = True
    module._UNFUSED[:] = [unfused]
    left = module._run_case(case, [[x]], label, reference)
    assert left["ok"] is None and left["note"].startswith("invalid: rounding:"), left
    assert list(outside_cases([left])) == ["recorded_0"]
    module._UNFUSED[:] = [label]  # built without them it differs as much: the kernel's own
    assert module._run_case(case, [[x]], label, reference)["ok"] is False
    module._UNFUSED[:] = [unfused]
    module.CALIBRATE = False  # a wrong variant's run asks nothing of it
    assert module._run_case(case, [[x]], label, reference)["ok"] is False


def test_a_float64_case_that_agrees_to_float32_precision_is_left_out_of_later_runs(
    refrepo, tmp_path
):
    """InternImage's DCNv3 reference builds its sampling grid in float32 for float64 inputs: on
    the H100 the repository's kernel differed from it by 7e-5 relative on all 8 of its own
    float64 calls, and the test called that a mismatch. In the label's run such a case is left
    out (as fused rounding is); one that differs by more than float32's tolerance, or any case
    in a variant's run, stands as judged."""
    from testgen.standalone.runner import outside_cases

    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    module._UNFUSED[:] = [None]  # (no unfused build to ask)
    x = torch.rand(8, dtype=torch.float64) + 0.5
    reference = SimpleNamespace(reference=lambda v: v * 2)
    single = SimpleNamespace(**{module.FUNCTION: lambda v: (v.float() * 2).double() * (1 + 3e-6)})
    case = _case("recorded_0", made=False)
    module.CALIBRATE = True
    left = module._run_case(case, [[x]], single, reference)
    assert left["ok"] is None and left["note"].startswith("invalid: rounding: in float64"), left
    assert list(outside_cases([left])) == ["recorded_0"]
    wrong = SimpleNamespace(**{module.FUNCTION: lambda v: v * 2 * (1 + 1e-3)})
    assert module._run_case(case, [[x]], wrong, reference)["ok"] is False
    module.CALIBRATE = False
    assert module._run_case(case, [[x]], single, reference)["ok"] is False
    as_float = module._run_case(case, [[x.float()]], single, reference)  # float32 is not moved
    assert as_float["ok"] is True


def test_an_integer_output_may_take_only_the_references_own_picks(refrepo, tmp_path):
    """Where a few-ulp move of the inputs flips the reference's integer result (a value at a
    threshold), the label may take either pick there, never another value: a kernel that
    leaves the output unwritten (poison bytes) still fails."""
    module = _generated_test_module(refrepo, tmp_path)
    module.DEVICE = "cpu"
    case = _case("recorded_0", made=False)
    x = torch.tensor([1.0, 2.0, 0.5, 1.0 + 2**-23])
    reference = SimpleNamespace(reference=lambda v: (v > 1.0).long())
    flipped = SimpleNamespace(**{module.FUNCTION: lambda v: (v >= 1.0).long()})  # the tie
    result = module._run_case(case, [[x]], flipped, reference)
    assert result["ok"] is True and result["note"].startswith("ill-conditioned"), result

    def unwritten(v):
        out = (v > 1.0).long()
        out[0] = 0x5A5A5A5A5A5A5A5A  # the element the tie decides, never written
        return out

    garbage = SimpleNamespace(**{module.FUNCTION: unwritten})
    assert module._run_case(case, [[x]], garbage, reference)["ok"] is False


def test_a_kernel_skipped_on_a_rerun_keeps_no_test_from_the_run_before():
    """pytorch3d's InterpFaceAttrsForward had a test until its CPU function was seen to only
    raise; the rerun's skip must not leave the old test to be bundled and verified."""
    from miner.candidate import Candidate, Kernel, Provenance, Reason, Tests
    from testgen.generate import _skip

    cand = Candidate(
        id="c0",
        provenance=Provenance(repo_url="r", commit="0" * 40),
        kernel=Kernel(name="k", file="k.cu", line=1, start_line=1, end_line=2, source=""),
        tests=Tests(path="tests/c0.py", num_cases=18, cases_source="mined"),
    )
    _skip(cand, Reason.NO_REFERENCE, "InterpFaceAttrsForwardCpu only raises")
    assert cand.stages["testgen"].reason == Reason.NO_REFERENCE
    assert cand.tests == Tests() and not cand.tests.path


def test_probed_calls_are_planned_whole():
    """A probed call is valid only as the CPU implementation ran it: cutting rows off a table
    that an index tensor points into reads past it (torchsparse's voxelize backward reference
    died of SIGSEGV on such a cut), so the plan varies values and dtypes only."""
    feats, idx = torch.randn(16, 16), torch.arange(16, dtype=torch.int32) % 16
    counts = torch.ones(16, dtype=torch.int32)
    calls = [
        BaseCall([feats, idx, counts, True], "probe"),
        BaseCall([feats[:7], idx[:7], counts, True], "probe"),
    ]
    names = ["feats", "idx", "counts", "flag"]
    cut = plan(calls, ["float32", "float64"], names, made=True)
    assert any(c["base"] >= len(calls) for c in cut.cases)  # unprobed calls derive new ones
    whole = plan(calls, ["float32", "float64"], names, made=True, whole=True)
    assert len(whole.base) == len(calls)  # no call beside the probed ones
    assert all(c.get("tile") is None and c.get("flag") is None for c in whole.cases)
    assert {c["id"] for c in whole.cases} >= {
        "generated_0",
        "generated_1",
        "edge_large",
        "typical_float64",
    }
