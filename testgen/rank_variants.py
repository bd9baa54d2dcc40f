"""A tensor argument the host code takes at more than one rank, at the rank the tests never pass.

StyleGAN's filtered_lrelu checks `(fu.dim() == 1 || fu.dim() == 2)`: a rank-1 filter is
separable, a rank-2 one full, and a different kernel specialization serves each (there is none
at all for two full filters with upsampling, where the op returns no tensor and the
repository's Python falls back to a generic path). mmcv's tests pass only 2-D filters, so every
recorded call reaches no kernel. The condition the host code writes says which ranks it takes;
a call with the argument at the other rank reaches the code the tests never ran. A rank one
lower takes the tensor's first entry along its first axis (a 2-D filter's first row); one
higher adds a leading axis of one.
"""

from __future__ import annotations

import re

from miner.textprep import blank_comments_and_strings

MAX_RANK_VARIANTS = 4  # per base call
MAX_RANK_BASES = 8  # base calls given them (each recorded mode may reach another specialization)
_DIM = r"\s*\.\s*(?:dim|ndimension)\s*\(\s*\)\s*==\s*(\d+)"


def rank_choices(label_text: str, names: list[str]) -> dict[int, set[int]]:
    """{argument index: the ranks the host code takes it at}, for each tensor parameter
    compared with two ranks or more in one condition (`x.dim() == 1 || x.dim() == 2`)."""
    code = blank_comments_and_strings(label_text)
    out: dict[int, set[int]] = {}
    for i, name in enumerate(names):
        if not name:
            continue
        n = re.escape(name)
        either = re.compile(rf"\b{n}{_DIM}\s*\|\|\s*\(?\s*{n}{_DIM}")
        for m in either.finditer(code):
            out.setdefault(i, set()).update({int(m.group(1)), int(m.group(2))})
    return out


def at_rank(tensor, rank: int):
    """The tensor at `rank`, one away from its own (None for anything else)."""
    if rank == tensor.dim() - 1 and tensor.dim() >= 1 and tensor.shape[0] >= 1:
        return tensor[0].contiguous()
    if rank == tensor.dim() + 1:
        return tensor.unsqueeze(0).contiguous()
    return None


def rank_variants(args: list, choices: dict[int, set[int]]) -> list[tuple[str, list]]:
    """(what changed, args): each argument at each other rank it is taken at, then all of them
    together (`fu` and `fd` both separable is yet another specialization)."""
    out, together, moved = [], list(args), []
    for i, ranks in sorted(choices.items()):
        a = args[i] if i < len(args) else None
        if not hasattr(a, "dim"):
            continue
        for rank in sorted(ranks - {a.dim()}):
            changed = at_rank(a, rank)
            if changed is None:
                continue
            one = list(args)
            one[i] = together[i] = changed
            moved.append(str(i))
            out.append((f"argument {i} at rank {rank}", one))
    if len(out) > 1:
        out.append((f"arguments {', '.join(moved)} each at its other rank", together))
    return out[:MAX_RANK_VARIANTS]
