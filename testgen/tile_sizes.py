"""Probe sizes that reach a kernel the host code picks by tile alignment or a count threshold.

Host code derived from spconv launches one of several kernels per op by how the problem tiles:
`if (numPlanes % NumTLP == 0)` a vectorized kernel, inside it `if (numHotBlock >= NumTLP)` a
block kernel over the whole tiles and `if (size > numHotBlock)` a generic one for the rest, with
NumTLP running over 64, 32 and 16 (`mp_for_each<mp_list_c<int, 64, 32, 16>>`); where no tile
fits, a generic block kernel for counts of 64 and more. The probe's own sizes (at most 29) are
never a multiple of 16 with that many rows, so those kernels never run: their rows pass, and so
does every wrong variant. The guards read template parameters and lambda arguments kminer's
evaluator cannot follow (shape_selectors does, where they are sizes and constants), so a kernel
whose launch sits under an alignment (`a % b`) or a comparison of two names (`size > hot`) is
probed at two more sizes: 48, a multiple of 16 and of neither 32 nor 64 (a width the smallest
common tile aligns), and 65, one past the largest (no tile fits, and counts reach 64). The host
code keeps the last word: a size that reaches nothing new is a few more cases.
"""

from __future__ import annotations

import re

import tree_sitter as ts

from miner.textprep import blank_comments_and_strings
from miner.treewalk import LANGUAGE
from testgen.selectors import _definitions, _leads
from testgen.shape_selectors import _guards

TILE_SIZES = (48, 65)
TILE_RANK = 3  # past it a tensor of 65 a side is too large to probe
SMALL_TILE_SIZES = (8, 16, 17, 24)  # for tensors of more dimensions (sizes_at_rank)
_TILED = re.compile(
    r"[\w)\]]\s*%\s*[\w(]"  # an alignment
    # a threshold of two names (spaced as formatted code spaces a comparison, unlike the
    # angle brackets of `static_cast<int>(n)` or `is_same<T, float>`)
    r"|\b[A-Za-z_]\w*\s+(?:>=|<=|>|<)\s+[A-Za-z_]\w*\b(?!\s*[<(:])"
)


def tiled(label_text: str, kernel: str) -> bool:
    """Whether a launch of `kernel` (or of a function or functor that launches it) sits under
    an alignment or a threshold of two names."""
    code = blank_comments_and_strings(label_text)
    root = ts.Parser(LANGUAGE).parse(code.encode("latin-1", errors="replace")).root_node
    name = kernel.split("::")[-1]
    leads = _leads(_definitions(root, code), code, name)
    others = sorted(leads - {name})
    pattern = rf"\b{re.escape(name)}\b[^;{{}}]*?<<<"
    if others:  # a call of a function or functor that launches it
        pattern += rf"|\b(?:{'|'.join(map(re.escape, others))})\b\s*(?:<[^;{{}}]*?>)?\s*\("
    sites = re.compile(pattern)
    return any(
        _TILED.search(cond)
        for site in sites.finditer(code)
        for cond in (*(c for c, _ in _guards(root, code, site.start())), _in_macro(code, site))
    )


def _in_macro(code: str, site: re.Match) -> str:
    """The text before `site` in the `#define` it is written in (SparseConvNet's
    `#define FOO(T, K, V) { if (input_nPlanes % K == 0 ...) { ...<<<...>>>` picks a kernel by
    alignment inside a macro the grammar reads as one opaque token), else ''."""
    start = code.rfind("\n", 0, site.start()) + 1
    while start > 1 and code[start - 2] == "\\":  # a continued line: the #define is above
        start = code.rfind("\n", 0, start - 1) + 1
    head = code[start : site.start()]
    return head if re.match(r"[ \t]*#[ \t]*define\b", head) else ""


def tile_sizes(label_text: str, kernel: str) -> tuple[int, ...]:
    return TILE_SIZES if tiled(label_text, kernel) else ()


def sizes_at_rank(tiles: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """The tile sizes a probe of tensors of `rank` dimensions tries: past TILE_RANK a tensor of
    65 a side is too large, so the smallest common tiles, 8 and 16, one past 16 (a width no
    tile aligns), and 24 (8-wide tiles align it, 16-wide ones not; three of them: a kernel
    over whole tiles runs more than once)."""
    if not tiles or rank <= TILE_RANK:
        return tiles
    return SMALL_TILE_SIZES
