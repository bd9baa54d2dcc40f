"""A tensor dimension that chooses which kernel the host code launches, the size that launches
this one, and the recorded call made that size.

Host code often picks a kernel by a size it reads from a tensor: mmcv's multi-scale deformable
attention backward reads `const int channels = value.size(3);` and launches a shared-memory
kernel per `case` of `switch (channels)` up to 1024, another one for `channels > 1024` when
`(channels & 1023) == 0`, a third otherwise. The repository's tests pass a few channel counts,
so some of these kernels never run: their rows pass, and so does every wrong variant of them.
The guards on the path to the launch (each `if` it sits under, true or false by the branch it
is in, each `case`) say which sizes reach it; each is read as an integer expression, evaluated
by kminer's own small evaluator (never by Python's `eval`: it is the repository's text), over
the size and the constants the code defines. A guard that reads anything else says nothing
here, and the host code keeps the last word: a size that reaches nothing new is one more case.

Some host code picks the kernel as a function pointer instead (StyleGAN's upfirdn2d and
filtered_lrelu, vendored in many repositories): `spec = {(void *)upfirdn2d_kernel_large<T>, ...}`
first, then a smaller kernel's spec `if (s != 1 && fx <= 24 && fy <= 24)`, and so on, reading
sizes a struct carries (`p.filterSize = make_int2((int)f.size(1), (int)f.size(0))`, then
`fx = p.filterSize.x`). Each place the kernel is named as a value is a site, and the variable it
is assigned to keeps its last value: a later assignment to it overrides the site unless one of
its own guards is false for sure (a guard on anything else, `s != 1` on a stride, may hold).

The call is made by resizing that dimension of a recorded call's tensor, and every other tensor
dimension of the same size with it (an output, a gradient of the same shape); a last dimension
of k times that size (`num_heads * channels`) takes k times the new size. Entries are repeated
cyclically, each copy of a floating one scaled by 1 + copy/2, as channel tiling does (so
channels the kernel mixes up differ). A call whose integer arguments hold that size (it is
passed on its own as well) is not resized.
"""

from __future__ import annotations

import ast
import functools
import itertools
import math
import re

import tree_sitter as ts

from miner.textprep import blank_comments_and_strings, split_top
from miner.treewalk import LANGUAGE
from testgen.selectors import _definitions, _leads, _text

LARGEST_SIZE = 1 << 20  # no size past this is tried
_SIZE_VAR = re.compile(
    r"\b(\w+)\s*=\s*(\w+)\s*(?:\.|->)\s*(?:size\s*\(\s*(-?\d+)\s*\)|sizes\s*\(\s*\)\s*\[\s*(-?\d+)\s*\])"
)
_SIZE_USE = re.compile(
    r"\b(\w+)\s*(?:\.|->)\s*(?:size\s*\(\s*(-?\d+)\s*\)|sizes\s*\(\s*\)\s*\[\s*(-?\d+)\s*\])"
)
_CONSTANT = re.compile(
    r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+\(?[ \t]*(\d+)[ \t]*\)?[ \t]*$"
    r"|\b(?:static\s+)?(?:constexpr|const)\s+(?:int|unsigned|long|size_t|int64_t)\s+(\w+)\s*=\s*(\d+)\s*;",
    re.MULTILINE,
)
# a struct field set from sizes: `p.filterSize = make_int2((int)f.size(1), (int)f.size(0));`
_FIELD_SET = re.compile(
    r"\b\w+\s*(?:\.|->)\s*(\w+)\s*=\s*(?:make_(?:u?int|u?long|longlong)[234]|dim3)\s*\(([^;()]*)\)\s*;"
)
_ALIAS = re.compile(r"\b(\w+)\s*=\s*(kminer_size_\w+)\s*[,;]")
_AXES = ("x", "y", "z", "w")
_CAST = re.compile(r"\(\s*(?:unsigned\s+)?(?:int|long|size_t|int64_t|int32_t|unsigned)\s*\)")


class _Unknown(Exception):
    """The guard reads something that is neither a size nor a constant."""


class _Invalid(_Unknown):
    """The guard cannot be computed at these sizes (a division by zero): they reach nothing."""


_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: int(a / b),  # C's integer division truncates
    ast.Mod: lambda a, b: int(math.fmod(a, b)),
    ast.BitAnd: lambda a, b: a & b,
    ast.BitOr: lambda a, b: a | b,
    ast.BitXor: lambda a, b: a ^ b,
    ast.LShift: lambda a, b: a << b,
    ast.RShift: lambda a, b: a >> b,
}
_COMPARE = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}


