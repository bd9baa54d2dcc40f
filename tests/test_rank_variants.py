"""A tensor the host code takes at two ranks gets cases at the rank the tests never pass, and a
label that declines an input (returns no tensor) is no verdict on its kernel."""

from pathlib import Path

from testgen.cases import BaseCall, plan
from testgen.rank_variants import at_rank, rank_choices, rank_variants

ROOT = Path(__file__).resolve().parents[1]

# StyleGAN's filtered_lrelu host checks, written afresh: rank 1 is a separable filter
HOST = """
std::tuple<torch::Tensor, torch::Tensor, int> resample_op(
    torch::Tensor x, torch::Tensor fu, torch::Tensor fd, int up) {
  TORCH_CHECK(x.dim() == 4, "x must be rank 4");
  TORCH_CHECK((fu.dim() == 1 || fu.dim() == 2) && (fd.dim() == 1 || fd.dim() == 2),
              "fu and fd must be rank 1 or 2");
  // "x.dim() == 3 || x.dim() == 5" in a comment says nothing
  resample_spec spec = choose(fu.dim() == 2 ? fu.size(0) : 0);
  if (!spec.exec) return std::make_tuple(torch::Tensor(), torch::Tensor(), -1);
  return std::make_tuple(x, x, 0);
}
"""
NAMES = ["x", "fu", "fd", "up"]


def _call(up=2):
    import torch

    return [torch.rand(1, 3, 8, 8), torch.rand(4, 4), torch.rand(2, 2), up]


def test_the_ranks_a_condition_takes_either_of():
    either = {(1, 1), (2, 2)}
    assert rank_choices(HOST, NAMES) == {1: either, 2: either}  # x: one rank only
    assert rank_choices(HOST.replace("||", "&&"), NAMES) == {}


def test_each_argument_at_its_other_rank_then_all_together():
    import torch

    args = _call()
    variants = rank_variants(args, rank_choices(HOST, NAMES))
    shapes = [[tuple(a.shape) for a in v[:3]] for _, v in variants]
    assert shapes == [
        [(1, 3, 8, 8), (4,), (2, 2)],
        [(1, 3, 8, 8), (4, 4), (2,)],
        [(1, 3, 8, 8), (4,), (2,)],
    ]
    assert torch.equal(variants[0][1][1], args[1][0])  # a 2-D filter's first row
    assert [how for how, _ in variants][-1] == "arguments 1, 2 each at its other rank"
    assert at_rank(torch.rand(3), 2).shape == (1, 3) and at_rank(torch.rand(3), 3) is None


# mamba's selective scan, written afresh: B per step (batch, groups, state, length) or one per
# channel, shaped like A; only a check's threshold is a requirement
SCAN = """
std::vector<at::Tensor> scan_fwd(const at::Tensor& u, const at::Tensor& A, const at::Tensor& B,
                                 const at::Tensor& C) {
  TORCH_CHECK(u.dim() >= 3, "u is (batch, dim, length)");
  TORCH_CHECK((C.dim() > 1) && C.is_cuda());
  const bool is_variable_B = B.dim() >= 3;
  if (!is_variable_B) {
    CHECK_SHAPE(B, dim, dstate);
  }
  return {u};
}
"""
SCAN_NAMES = ["u", "A", "B", "C"]


def test_a_threshold_outside_a_check_gets_a_case_at_the_rank_across_it():
    """Before, only `x.dim() == 1 || x.dim() == 2` was read: mamba's tests pass B only per step
    and the per-channel specialization (`if constexpr (!kIsVariableB)` in its kernels) ran in
    no case, so a wrong variant there passed (the backward's first op_swap on the H100)."""
    import torch

    choices = rank_choices(SCAN, SCAN_NAMES)
    assert choices == {2: {(0, 2), (3, 8)}}  # u's and C's thresholds are inside checks
    u, A = torch.rand(2, 4, 16), torch.rand(4, 8, dtype=torch.float64)
    B = torch.rand(2, 1, 8, 16)
    ((how, args),) = rank_variants([u, A, B, torch.rand(2, 1, 8, 16)], choices)
    assert how == "argument 2 at rank 2"
    assert args[2].shape == A.shape and args[2].dtype == A.dtype  # shaped and typed like A
    assert not torch.equal(args[2], A) and torch.equal(args[2], at_rank(B, 2, [u, A]))  # seeded
    # recorded per channel: the case goes the other way, to the nearest rank across
    ((how, args),) = rank_variants([u, A, A.clone(), A], {2: choices[2]})
    assert how == "argument 2 at rank 3" and args[2].shape == (1, 4, 8)
    assert at_rank(B, 1, [u, A]) is None  # no argument at rank 1 to take a shape from


def test_rank_cases_come_from_every_recorded_call_and_are_made():
    base = [
        BaseCall(_call(2), "tests/test_resample.py"),
        BaseCall(_call(4), "tests/test_resample.py"),
    ]
    out = plan(base, ["float32"], NAMES, ranks=rank_choices(HOST, NAMES))
    ranked = [c for c in out.cases if c["id"].startswith("rank")]
    assert [c["id"] for c in ranked] == [f"rank{n}_of_{k}" for k in (0, 1) for n in range(3)]
    assert all(c["made"] and out.base[c["base"]].selects for c in ranked)
    assert out.base[ranked[3]["base"]].args[3] == 4  # the second call's mode kept
    # a glue's calls (a backward behind its forward) are whole, and its forward's inputs take
    # the other rank too (mamba's backward); a probe's drafts get no ranks from testgen.generate
    glued = plan(base, ["float32"], NAMES, ranks=rank_choices(HOST, NAMES), whole=True)
    assert [c["id"] for c in glued.cases if c["id"].startswith("rank")] == [c["id"] for c in ranked]


def _declined():
    text = (ROOT / "prompts" / "test_code.py.j2").read_text()
    start = text.index("\ndef _declined(")
    scope: dict = {}
    exec("import torch\n", scope)
    exec(text[start : text.index("\ndef ", start + 1)], scope)
    return scope["_declined"]


def test_a_label_returning_no_tensor_declines_the_input():
    """filtered_lrelu returns (Tensor(), Tensor(), -1) where no kernel fits: pybind gives None
    for the undefined tensors. Before, those outputs were dropped and the status was compared
    with the reference's tensor: a correct kernel was told `mismatch` (max error inf)."""
    import torch

    declined = _declined()
    assert "status -1" in declined((None, None, -1))
    assert declined((torch.zeros(2), torch.zeros(1), 0)) == ""
    assert declined(None) == ""  # a void function returns None: it wrote its arguments
    assert declined(torch.zeros(2)) == ""
    assert declined((torch.zeros(2), None)) == ""  # an optional output left undefined
    assert declined((None, None)) == ""  # no status says it declined
