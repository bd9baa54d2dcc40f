"""A tensor argument the host code takes at more than one rank, at the rank the tests never pass.

StyleGAN's filtered_lrelu checks `(fu.dim() == 1 || fu.dim() == 2)`: a rank-1 filter is
separable, a rank-2 one full, and a different kernel specialization serves each (there is none
at all for two full filters with upsampling, where the op returns no tensor and the
repository's Python falls back to a generic path). mmcv's tests pass only 2-D filters, so every
recorded call reaches no kernel. The condition the host code writes says which ranks it takes;
a call with the argument at the other rank reaches the code the tests never ran. A rank one
lower takes the tensor's first entry along its first axis (a 2-D filter's first row); one
higher adds a leading axis of one.

A threshold picks a specialization too: mamba's selective scan sets `is_variable_B = B.dim()
>= 3` (B per step, (batch, groups, state, length), or one per channel, (dim, state)), and its
tests pass only the first. A rank two or more away from the recorded one is taken from another
tensor argument already at that rank, shaped and typed like it (mamba's A is (dim, state), the
shape the host checks B against at rank 2), with seeded values. A threshold inside a check
(`TORCH_CHECK(x.dim() >= 2)`) is a requirement, not a choice.
"""

from __future__ import annotations

import re

from miner.textprep import blank_comments_and_strings, enclosing_calls

MAX_RANK_VARIANTS = 4  # per base call
MAX_RANK_BASES = 8  # base calls given them (each recorded mode may reach another specialization)
MAX_RANK = 8
_DIM = r"\s*\.\s*(?:dim|ndimension)\s*\(\s*\)\s*==\s*(\d+)"
_THRESHOLD = r"\s*\.\s*(?:dim|ndimension)\s*\(\s*\)\s*(>=|>|<=|<)\s*(\d+)"
_CHECK = re.compile(r"CHECK|ASSERT|EXPECT", re.IGNORECASE)


def rank_choices(label_text: str, names: list[str]) -> dict[int, set[tuple[int, int]]]:
    """{argument index: the ranges of ranks (lo, hi) the host code tells apart}, for each
    tensor parameter compared with two ranks or more in one condition (`x.dim() == 1 ||
    x.dim() == 2`: (1, 1) and (2, 2)) or with a threshold outside a check (`x.dim() >= 3`:
    (0, 2) and (3, MAX_RANK))."""
    code = blank_comments_and_strings(label_text)
    out: dict[int, set[tuple[int, int]]] = {}
    for i, name in enumerate(names):
        if not name:
            continue
        n = re.escape(name)
        either = re.compile(rf"\b{n}{_DIM}\s*\|\|\s*\(?\s*{n}{_DIM}")
        for m in either.finditer(code):
            out.setdefault(i, set()).update((int(r), int(r)) for r in m.groups())
        for m in re.finditer(rf"\b{n}{_THRESHOLD}", code):
            if any(_CHECK.search(call) for call in enclosing_calls(code, m.start())):
                continue
            op, k = m.group(1), int(m.group(2))
            first = k if op in (">=", "<") else k + 1  # the lowest rank of the upper range
            if 1 < first <= MAX_RANK:  # (a rank-0 tensor is a scalar's business)
                out.setdefault(i, set()).update({(0, first - 1), (first, MAX_RANK)})
    return out


def at_rank(tensor, rank: int, others: list = ()):
    """The tensor at `rank`: one away from its own, cut or widened; further, a seeded tensor
    shaped and typed like the first of `others` at that rank (None where none fits)."""
    if rank == tensor.dim() - 1 and tensor.dim() >= 1 and tensor.shape[0] >= 1:
        return tensor[0].contiguous()
    if rank == tensor.dim() + 1:
        return tensor.unsqueeze(0).contiguous()
    import torch

    for other in others:
        if (
            isinstance(other, torch.Tensor)
            and other is not tensor
            and other.dim() == rank
            and other.is_floating_point() == tensor.is_floating_point()
        ):
            gen = torch.Generator().manual_seed(rank)
            if other.is_floating_point():
                return torch.randn(other.shape, generator=gen).to(other.dtype)
            return torch.randint(0, 2, other.shape, generator=gen).to(other.dtype)
    return None


def _nearest(ranges: set[tuple[int, int]], rank: int) -> list[int]:
    """For each range not holding `rank`, its rank nearest to it."""
    return sorted(min(max(rank, lo), hi) for lo, hi in ranges if not lo <= rank <= hi)


def rank_variants(args: list, choices: dict[int, set[tuple[int, int]]]) -> list[tuple[str, list]]:
    """(what changed, args): each argument at each other rank it is taken at, then all of them
    together (`fu` and `fd` both separable is yet another specialization)."""
    out, together, moved = [], list(args), []
    for i, ranges in sorted(choices.items()):
        a = args[i] if i < len(args) else None
        if not hasattr(a, "dim"):
            continue
        for rank in _nearest(ranges, a.dim()):
            changed = at_rank(a, rank, args)
            if changed is None:
                continue
            one = list(args)
            one[i] = together[i] = changed
            moved.append(str(i))
            out.append((f"argument {i} at rank {rank}", one))
    if len(out) > 1:
        out.append((f"arguments {', '.join(moved)} each at its other rank", together))
    return out[:MAX_RANK_VARIANTS]
