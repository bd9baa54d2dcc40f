"""New shapes from a recorded call: the same call over fewer rows of its data.

A repository's test often calls an op at one shape (mmcv's nms test: four boxes), and a test that
sees one shape cannot tell a kernel that handles any count from one that handles four. The rows of
the data (its first floating tensor) are the one axis that is safe to shrink by rule: every tensor
whose first dimension is the same count is cut with it, so they keep describing the same items,
and nothing else changes. Where that may not hold the call gets no smaller shapes:

- the count appears at another dimension of some tensor (it may be a size, not the item count),
  except as the width of a list of boxes (K, 4..9), where four boxes of four numbers are common;
- an integer argument equals the count, unless its name says it is the count (`num`, `n`,
  `num_boxes`...; it is then set to the new count) or that it is a window or a step (`ksize_h`,
  `pad_w`, `h_mask`, `dilation`);
- an all-zero tensor outside the rows has a multiple of the count elements (an output sized from
  the rows, as `ious` of N x M boxes, which cannot be resized by rule);
- an integer tensor outside the rows holds values below the count (it may index the rows).

A permutation of the rows (NMS's descending `order`) keeps the entries below the new count, in
order, so it stays the sort of the rows kept; a tensor that is another one gathered by it
(`dets_sorted` == `dets[order]`) keeps the matching rows.
"""

from __future__ import annotations

import re

COUNT_NAME = re.compile(r"^(?:n|num|count|batch(?:_size)?|num_\w+|n_\w+)_?$", re.IGNORECASE)
# an integer whose name says it is a window or a step is no count, whatever its value
OTHER_NAME = re.compile(r"ksize|kernel|pad|stride|dil|group|mask", re.IGNORECASE)


def _is_tensor(a) -> bool:
    return hasattr(a, "shape") and hasattr(a, "dim")


def _is_int(a) -> bool:
    return _is_tensor(a) and not a.is_floating_point() and not a.is_complex()


def row_counts(n: int) -> list[int]:
    """The smallest valid count and one near the middle (odd sizes: off any block multiple)."""
    return sorted({1, n // 2 + 1} - {n})


def row_subsets(args: list, names: list[str] | None = None) -> list[tuple[int, list]]:
    """(m, the call's arguments over the first m rows) for each count of `row_counts`, or []
    when shrinking the rows may not give a valid call."""
    names = list(names or []) + [""] * (len(args) - len(names or []))
    data = next((a for a in args if _is_tensor(a) and a.is_floating_point()), None)
    if data is None or data.dim() == 0 or data.shape[0] < 2:
        return []
    n = int(data.shape[0])
    rows = [i for i, a in enumerate(args) if _is_tensor(a) and a.dim() and a.shape[0] == n]
    counts = []
    for i, a in enumerate(args):
        if _is_tensor(a):
            box_list = i in rows and a.dim() == 2 and 4 <= a.shape[1] <= 9
            if n in tuple(a.shape)[1:] and not box_list:
                return []
            if i in rows or not a.numel():
                continue
            if not a.any():
                if a.numel() % n == 0:
                    return []
            elif _is_int(a) and int(a.min()) >= 0 and int(a.max()) < n:
                return []
        elif isinstance(a, int) and not isinstance(a, bool) and a == n:
            if COUNT_NAME.match(names[i]):
                counts.append(i)
            elif not OTHER_NAME.search(names[i]):
                return []
    perms = [i for i in rows if _is_int(args[i]) and args[i].dim() == 1]
    perms = [i for i in perms if sorted(args[i].tolist()) == list(range(n))]
    if len(perms) > 1:
        return []
    perm = args[perms[0]] if perms else None
    if (
        perm is not None
        and not perm.equal(perm.sort().values)
        and perm[perm].equal(perm.sort().values)
    ):
        return []  # a swap of rows is its own inverse: which tensor was gathered is ambiguous
    gathered = set()
    if perm is not None:
        for i in rows:
            others = [args[j] for j in rows if j != i and args[j].shape == args[i].shape]
            if any(args[i].equal(o.index_select(0, perm)) for o in others):
                gathered.add(i)
    out = []
    for m in row_counts(n):
        new = list(args)
        for i in rows:
            a = args[i]
            if perm is not None and i == perms[0]:
                new[i] = a[a < m].clone()
            elif i in gathered:
                new[i] = a[perm < m].clone()
            else:
                new[i] = a[:m].clone()
        for i in counts:
            new[i] = m
        out.append((m, new))
    return out
