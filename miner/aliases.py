"""Qualifier macros (`#define GLOBAL __global__`, `HOST_DEVICE`, launch-bound macros).

tree-sitter does not preprocess, so a kernel written `GLOBAL void k()` or a helper written
`HOST_DEVICE_INLINE float f()` would parse as a type followed by garbage. The repository's own
defines tell what such names mean; we substitute their CUDA-side expansion before parsing and
map every offset back, so spans and line numbers still point at the original text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from miner.filemodel import QUALIFIER_TOKENS
from miner.textprep import Rewrite, RewrittenText

DEFINE_LINE = re.compile(
    r"^[ \t]*#[ \t]*define[ \t]+(?P<name>[A-Za-z_]\w*)(?P<params>\([^)\n]*\))?"
    r"(?P<body>(?:[^\n\\]|\\.|\\\n)*)",
    re.MULTILINE,
)


def define_scope_end(code: str, define: re.Match) -> int:
    """Where the macro a `DEFINE_LINE` match defines stops holding: the next `#define` or
    `#undef` of its name (SparseConvNet defines `FOO` anew before each function that expands
    it), else the end of the text."""
    name = re.escape(define.group("name"))
    again = re.compile(rf"^[ \t]*#[ \t]*(?:define|undef)[ \t]+{name}\b", re.MULTILINE)
    found = again.search(code, define.end())
    return found.start() if found is not None else len(code)


# a pointer qualifier a macro may stand for (pytorch3d's `#define RESTRICT __restrict__`): left
# as a bare name, `float const* const RESTRICT grad_im` parsed as two parameters
_ALIAS_TOKENS = QUALIFIER_TOKENS | {"__restrict__", "__restrict"}
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^()]*(?:\([^()]*\)[^()]*)*\)")
_TOKEN = re.compile(r"[A-Za-z_]\w*|\S")

# Macros from headers outside the repository (torch, CUTLASS, CuTe, Eigen) that act as qualifiers.
KNOWN_QUALIFIERS = {
    "C10_HOST_DEVICE": "__host__ __device__",
    "C10_DEVICE": "__device__",
    "C10_HOST": "__host__",
    "C10_ALWAYS_INLINE": "inline",
    "CUTLASS_HOST_DEVICE": "__forceinline__ __host__ __device__",
    "CUTLASS_DEVICE": "__forceinline__ __device__",
    "CUTLASS_GLOBAL": "__global__",
    "CUTE_HOST_DEVICE": "__forceinline__ __host__ __device__",
    "CUTE_DEVICE": "__forceinline__ __device__",
    "CUTE_HOST": "__forceinline__ __host__",
    "EIGEN_DEVICE_FUNC": "__host__ __device__",
    "EIGEN_STRONG_INLINE": "inline",
    "EIGEN_ALWAYS_INLINE": "inline",
}
KNOWN_BLANKED_CALLS = {
    "C10_LAUNCH_BOUNDS_0",
    "C10_LAUNCH_BOUNDS_1",
    "C10_LAUNCH_BOUNDS_2",
    "__align__",
}


@dataclass
class QualifierAliases:
    """name → CUDA-side expansion, plus function-like macros that only add launch bounds."""

    object_like: dict[str, str] = field(default_factory=dict)
    blanked_calls: set[str] = field(default_factory=set)

    @property
    def global_aliases(self) -> set[str]:
        return {n for n, exp in self.object_like.items() if "__global__" in exp.split()}

    def rewrite(self, text: str, code: str) -> RewrittenText | None:
        """Substitute aliases in `text` (using `code`, the blanked view, to find real uses)."""
        names = set(self.object_like) | self.blanked_calls
        if not names or not any(n in code for n in names):
            return None
        edits: list[tuple[int, int, str]] = []
        for m in re.finditer(r"\b[A-Za-z_]\w*\b", code):
            word = m.group(0)
            if word not in names or _in_directive_name(code, m.start()):
                continue
            if word in self.object_like:
                edits.append((m.start(), m.end(), self.object_like[word]))
            else:
                end = _call_end(code, m.end())
                if end is not None:
                    edits.append((m.start(), end, " "))
        if not edits:
            return None
        return Rewrite(text, edits).apply()


def _in_directive_name(code: str, pos: int) -> bool:
    line_start = code.rfind("\n", 0, pos) + 1
    prefix = code[line_start:pos]
    return bool(re.match(r"\s*#\s*(define|undef|ifdef|ifndef)\s+$", prefix)) or bool(
        re.search(r"defined\s*\(?\s*$", prefix)
    )


def _call_end(code: str, pos: int) -> int | None:
    i = pos
    while i < len(code) and code[i] in " \t":
        i += 1
    if i >= len(code) or code[i] != "(":
        return None
    depth = 0
    for j in range(i, min(len(code), i + 2000)):
        if code[j] == "(":
            depth += 1
        elif code[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


def _expansion(body: str, known: dict[str, str]) -> str | None:
    """The qualifier list a macro body stands for, or None if it is anything else."""
    body = _LAUNCH_BOUNDS.sub(" ", body.replace("\\\n", " "))
    words = _TOKEN.findall(body)
    if not words:
        return ""
    out: list[str] = []
    for w in words:
        if w in _ALIAS_TOKENS:
            out.append(w)
        elif w in known:
            out.append(known[w])
        else:
            return None
    return " ".join(out)


def collect_aliases(codes: list[str]) -> QualifierAliases:
    """Learn qualifier macros from every `#define` of the repository (blanked texts)."""
    object_defs: dict[str, list[str | None]] = {}
    call_defs: dict[str, list[bool]] = {}
    for code in codes:
        if "define" not in code:
            continue
        for m in DEFINE_LINE.finditer(code):
            name, params, body = m.group("name"), m.group("params"), m.group("body")
            if params is not None:
                only_bounds = bool(_LAUNCH_BOUNDS.search(body)) and _expansion(body, {}) == ""
                call_defs.setdefault(name, []).append(only_bounds)
            else:
                object_defs.setdefault(name, []).append(body)
    known = dict(KNOWN_QUALIFIERS)
    result: dict[str, str] = {}
    for _ in range(4):  # aliases of aliases
        changed = False
        for name, bodies in object_defs.items():
            expansions = [_expansion(b, known) for b in bodies]
            if any(e is None for e in expansions):
                continue
            nonempty = [e for e in expansions if e]
            if not nonempty:
                continue
            best = max(nonempty, key=lambda e: ("__global__" in e, "__device__" in e, len(e)))
            if result.get(name) != best:
                result[name] = known[name] = best
                changed = True
        if not changed:
            break
    for name, exp in KNOWN_QUALIFIERS.items():
        result.setdefault(name, exp)
    blanked = {n for n, flags in call_defs.items() if flags and all(flags)} | KNOWN_BLANKED_CALLS
    return QualifierAliases(result, blanked)
