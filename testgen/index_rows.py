"""Fewer rows of a call that holds no floating data: an op over indices only.

Ops like pytorch_sparse's `non_diag_mask(row, col, M, N, k)`, a voxel hash over `coords (N, 4)`
or a `unique` over keys take integer tensors only. testgen.resize takes its rows from the first
floating tensor, so such a call kept its recorded shapes, and a test with two recorded calls was
too weak to count. The same rule is used here, on index data: the rows are the items of the
first tensor, and every tensor with that many rows is cut with it. The rule is stricter, because
here the values themselves may be structure. The call gets no smaller shapes when any of these
holds:

- the first tensor has fewer than 4 rows (a leading 2 or 3 is a layout: `edge_index (2, E)`);
- the row count appears in another dimension or another tensor, or the count plus one (a
  pointer over the rows: `gather_csr(src, indptr)`);
- another tensor holds values from 0 up to the row count (it may index the rows);
- an integer argument equals the row count, unless its name says it is the count;
- an integer argument equals the largest value of a row tensor, or the sum of one whose values
  are all positive counts (a total the values add up to: `ptr2ind(ptr, E)` with E = ptr[-1]);
- a row tensor is a CSR pointer (testgen.segments, which cuts those by their segments).
"""

from __future__ import annotations

from testgen.resize import COUNT_NAME, _is_tensor
from testgen.segments import is_pointer, pointer_ends

MIN_ROWS = 4


def _counts(n: int) -> list[int]:
    """1, 2 and one near the middle: index data is small (a handful of recorded entries), and
    three new shapes are what a test needs beside its recorded ones."""
    return sorted({1, 2, n // 2 + 1} - {n})


def _totals(t) -> set[int]:
    """What the values may add up to: their largest (the last offset), and their sum where
    every value is a positive count (segment lengths)."""
    out = {int(t.max())}
    if bool((t > 0).all()):
        out.add(int(t.sum()))
    return out


def index_subsets(args: list, names: list[str] | None = None) -> list[tuple[int, list]]:
    """(m, the call over the first m rows of its index data) for each count, or [] when the
    call holds floating data or cutting its rows may not give a valid call."""
    tensors = [a for a in args if _is_tensor(a)]
    if not tensors or any(a.is_floating_point() or a.is_complex() for a in tensors):
        return []
    first = tensors[0]
    if first.dim() not in (1, 2) or first.shape[0] < MIN_ROWS:
        return []
    n = int(first.shape[0])
    names = list(names or []) + [""] * (len(args) - len(names or []))
    rows = [i for i, a in enumerate(args) if _is_tensor(a) and a.dim() and a.shape[0] == n]
    ints = {i: a for i, a in enumerate(args) if isinstance(a, int) and not isinstance(a, bool)}
    ends = pointer_ends(args)
    for i, a in enumerate(args):
        if not _is_tensor(a):
            continue
        if n in tuple(a.shape)[1:] or (i not in rows and {n, n + 1} & set(a.shape)):
            return []
        if i not in rows and a.numel() and int(a.min()) >= 0 and int(a.max()) <= n:
            return []  # it may index the rows
        if i in rows and a.numel() and (is_pointer(a, ends) or _totals(a) & set(ints.values())):
            return []
    counts = [i for i, v in ints.items() if v == n]
    if any(not COUNT_NAME.match(names[i] or "") for i in counts):
        return []
    out = []
    for m in _counts(n):
        new = list(args)
        for i in rows:
            new[i] = args[i][:m].clone()
        for i in counts:
            new[i] = m
        out.append((m, new))
    return out
