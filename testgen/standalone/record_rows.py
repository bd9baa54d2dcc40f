"""A call too large to keep, kept as its first few rows.

Some tests call an op at production size: Swin-Transformer's window test passes a 192 x 56 x 56
x 96 image (57.8 M elements) with `B, H, W, C` beside it, and the recorder, which keeps no
tensor over MAX_ELEMENTS, would keep nothing of the op. Its rows (dimension 0) are the items of
the call, as testgen/resize.py cuts them: every tensor with that many rows is cut to its first
R, an integer argument equal to the row count becomes R (the batch size `B`; which of them is a
count by its name is for testgen to judge, from the positions kept with the call), and nothing
else changes. A possible reference called on the same tensor is cut alike and run again on the
cut arguments, so that its result is its result for them; its pairing by value with the op's
call holds because both cuts keep the same first rows.

No cut where it may not mean fewer items: the row count also sizes another dimension (a
pairwise matrix), a tensor without those rows is too large itself, or a too-large tensor has
another row count.

Part of `recorder.py` (standard library and torch only); imported beside it as a sibling.
"""

from __future__ import annotations

ROWS = (16, 8, 4, 2, 1)  # the most of these rows that fit (the same count on both sides)


def rows_cut(values: list, max_elements: int) -> tuple[int, int] | None:
    """(N, R): the call's too-large tensors all have N rows and their first R fit; None when
    the call cannot be cut so (above)."""
    import torch

    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    big = [t for t in tensors if t.numel() > max_elements]
    if not big or any(t.dim() == 0 for t in big):
        return None
    n = int(big[0].shape[0])
    if n < 2 or any(int(t.shape[0]) != n for t in big):
        return None
    rowed = [t for t in tensors if t.dim() and int(t.shape[0]) == n]
    if any(n in (int(d) for d in t.shape[1:]) for t in tensors):
        return None  # the count sizes something else too
    if any(t.numel() > max_elements for t in tensors if not any(t is r for r in rowed)):
        return None
    row = max(t.numel() // n for t in rowed)
    fits = [r for r in ROWS if r < n and r * row <= max_elements]
    return (n, fits[0]) if fits else None


def cut(value, n: int, r: int):
    """The value in the cut call: a tensor of N rows as a copy of its first R, an integer N as
    R, anything else as it is."""
    import torch

    if isinstance(value, torch.Tensor) and value.dim() and int(value.shape[0]) == n:
        return value[:r].detach().clone()
    if isinstance(value, int) and not isinstance(value, bool) and value == n:
        return r
    return value


def counted(args: tuple, kwargs: dict, n: int) -> list:
    """Where the integer arguments equal to N stand (positions, keyword names): each was set to
    R, which testgen accepts only for a parameter named as a count."""
    return [
        k
        for k, v in [*enumerate(args), *kwargs.items()]
        if isinstance(v, int) and not isinstance(v, bool) and v == n
    ]


def cut_call(args: tuple, kwargs: dict, max_elements: int):
    """(args, kwargs, [N, R, counted]) of the cut call; None when there is none."""
    found = rows_cut([*args, *kwargs.values()], max_elements)
    if found is None:
        return None
    n, r = found
    where = counted(args, kwargs, n)
    return (
        tuple(cut(a, n, r) for a in args),
        {k: cut(v, n, r) for k, v in kwargs.items()},
        [n, r, where],
    )