def _value(node: ast.AST, env: dict[str, int]) -> int:
    """An integer expression's value, for the few node kinds a C guard is made of."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return int(node.value)
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise _Unknown(node.id)
        return env[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left, env), _value(node.right, env)
        if isinstance(node.op, (ast.Div, ast.Mod)) and right == 0:
            raise _Invalid("division by zero")
        if isinstance(node.op, (ast.LShift, ast.RShift)) and not 0 <= right < 64:
            raise _Invalid("a shift past 64 bits")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        inner = _value(node.operand, env)
        if isinstance(node.op, ast.Not):
            return int(not inner)
        if isinstance(node.op, ast.USub):
            return -inner
        if isinstance(node.op, ast.Invert):
            return ~inner
    if isinstance(node, ast.BoolOp):
        values = [bool(_value(v, env)) for v in node.values]
        return int(all(values) if isinstance(node.op, ast.And) else any(values))
    if isinstance(node, ast.Compare):
        left = _value(node.left, env)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _value(comparator, env)
            if type(op) not in _COMPARE or not _COMPARE[type(op)](left, right):
                return 0
            left = right
        return 1
    raise _Unknown(type(node).__name__)


@functools.lru_cache(maxsize=4096)  # a spec's guards are read again for every earlier site
def _python(cond: str) -> ast.AST | None:
    """A C guard as a Python expression tree (None when it is not one)."""
    text = _CAST.sub(" ", cond.strip())
    text = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", text)
    text = text.replace("&&", " and ").replace("||", " or ")
    text = re.sub(r"!(?!=)", " not ", text)
    text = re.sub(r"\btrue\b", "1", re.sub(r"\bfalse\b", "0", text))
    try:
        return ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _sizes(code: str, names: list[str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """The code with each `x.size(k)` of a parameter written as a name of its own (and each
    field of a struct set from such sizes, `p.filterSize.x`), and {name: (argument index, dim)}
    of those names and of the variables assigned one."""
    found: dict[str, tuple[int, int] | None] = {}
    for m in _SIZE_VAR.finditer(code):
        if m.group(2) in names:
            where = (names.index(m.group(2)), int(m.group(3) or m.group(4)))
            found[m.group(1)] = where if found.get(m.group(1), where) == where else None

    def use(m: re.Match) -> str:
        if m.group(1) not in names:
            return m.group(0)
        dim = int(m.group(2) or m.group(3))
        name = f"kminer_size_{names.index(m.group(1))}_{'m' if dim < 0 else ''}{abs(dim)}"
        found[name] = (names.index(m.group(1)), dim)
        return name

    code = _SIZE_USE.sub(use, code)
    fields: dict[str, str | None] = {}
    for m in _FIELD_SET.finditer(_CAST.sub(" ", code)):
        for axis, arg in zip(_AXES, split_top(m.group(2)), strict=False):
            key, arg = f"{m.group(1)}.{axis}", arg.strip()
            size = arg if arg in found else None
            fields[key] = size if fields.get(key, size) == size else None  # set once, or no size
    for key, size in fields.items():
        if size is not None:
            field, axis = key.split(".")
            code = re.sub(rf"\b\w+\s*(?:\.|->)\s*{field}\s*\.\s*{axis}\b(?!\s*=[^=])", size, code)
    for m in _ALIAS.finditer(code):
        if m.group(2) in found and found.get(m.group(1), found[m.group(2)]) == found[m.group(2)]:
            found[m.group(1)] = found[m.group(2)]
    return code, {k: v for k, v in found.items() if v is not None}


def _guards(root: ts.Node, code: str, at: int) -> list[tuple[str, bool]]:
    """(condition, must hold) of every `if` and `case` the byte `at` sits under."""
    out = []
    node = root.descendant_for_byte_range(at, at)
    while node is not None:
        parent = node.parent
        if parent is not None and parent.type == "if_statement":
            then, other = (parent.child_by_field_name(f) for f in ("consequence", "alternative"))
            cond = _text(code, parent.child_by_field_name("condition"))
            if then is not None and then.start_byte <= at < then.end_byte:
                out.append((cond, True))
            elif other is not None and other.start_byte <= at < other.end_byte:
                out.append((cond, False))
        if node.type == "case_statement" and parent is not None:
            switch = parent.parent
            if switch is not None and switch.type == "switch_statement":
                subject = _text(code, switch.child_by_field_name("condition")).strip()
                value = node.child_by_field_name("value")
                if value is not None:
                    out.append((f"({subject}) == ({_text(code, value)})", True))
                else:  # default: none of the cases
                    for case in parent.children:
                        v = (
                            case.child_by_field_name("value")
                            if case.type == "case_statement"
                            else None
                        )
                        if v is not None:
                            out.append((f"({subject}) == ({_text(code, v)})", False))
        node = parent
    return out


def _candidates(guards: list[tuple[ast.AST, bool]], constants: dict, base: list[int]) -> list[int]:
    """Sizes worth trying: small ones, powers of two, each literal (or constant) of the guards
    and its neighbours and multiples, the recorded sizes."""
    literals = {
        n.value if isinstance(n, ast.Constant) else constants[n.id]
        for g, _ in guards for n in ast.walk(g)
        if (isinstance(n, ast.Constant) and isinstance(n.value, int))
        or (isinstance(n, ast.Name) and n.id in constants)
    }  # fmt: skip
    out = set(range(1, 9)) | {1 << k for k in range(14)} | set(base)
    for v in literals:
        out |= {v - 1, v, v + 1, 2 * v, 3 * v, v + 3}
    return sorted(v for v in out if 0 < v <= LARGEST_SIZE)


def shape_selectors(
    label_text: str, kernel: str, names: list[str], base_args: list[list]
) -> list[tuple[int, int, int]]:
    """(argument index, dim, size): a tensor dimension whose size guards the launch of
    `kernel` (see the module's docstring), with a size that reaches the launch where no base
    call's does; the size nearest the recorded ones (in ratio) of those that do."""
    code, sizes = _sizes(blank_comments_and_strings(label_text), names)
    if not sizes:
        return []
    constants = {}
    for m in _CONSTANT.finditer(code):
        constants[m.group(1) or m.group(3)] = int(m.group(2) or m.group(4))
    root = ts.Parser(LANGUAGE).parse(code.encode("latin-1", errors="replace")).root_node
    name = kernel.split("::")[-1]
    leads = _leads(_definitions(root, code), code, name)
    others = "|".join(map(re.escape, sorted(leads - {name}))) or "(?!)"  # none: no lead call
    sites = re.compile(
        rf"\b{re.escape(name)}\b[^;{{}}]*?<<<"
        rf"|\b(?:{others})\b\s*(?:<[^;{{}}]*?>)?\s*(?:::\s*\w+\s*)?\("
        rf"|(?:\(\s*void\s*\*\s*\)|&|=)\s*{re.escape(name)}\b(?:\s*<[^;{{}}()]*?>)?(?!\s*(?:<<<|\())"
    )
    out: list[tuple[int, int, int]] = []
    for site in sites.finditer(code):
        parsed = [(_python(c), holds) for c, holds in _guards(root, code, site.start())]
        overrides = _overrides(root, code, site.start(), parsed)
        used = sorted({
            n.id for g, _ in parsed + [o for over in overrides for o in over]
            if g is not None for n in ast.walk(g) if isinstance(n, ast.Name) and n.id in sizes
        })  # fmt: skip
        if not used or len(used) > 2:
            continue
        guards = [(g, h) for g, h in parsed if g is not None and _reads(g, used)]
        recorded = [_recorded(sizes[v], base_args) for v in used]
        best = _size_reaching(guards, used, constants, recorded, overrides)
        if best is not None:  # a size some recorded call has already makes no new call
            out += [
                (*sizes[v], size)
                for v, size, had in zip(used, best, recorded, strict=True)
                if size not in had
            ]
    return list(dict.fromkeys(out))


def _overrides(root: ts.Node, code: str, at: int, guards: list) -> list[list]:
    """The guards of each later assignment to the variable a site's value is assigned to
    (`spec = {kernel, ...}` then `if (...) spec = {other, ...}`), less those the site shares."""
    node = root.descendant_for_byte_range(at, at)
    while node is not None and node.type not in (
        "assignment_expression", "init_declarator", "function_definition"
    ):  # fmt: skip
        node = node.parent
    if node is None or node.type == "function_definition":
        return []
    side = "left" if node.type == "assignment_expression" else "declarator"
    var = _text(code, node.child_by_field_name(side)).strip()
    body = node
    while body is not None and body.type != "function_definition":
        body = body.parent
    if not re.fullmatch(r"\w+", var) or body is None:
        return []
    shared = {(ast.dump(g), h) for g, h in guards if g is not None}
    out = []
    for m in re.finditer(rf"\b{var}\s*=(?!=)", code[node.end_byte : body.end_byte]):
        where = node.end_byte + m.start()
        mine = [(_python(c), h) for c, h in _guards(root, code, where)]
        out.append([(g, h) for g, h in mine if g is None or (ast.dump(g), h) not in shared])
    return out


def _maybe(node: ast.AST | None, env: dict[str, int]) -> bool | None:
    """A guard's truth in three values: None where it reads something not known here."""
    if node is None:
        return None
    if isinstance(node, ast.BoolOp):
        parts = [_maybe(v, env) for v in node.values]
        decisive = isinstance(node.op, ast.Or)  # True decides an `or`, False an `and`
        if decisive in parts:
            return decisive
        return None if None in parts else not decisive
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _maybe(node.operand, env)
        return None if inner is None else not inner
    try:
        return bool(_value(node, env))
    except (_Invalid, RecursionError):
        return False
    except _Unknown:
        return None


def _overridden(overrides: list[list], env: dict[str, int]) -> bool:
    """Whether a later assignment may take the variable over: none of its guards is false."""
    return any(_reaches(over, env) for over in overrides)


def _reaches(guards: list[tuple[ast.AST, bool]], env: dict[str, int]) -> bool:
    """Whether no guard is false for sure at these sizes (one on a stride or a flag may hold,
    where the sizes alone decide it the value counts; a division by zero is false)."""
    return all(_maybe(g, env) is not (not holds) for g, holds in guards)


def _size_reaching(
    guards: list[tuple[ast.AST, bool]],
    used: list[str],
    constants: dict,
    recorded: list[list],
    overrides: list[list] = (),
) -> tuple[int, ...] | None:
    """The sizes (one per name in `used`) that meet every guard, nearest the largest recorded
    ones in ratio; None when no guard can be read, no size meets them, or a recorded call
    meets them already (it launches the kernel)."""

    def env(values) -> dict[str, int]:
        return {**constants, **dict(zip(used, values, strict=True))}

    def reaches(values) -> bool:
        return _reaches(guards, env(values)) and not _overridden(overrides, env(values))

    calls = [c for c in zip(*recorded, strict=True) if None not in c]
    if not (guards or overrides) or any(reaches(c) for c in calls):
        return None
    readable = guards + [(g, h) for over in overrides for g, h in over if g is not None]
    tries = [_candidates(readable, constants, [s for s in r if s]) for r in recorded]
    typical = [max((s for s in r if s), default=1) for r in recorded]

    def distance(vs) -> float:
        return sum(abs(math.log(v / t)) for v, t in zip(vs, typical, strict=True))

    return next((vs for vs in sorted(itertools.product(*tries), key=distance) if reaches(vs)), None)


def _reads(guard: ast.AST, used: list[str]) -> bool:
    """Whether a guard reads one of the sizes (the others say nothing about them)."""
    return any(isinstance(n, ast.Name) and n.id in used for n in ast.walk(guard))


def _recorded(where: tuple[int, int], base_args: list[list]) -> list[int | None]:
    """The size of that dimension in each base call (None where it has none)."""
    i, dim = where
    out = []
    for args in base_args:
        a = args[i] if i < len(args) else None
        ok = hasattr(a, "dim") and -a.dim() <= dim < a.dim()
        out.append(int(a.shape[dim]) if ok else None)
    return out


def resized(args: list, i: int, dim: int, size: int, limit: int) -> list | None:
    """The call with dimension `dim` of argument `i` made `size` long, and every tensor
    dimension of the same length with it (see the module's docstring); None where that is
    not sound: an integer argument holds the length, it is under 3 (too many axes share
    it), or a tensor would grow past `limit` elements."""
    import torch

    old = int(args[i].shape[dim])
    if old < 3 or old == size:
        return None
    grows = -(-size // old) + 1  # the most any tensor grows: each axis of that length
    if any(isinstance(a, torch.Tensor) and a.numel() * grows**2 > limit for a in args):
        return None
    if any(isinstance(a, int) and not isinstance(a, bool) and a == old for a in args):
        return None
    out = []
    for a in args:
        if not isinstance(a, torch.Tensor) or a.dim() == 0:
            out.append(a)
            continue
        for e in range(a.dim()):
            n = int(a.shape[e])
            if n == old:
                a = _stretch(a, e, old, size)
            elif e == a.dim() - 1 and n % old == 0 and n // old >= 2:
                grouped = a.reshape(*a.shape[:-1], n // old, old)
                a = _stretch(grouped, e + 1, old, size).reshape(*a.shape[:-1], n // old * size)
        if a.numel() > limit:
            return None
        out.append(a)
    return out


def _stretch(a, dim: int, old: int, size: int):
    """`a` with dimension `dim` (of length `old`) repeated cyclically to `size`."""
    import torch

    index = torch.arange(size) % old
    out = a.index_select(dim, index)
    if out.is_floating_point():
        scale = 1 + (torch.arange(size) // old).to(out.dtype) / 2
        out = out * scale.reshape([-1 if d == dim else 1 for d in range(out.dim())])
    return out.contiguous()
