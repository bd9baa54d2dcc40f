"""einops' `rearrange` and `repeat` in plain torch, for a repository's reference that uses them.

A reference travels in a dataset row and runs where only torch is installed, yet the PyTorch
references of recent kernel repositories (mamba's `selective_scan_ref`, attention and
convolution references) reshape with einops. The vendored reference gets this module's source
in place of `from einops import rearrange, repeat`: the same patterns (named axes, composed
`(h w)` groups, `1` and `()` unit axes, one `...`, axis lengths as keywords, new axes of a
`repeat` by name or number) computed with reshape, permute and expand. A pattern it does not
take raises ValueError, which a test reads as an input the reference refuses; it is checked
against einops itself on the patterns such references write (tests/test_einops_lite.py).
"""

import math
import re

EXPORTS = ("rearrange", "repeat")


def _einops_groups(side):
    groups, open_group = [], None
    for token in re.findall(r"\.\.\.|\(|\)|[A-Za-z_]\w*|\d+|\S", side):
        if token == "(":
            open_group = []
        elif token == ")":
            groups.append(open_group)
            open_group = None
        elif not (token == "..." or token[0].isalnum() or token[0] == "_"):
            raise ValueError(f"einops pattern: unexpected {token!r}")
        elif open_group is not None:
            open_group.append(token)
        else:
            groups.append([token])
    return groups


def _einops_apply(tensor, pattern, lengths, repeating):
    if pattern.count("->") != 1:
        raise ValueError(f"einops pattern without one '->': {pattern!r}")
    left, right = (_einops_groups(side) for side in pattern.split("->"))
    ellipsis = [i for i, group in enumerate(left) if "..." in group]
    if ellipsis:
        at = ellipsis[0]
        names = [f"_ell{k}" for k in range(tensor.dim() - len(left) + 1)]
        left = left[:at] + [[name] for name in names] + left[at + 1 :]
        spread = []
        for group in right:
            if group == ["..."]:
                spread += [[name] for name in names]
            else:
                spread.append([n for atom in group for n in (names if atom == "..." else [atom])])
        right = spread
    if len(left) != tensor.dim():
        raise ValueError(f"einops pattern {pattern!r} for a tensor of {tensor.dim()} dims")
    sizes = {name: int(n) for name, n in lengths.items()}
    for group, length in zip(left, tensor.shape, strict=True):
        unknown = [a for a in group if not a.isdigit() and a not in sizes]
        known = math.prod(int(a) if a.isdigit() else sizes[a] for a in group if a not in unknown)
        if len(unknown) > 1 or (unknown and (known == 0 or length % known)):
            raise ValueError(f"einops pattern {pattern!r}: cannot split {length}")
        if unknown:
            sizes[unknown[0]] = length // known
        elif known != length:
            raise ValueError(f"einops pattern {pattern!r}: {length} is not {known}")
    fresh = 0
    for group in right:  # a repeat's numbered new axis (`b n -> b n 3`)
        for k, atom in enumerate(group):
            if atom.isdigit() and atom != "1":
                if not repeating:
                    raise ValueError(f"einops rearrange takes no new axis {atom}")
                group[k] = f"_new{fresh}"
                sizes[group[k]] = int(atom)
                fresh += 1
    left_axes = [a for group in left for a in group if not a.isdigit()]
    right_axes = [a for group in right for a in group if not a.isdigit()]
    kept = [a for a in right_axes if a in left_axes]
    if sorted(kept) != sorted(left_axes) or len(set(right_axes)) != len(right_axes):
        raise ValueError(f"einops pattern {pattern!r}: axes differ between the sides")
    new = [a for a in right_axes if a not in left_axes]
    if new and not repeating:
        raise ValueError(f"einops rearrange takes no new axis {new[0]}")
    if any(a not in sizes for a in new):
        raise ValueError(f"einops repeat: the length of {new[0]} is not given")
    out = tensor.reshape([sizes[a] for a in left_axes])
    out = out.permute([left_axes.index(a) for a in kept])
    for position, axis in enumerate(right_axes):
        if axis not in left_axes:
            out = out.unsqueeze(position)
    out = out.expand([sizes[a] for a in right_axes])
    shape = [math.prod(1 if a.isdigit() else sizes[a] for a in group) for group in right]
    return out.reshape(shape)


def rearrange(tensor, pattern, **axes_lengths):
    return _einops_apply(tensor, pattern, axes_lengths, repeating=False)


def repeat(tensor, pattern, **axes_lengths):
    return _einops_apply(tensor, pattern, axes_lengths, repeating=True)
