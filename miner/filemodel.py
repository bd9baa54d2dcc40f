"""The model of one source file: its top-level items, preprocessor structure and kernels.

Everything later (kernel discovery, launch sites, dependency closure) reads this model instead
of walking trees again; `treewalk` builds it from one tree-sitter parse. Bodies stay text spans,
and the names a span uses come from one regex over the comment-free text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from miner.textprep import IDENT, LineIndex

CPP_KEYWORDS = frozenset(
    """
alignas alignof and asm auto bool break case catch char char16_t char32_t class const
constexpr const_cast continue decltype default delete do double dynamic_cast else enum
explicit export extern false float for friend goto if inline int long mutable namespace
new noexcept not nullptr operator or private protected public register reinterpret_cast
return short signed sizeof static static_assert static_cast struct switch template this
throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t
while defined include define ifdef ifndef endif elif undef pragma once __global__
__device__ __host__ __forceinline__ __noinline__ __shared__ __constant__ __managed__
__restrict__ __launch_bounds__ __inline__ __align__ __grid_constant__
""".split()
)

QUALIFIER_TOKENS = frozenset(
    {
        "__global__",
        "__device__",
        "__host__",
        "__forceinline__",
        "__noinline__",
        "__inline__",
        "inline",
        "static",
        "extern",
        "__shared__",
        "__constant__",
        "__managed__",
        "constexpr",
    }
)


@dataclass(eq=False)
class Item:
    """A top-level declaration or definition, with the names it defines and uses."""

    kind: str  # kernel function type variable typedef using using_ns ns_alias macro decl other
    names: tuple[str, ...]
    file: str
    start: int  # offsets into the file's original text
    end: int
    line: int
    namespace: tuple[str, ...] = ()
    refs: frozenset[str] = frozenset()
    device: bool = False  # __device__ / __global__ / __host__ __device__ / constexpr data
    target: str = ""  # using_ns: the namespace; decl of a kernel: its name
    spec: str = ""  # kernel: template arguments of an explicit specialization
    keys: tuple[str, ...] = ()  # extra lookup names (operators: the types of their signature)
    seq: int = 0  # position in the file, for stable ordering
    override: str = ""  # text to emit instead of the span (a kernel expanded from a macro)

    def source(self, file_text: str) -> str:
        return self.override or file_text[self.start : self.end]


@dataclass
class Define:
    name: str
    params: list[str] | None
    body: str
    item: Item


@dataclass
class Undef:
    name: str


@dataclass
class Include:
    path: str
    angle: bool
    line: int


@dataclass
class PragmaOnce:
    pass


@dataclass
class Cond:
    """#if/#ifdef chain: [(directive, condition text, events)], #else has directive 'else'."""

    branches: list[tuple[str, str, list]]
    line: int


@dataclass
class KernelDef:
    name: str
    namespace: tuple[str, ...]
    start: int  # original offsets, template<...> included
    end: int
    global_offset: int  # offset of the __global__ (or alias) token
    params: list[tuple[str, str, str]]  # (type, name, text)
    template_params: list[dict]
    specialization: str
    qualifiers: list[str]
    item: Item
    has_error: bool = False


@dataclass
class FileModel:
    rel: str
    text: str  # original, latin-1 view
    code: str  # comments and literals blanked, same length as text
    events: list = field(default_factory=list)
    kernels: list[KernelDef] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)  # flat, in source order
    excluded_spans: list[tuple[int, int, str]] = field(default_factory=list)  # decl/inst spans
    error_count: int = 0
    lines: LineIndex | None = None


# `std::optional`, `std::chrono::seconds`: names the standard library defines, never the
# repository's own (a vendored header-only library defines `optional` and `nullopt` too)
_STD_QUALIFIED = re.compile(r"\bstd\s*::\s*(?:[A-Za-z_]\w*\s*::\s*)*[A-Za-z_]\w*")
# a macro spelled where a member's name goes (`x.DATA_PTR<float>()`, a compat header's
# `#define DATA_PTR data_ptr`): the preprocessor expands it all the same; only macro-style
# names are taken, so a member `size()` never pulls in a function of that name
_MEMBER_MACRO = re.compile(r"(?:\.|->)\s*([A-Z_][A-Z0-9_]*[A-Z][A-Z0-9_]*)\b")


def refs_in(code: str, start: int, end: int) -> frozenset[str]:
    text = code[start:end]
    if "std" in text:
        text = _STD_QUALIFIED.sub(" std ", text)
    found = set(IDENT.findall(text))
    if "." in text or "->" in text:
        found.update(_MEMBER_MACRO.findall(text))
    return frozenset(found) - CPP_KEYWORDS
