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
    assert rank_choices(HOST, NAMES) == {1: {1, 2}, 2: {1, 2}}  # x: one rank only
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
    probed = plan(base, ["float32"], NAMES, ranks=rank_choices(HOST, NAMES), whole=True)
    assert not [c for c in probed.cases if c["id"].startswith("rank")]  # valid only as probed


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
