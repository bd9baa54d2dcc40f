"""New shapes from a recorded call over a CSR pointer: fewer segments of it, or more.

pytorch_sparse's spmm and ptr2ind, pytorch_scatter's segment_csr and their kin take a pointer
(`rowptr`, `indptr`) into item tensors (`col`, `value`, `src`): a test that sees one pointer
cannot tell a kernel that handles any number of rows from one that handles these. The rows'
rule of `testgen.resize` refuses such calls (an integer tensor bounded by the count may index
it), so the segments are varied here instead, keeping every segment one the repository made.
"""

from __future__ import annotations

from testgen.resize import _is_int, _is_tensor, row_counts


def _pointer(args: list) -> tuple[int, int, int] | None:
    """(position, segments, items) of the call's one CSR pointer: a 1-D integer tensor that
    starts at 0, never decreases and ends at the first dimension of another tensor (rowptr
    over col and value, indptr over src) or at an integer argument (ptr2ind's count)."""
    ends = pointer_ends(args)
    found = [(i, a.numel() - 1, int(a[-1])) for i, a in enumerate(args) if is_pointer(a, ends)]
    return found[0] if len(found) == 1 and found[0][1] > 1 and found[0][2] > 0 else None


def pointer_ends(args: list) -> set[int]:
    """Where a pointer over a call's items may end: a tensor's first dimension, an integer."""
    ends = {int(a.shape[0]) for a in args if _is_tensor(a) and a.dim()}
    return ends | {a for a in args if isinstance(a, int) and not isinstance(a, bool)}


def is_pointer(a, ends: set[int]) -> bool:
    """A CSR pointer: 1-D integers from 0, never decreasing, ending at one of `ends`."""
    if not (_is_int(a) and a.dim() == 1 and a.numel() >= 3) or str(a.dtype) == "torch.bool":
        return False
    return int(a[0]) == 0 and bool((a[1:] >= a[:-1]).all()) and int(a[-1]) in ends


def _segments(args: list) -> tuple[int, int, int] | None:
    """The call's CSR pointer (`_pointer`) when changing its segments gives a valid call."""
    found = _pointer(args)
    if found is None:
        return None
    at, segments, items = found
    for i, a in enumerate(args):
        if i == at:
            continue
        if _is_tensor(a) and {segments, items} & set(tuple(a.shape)[1:]):
            return None
        if _is_tensor(a) and a.dim() and a.shape[0] == segments and a.numel() and a.any():
            return None
    ints = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
    if segments == items and segments in ints:
        return None  # which count an integer argument is cannot be told
    return found


def segment_subsets(args: list) -> list[tuple[int, list]]:
    """(m, the call over the first m segments of its CSR pointer) for each count of
    `row_counts`: the pointer is cut to m + 1 entries, every tensor of one entry per item to
    the items those segments hold, an output buffer of one row per segment (all zero) to m,
    and an integer argument equal to either count follows it. [] where a count also appears
    elsewhere (another dimension, data of one row per segment, which may as well be the
    matrix the items index, an ambiguous integer): the cut may not give a valid call."""
    found = _segments(args)
    if found is None:
        return []
    at, segments, items = found
    ptr = args[at]
    out = []
    for m in row_counts(segments):
        cut = int(ptr[m])
        if cut == 0:
            continue
        new = list(args)
        for i, a in enumerate(args):
            if i == at:
                new[i] = ptr[: m + 1].clone()
            elif _is_tensor(a) and a.dim() and a.shape[0] == items:
                new[i] = a[:cut].clone()
            elif _is_tensor(a) and a.dim() and a.shape[0] == segments:
                new[i] = a[:m].clone()
            elif isinstance(a, int) and not isinstance(a, bool) and a in (segments, items):
                new[i] = m if a == segments else cut
        out.append((m, new))
    return out


def more_segments(
    args: list, max_elements: int = 1 << 19, at_least: int = 157
) -> tuple[int, list] | None:
    """(m, the call over m > n segments of its CSR pointer), or None: each new segment is a
    recorded one (its items, in their order) picked at random, so every segment stays one the
    repository made (sorted columns stay sorted, indices stay in range); m is odd and at
    least `at_least` (157: above two blocks of 64; 1031: above a block of 1024)."""
    found = _segments(args)
    if found is None:
        return None
    at, segments, items = found
    ptr = args[at]
    per_item = sum(
        a.numel() // items for a in args if _is_tensor(a) and a.dim() and a.shape[0] == items
    )
    m = max(4 * segments + 3, at_least)
    m -= 1 - m % 2
    import torch

    gen = torch.Generator().manual_seed(segments * 7919 + m)
    pick = torch.randint(0, segments, (m,), generator=gen)
    pick[:segments] = torch.arange(segments)
    lengths = (ptr[1:] - ptr[:-1])[pick]
    if int(lengths.sum()) * max(1, per_item) > max_elements or int(lengths.sum()) == 0:
        return None
    new_ptr = torch.zeros(m + 1, dtype=ptr.dtype)
    new_ptr[1:] = lengths.cumsum(0)
    gather = torch.cat([torch.arange(int(ptr[j]), int(ptr[j + 1])) for j in pick.tolist()])
    total = int(new_ptr[-1])
    new = list(args)
    for i, a in enumerate(args):
        if i == at:
            new[i] = new_ptr
        elif _is_tensor(a) and a.dim() and a.shape[0] == items:
            new[i] = a.index_select(0, gather).contiguous()
        elif _is_tensor(a) and a.dim() and a.shape[0] == segments:
            new[i] = a.new_zeros((m, *a.shape[1:]))
        elif isinstance(a, int) and not isinstance(a, bool) and a in (segments, items):
            new[i] = m if a == segments else total
    return m, new
