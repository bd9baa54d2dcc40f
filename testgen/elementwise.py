"""Whether a host function treats every tensor it takes as n elements, read from its code.

An op no test calls gets inputs by rule only where any call is valid. kminer's own rule
wrappers are such by construction (every pointer n elements). A repository's host function is
too when its code uses each tensor only as a count and a data pointer: SparseConvNet's
`LeakyReLU_updateOutput(input_features, output_features, alpha)` resizes the output as the
input, takes `input_features.numel()` as n and hands the data pointers to a kernel; nothing
reads a size, a stride or a dimension, so tensors of any n elements are a valid call. The
function is followed, by its arguments, into the repository functions it passes the tensors to
(the CUDA one of a device dispatch; the CPU branch is no part of the label's contract). Floating
tensors only: an integer tensor may hold indices, which no rule can make valid.
"""

from __future__ import annotations

import re

from miner.textprep import blank_comments_and_strings, bracket_end, split_top

DEPTH = 3
# what may follow a tensor's name: its count, its data pointer, where it lives, a resize to
# another tensor's shape, a fill
_USE = re.compile(
    r"\s*(?:\.|->)\s*(?P<m>numel|data_ptr|data|resize_as_|zero_|fill_|device|is_cuda|options|"
    r"scalar_type|type|get_device|is_contiguous|dtype)\b"
)
_POINTER = re.compile(r"\s*(?:\.|->)\s*(?:data_ptr|data)\s*<\s*([\w:]+)\s*>")
_CPU = re.compile(r"cpu", re.IGNORECASE)
_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "decltype", "static_cast"}
_FLOAT_TYPES = {"float", "double", "T", "scalar_t", "half", "at::Half", "__half", "real"}


def _definition(code: str, name: str) -> tuple[str, str] | None:
    """(parameter list, body) of the first definition of `name` in the text."""
    for m in re.finditer(rf"(?<![\w:.>]){re.escape(name)}\s*\(", code):
        close = bracket_end(code, m.end() - 1, "(", ")")
        if close is None:
            continue
        rest = code[close:].lstrip()
        if not rest.startswith("{"):
            continue
        start = close + code[close:].index("{")
        end = bracket_end(code, start, "{", "}")
        if end is not None:
            return code[m.end() : close - 1], code[start:end]
    return None


def _param_names(params: str) -> list[str]:
    names = []
    for p in split_top(params):
        m = re.search(r"([A-Za-z_]\w*)\s*(?:=.*)?$", p.strip())
        names.append(m.group(1) if m else "")
    return names


def _calls(body: str):
    """(callee, argument texts) of each call in a body."""
    for m in re.finditer(r"(?<![\w.>])([A-Za-z_][\w:]*)\s*(?:<[^;{}()]*>)?\s*\(", body):
        close = bracket_end(body, m.end() - 1, "(", ")")
        if close is not None and m.group(1) not in _KEYWORDS:
            args = [a.strip() for a in split_top(body[m.end() : close - 1])]
            yield m.group(1).split("::")[-1], args


def _check(code: str, name: str, tensors: list[str], depth: int, found: dict) -> bool:
    """Whether `name`'s body uses its parameters `tensors` as n elements; the element type
    of each one's data pointer goes into `found` (by parameter name)."""
    defined = _definition(code, name)
    if defined is None:
        return False
    params, body = defined
    names = _param_names(params)
    watched = [n for n in names if n in tensors]
    passed = {}  # tensor name -> [(callee, argument position)]
    for callee, args in _calls(body):
        for i, a in enumerate(args):
            if a in watched:
                passed.setdefault(a, []).append((callee, i))
    for tensor in watched:
        for m in re.finditer(rf"(?<![\w.]){re.escape(tensor)}\b", body):
            if _USE.match(body, m.end()) is not None:
                pointer = _POINTER.match(body, m.end())
                if pointer:
                    found[tensor] = pointer.group(1)
                continue
            before = body[: m.start()].rstrip()
            if before.endswith("resize_as_(") or re.search(r"\b[A-Z][A-Z0-9_]*\($", before):
                continue  # resized like it, or checked by a macro (CHECK_CUDA(x))
            after = body[m.end() :].lstrip()[:1]
            if not (before[-1:] in ("(", ",") and after in (",", ")")):
                return False  # a size, a stride, an index, an expression: not n elements
    for tensor, uses in passed.items():
        for callee, i in uses:
            if callee == "resize_as_" or callee.isupper() or _CPU.search(callee):
                continue
            if depth <= 0:
                return False
            inner: dict = {}
            callee_def = _definition(code, callee)
            if callee_def is None:
                return False
            callee_names = _param_names(callee_def[0])
            if i >= len(callee_names):
                return False
            if not _check(code, callee, [callee_names[i]], depth - 1, inner):
                return False
            if callee_names[i] in inner:
                found.setdefault(tensor, inner[callee_names[i]])
    return True


_DTYPES = {"double": "float64", "half": "float16", "Half": "float16", "__half": "float16"}


def elementwise_tensors(label_text: str, function: str, tensors: list[str]) -> dict | None:
    """{tensor parameter: dtype name} when the label's `function` uses every one of `tensors`
    as n floating elements (a count, a data pointer, a resize to another's shape); else None.
    A template element type (`data_ptr<T>`) is float32: the plan adds the label's others."""
    code = blank_comments_and_strings(label_text)
    if not tensors or "numel" not in code:
        return None
    found: dict = {}
    if not _check(code, function, tensors, DEPTH, found):
        return None
    types = {t: found.get(t, "T").split("::")[-1] for t in tensors}
    if not all(ty in _FLOAT_TYPES | {"Half"} for ty in types.values()):
        return None
    return {t: _DTYPES.get(ty, "float32") for t, ty in types.items()}
