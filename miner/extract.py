"""From discovered kernels to standalone units: linearize, close over names, render.

One `Extractor` serves a whole repository so that each translation unit is linearized once and
shared by every kernel it holds (mmcv: 152 kernels in 57 files).
"""

from __future__ import annotations

from dataclasses import dataclass

from miner.closure import Closure, compute_closure
from miner.disambiguate import used_lines
from miner.includes import IncludeResolver
from miner.launches import include_graph, reachable
from miner.linearize import Linearizer
from miner.repo_model import Discovery, FoundKernel
from miner.textprep import split_top
from miner.unit import RenderedUnit, render_unit

TU_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")


def including_unit(
    graph: dict[str, set[str]],
    reach: dict[str, set[str]],
    file: str,
    preferred: list[str] = (),
    allowed=lambda source: True,
) -> str | None:
    """The first source (of `preferred`, then any `allowed` one) that compiles `file` by
    `#include` (SparseConvNet's CUDA/*.cu inside cuda.cu, its CPU/*.cpp inside
    sparseconvnet_cpu.cpp); `reach` caches what each source reaches."""
    files = [f for f in preferred if f.endswith(TU_SUFFIXES)]
    files += sorted(f for f in graph if f.endswith(TU_SUFFIXES))
    for f in dict.fromkeys(files):
        if f != file and allowed(f) and file in reachable(graph, f, reach):
            return f
    return None


@dataclass
class Extracted:
    closure: Closure
    unit: RenderedUnit
    pruned: int = 0  # same-named definitions libclang showed the kernel never reaches
    too_deep: str = ""  # an include chain past the depth any compiler would follow


class Extractor:
    def __init__(self, disc: Discovery) -> None:
        self.disc = disc
        self.resolver = IncludeResolver(list(disc.models))
        self.linearizer = Linearizer(disc.models, self.resolver, cuda_switches=True)
        self.graph = include_graph(disc.models, self.resolver)
        self._reach: dict[str, set[str]] = {}

    def translation_unit(self, kernel: FoundKernel) -> str | None:
        """The source file that compiles this kernel's file when it is not compiled alone: for a
        header, a launching TU if there is one; for a `.cu` that another source `#include`s
        (SparseConvNet's CUDA/*.cu inside cuda.cu), that source, whose earlier includes and
        typedefs the kernel's code relies on. None: the kernel's file is its own TU."""
        sites = self.disc.launches.get(id(kernel.kdef), [])
        return self.including_unit(kernel.file, [s.file for s in sites])

    def including_unit(self, file: str, preferred: list[str] = ()) -> str | None:
        """The first source (of `preferred`, then any) that compiles `file` by `#include`."""
        return including_unit(self.graph, self._reach, file, preferred)

    def context_linear(self, file: str):
        """The linear view of the source that includes `file`, or None (see including_unit)."""
        tu = self.including_unit(file)
        return self.linearizer.linear(tu) if tu else None

    def extract(self, kernel: FoundKernel, header: str) -> Extracted:
        linear = self.linearizer.linear(kernel.file)
        tu = self.translation_unit(kernel)
        tu_linear = self.linearizer.linear(tu) if tu else None
        item = kernel.kdef.item
        closure = compute_closure(item, linear, tu_linear)
        site_args = [
            split_top(s.template_args)
            for s in self.disc.launches.get(id(kernel.kdef), [])
            if s.template_args
        ]
        unit = render_unit(kernel.kdef, closure, self.disc.models, header, site_args)
        too_deep = linear.too_deep or (tu_linear.too_deep if tu_linear else "")
        unused = self.unused_definitions(kernel, closure, unit) if closure.ambiguous else set()
        if not unused:
            return Extracted(closure, unit, too_deep=too_deep)
        closure = compute_closure(item, linear, tu_linear, frozenset(unused))
        unit = render_unit(kernel.kdef, closure, self.disc.models, header, site_args)
        return Extracted(closure, unit, len(unused), too_deep)

    def unused_definitions(
        self, kernel: FoundKernel, closure: Closure, unit: RenderedUnit
    ) -> set[int]:
        """ids of same-named definitions the kernel provably never reaches (libclang)."""
        if closure.needs_torch:
            return set()
        spans = dict(zip((id(e.item) for e in closure.entries), unit.spans, strict=True))
        k_span = spans.get(id(kernel.kdef.item))
        if k_span is None:
            return set()
        used = used_lines(unit.text, kernel.kdef.name, k_span)
        if used is None:
            return set()
        unused: set[int] = set()
        for name in closure.ambiguous:
            if name.startswith("operator"):  # an overload is chosen by the types it takes, which
                continue  # the closure matched; libclang missed pytorch3d's `a.cam == b.cam`
            defs = [
                e
                for e in closure.entries
                if e.item.kind in ("function", "decl") and e.item.names[:1] == (name,)
            ]
            reached = [
                e for e in defs if any(a <= ln <= b for ln in used for a, b in [spans[id(e.item)]])
            ]
            if reached and len(reached) < len(defs):
                unused |= {id(e.item) for e in defs if e not in reached}
        return unused
