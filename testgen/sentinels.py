"""Calls that fill what the recorded calls leave empty: an index tensor's absent entries (-1),
and floating tensors that are all zeros in every recorded call.

An index tensor that marks absent entries with -1 (the faces a pixel holds fewer than K of, the
points a query found fewer than k of) is absent at the same places in every call a repository's
tests make: a raster's last pixel is background in every image they draw. A kernel whose loop
stops one element short then passes every recorded case (pytorch3d's point rasterizer backward
kernel: its `off_by_one` variant survived its recorded cases). Filled, every entry names
something, and the element past a wrong bound is one the op computes. Each -1 gets an index the
same slice along dim 0 (one image, one batch item) holds elsewhere, so it stays in range.

A floating tensor all zeros in every recorded call is most often the gradient of an output the
test's loss never used (autograd hands a backward zeros for it: pytorch3d's face normals, whose
test sums the areas only). Every term it scales is then never computed, and a wrong sign there
passed every case. Filled with random values, the terms count. The label and its reference get
the same values; what either writes over them, or adds to them, it does alike.

Either call is one the repository never made: the test takes it as kminer's, and a fault or a
disagreement of the kernel and its reference there makes the case invalid, never a failure of
the kernel (testgen/cases.py `made`).
"""

from __future__ import annotations

MAX_FILLED = 2  # index tensors filled per base call


def filled_calls(args: list, seed: int = 0) -> list[tuple[int, list]]:
    """(argument, args with that argument's -1 entries filled) for each index tensor that has
    absent and present entries, at most MAX_FILLED."""
    out = []
    for i, a in enumerate(args):
        if len(out) >= MAX_FILLED:
            break
        filled = _filled(a, seed + i)
        if filled is not None:
            out.append((i, [filled if k == i else x for k, x in enumerate(args)]))
    return out


def zero_positions(calls: list[list]) -> list[int]:
    """The arguments that are floating tensors holding only zeros in every one of `calls`: the
    test fills them with random normal values in a case of their own (`nonzero` in its
    `_prepare`, drawn there from a fixed seed, so the file carries no copy of them)."""
    import torch

    def zeros(a) -> bool:
        floating = isinstance(a, torch.Tensor) and a.is_floating_point()
        return floating and a.numel() > 0 and not bool(a.any())

    width = min(len(c) for c in calls) if calls else 0
    return [i for i in range(width) if all(zeros(c[i]) for c in calls)]


def _filled(a, seed: int):
    """`a` with each -1 replaced by an index its dim-0 slice holds (the whole tensor's where
    the slice holds none); None when `a` is no index tensor with both kinds of entry."""
    import torch

    if not isinstance(a, torch.Tensor) or a.dtype not in (torch.int32, torch.int64):
        return None
    if a.dim() == 0 or not a.numel():
        return None
    absent = a == -1
    if not bool(absent.any()) or bool((a < -1).any()):  # only -1 marks absence here
        return None
    held = a[a >= 0]
    if not held.numel():
        return None
    gen = torch.Generator().manual_seed(seed)
    out = a.clone()
    slices = zip(out, absent, strict=True) if a.dim() >= 2 else [(out, absent)]
    for part, gone in slices:
        n = int(gone.sum())
        if not n:
            continue
        pool = part[part >= 0]
        pool = pool if pool.numel() else held
        part[gone] = pool[torch.randint(pool.numel(), (n,), generator=gen)]
    return out
