"""Everything a kernel's device code needs, found by name inside its include closure only.

A worklist follows the names a kernel uses to the items that define them (functions, types,
macros, constants, aliases), then the names those use, and so on. Lookup is restricted to the
items the simulated preprocessor saw for the kernel's file: research on mmcv showed that
searching the whole repository pulls in the wrong `max`, `Point` or `EPS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from miner.filemodel import Item
from miner.linearize import Entry, ExternalInclude, Linear

TORCH_NAMES = frozenset(
    """
at c10 torch Half BFloat16 PackedTensorAccessor PackedTensorAccessor32
PackedTensorAccessor64 GenericPackedTensorAccessor RestrictPtrTraits DefaultPtrTraits
TensorAccessor TORCH_CHECK AT_ASSERT AT_ERROR C10_HOST_DEVICE C10_DEVICE C10_HOST
C10_LAUNCH_BOUNDS_0 C10_LAUNCH_BOUNDS_1 C10_LAUNCH_BOUNDS_2 C10_WARP_SIZE gpuAtomicAdd
gpuAtomicMax gpuAtomicMin fastAtomicAdd acc_type opmath_type ScalarType
C10_CUDA_KERNEL_LAUNCH_CHECK CUDA_KERNEL_ASSERT
""".split()
)
LIBRARY_NAMESPACES = frozenset({"std", "cooperative_groups", "nvcuda", "cub", "thrust", "cuda"})
_WORD = re.compile(r"[A-Za-z_]\w*")


@dataclass
class Closure:
    entries: list[Entry]  # selected items in compiler order (the kernel included)
    externals: list[ExternalInclude]
    needs_torch: bool
    torch_names: set[str] = field(default_factory=set)
    ambiguous: dict[str, int] = field(default_factory=dict)  # name → number of definitions
    from_tu: str = ""  # the translation unit that supplied missing context, if any


def name_index(linear: Linear) -> dict[str, list[int]]:
    index = getattr(linear, "_index", None)
    if index is None:
        index = {}
        for i, entry in enumerate(linear.entries):
            for key in (*entry.item.names, *entry.item.keys):
                index.setdefault(key, []).append(i)
        linear._index = index  # type: ignore[attr-defined]
    return index


def _eligible(item: Item, kernel: Item) -> bool:
    if item is kernel:
        return True
    if kernel.kind != "kernel":  # a host launcher: every kernel it names comes along
        return item.kind != "other"
    if item.kind == "kernel":
        # a specialization needs its primary template; nothing else needs another kernel
        return bool(kernel.spec) and not item.spec and item.names == kernel.names
    if item.kind == "decl" and kernel.names and item.names == kernel.names:
        return False
    return item.kind not in ("other",)


def _entries_named(linear: Linear, index: dict[str, list[int]], name: str) -> list[int]:
    """The entries defining `name`; for `PREFIX*` / `*SUFFIX` (a name a macro pastes together,
    miner.treewalk.pasted_refs), the macros defining any name of that prefix or suffix."""
    if not name.startswith("*") and not name.endswith("*"):
        return index.get(name, [])
    part = name.strip("*")
    return [
        i
        for key, hits in index.items()
        if (key.startswith(part) if name.endswith("*") else key.endswith(part))
        for i in hits
        if linear.entries[i].item.kind == "macro"
    ]


def _select(
    linear: Linear,
    seeds: set[str],
    kernel: Item,
    limit: int | None = None,
    exclude: frozenset[int] = frozenset(),
) -> set[int]:
    index = name_index(linear)
    chosen: set[int] = set()
    seen: set[str] = set()
    queue = list(seeds)
    while queue:
        name = queue.pop()
        if name in seen:
            continue
        seen.add(name)
        for i in _entries_named(linear, index, name):
            if i in chosen or (limit is not None and i >= limit):
                continue
            entry = linear.entries[i]
            if not _eligible(entry.item, kernel) or id(entry.item) in exclude:
                continue
            chosen.add(i)
            queue.extend(entry.item.refs - seen)
            for guard in entry.guards:
                queue.extend(set(_WORD.findall(guard)) - seen)
    return chosen


def compute_closure(
    kernel: Item,
    linear: Linear,
    tu_linear: Linear | None = None,
    exclude: frozenset[int] = frozenset(),
) -> Closure:
    """Select the entries of `linear` that `kernel` needs; `tu_linear` supplies the context a
    header kernel inherits from the translation unit that includes it. `exclude` holds ids of
    items proven unused (see disambiguate)."""
    k_index = next((i for i, e in enumerate(linear.entries) if e.item is kernel), None)
    seeds = set(kernel.refs)
    chosen = _select(linear, seeds | set(kernel.names), kernel, exclude=exclude)
    if k_index is not None:
        chosen.add(k_index)
    entries = [linear.entries[i] for i in sorted(chosen)]
    defined = {n for e in entries for n in e.item.names}
    used = set().union(*(e.item.refs for e in entries)) if entries else set()
    from_tu = ""
    if tu_linear is not None and tu_linear.root != linear.root:
        limit = tu_linear.include_offsets.get(linear.root)
        missing = used - defined
        extra = _select(tu_linear, missing, kernel, limit, exclude)
        extra_entries = [
            tu_linear.entries[i]
            for i in sorted(extra)
            if tu_linear.entries[i].item not in {e.item for e in entries}
        ]
        if extra_entries:
            from_tu = tu_linear.root
            entries = extra_entries + entries
            defined |= {n for e in extra_entries for n in e.item.names}
            used |= set().union(*(e.item.refs for e in extra_entries))
    namespaces = {ns for e in entries for ns in e.item.namespace}
    torch_names = (used - defined) & TORCH_NAMES
    needs_torch = bool(torch_names) or kernel.kind != "kernel"  # host code: torch is there
    # using-directives matter only for namespaces the unit actually has
    wanted_ns = namespaces | LIBRARY_NAMESPACES | ({"at", "torch", "c10"} if needs_torch else set())
    usings = [
        e
        for e in (
            tu_linear.entries[: tu_linear.include_offsets.get(linear.root, 0)]
            if from_tu and tu_linear
            else []
        )
        + linear.entries
        if e.item.kind == "using_ns" and e.item.target.split("::")[0] in wanted_ns
    ]
    entries = _merge_in_order(entries, usings, linear, tu_linear if from_tu else None)
    if kernel.kind == "kernel":
        externals = _externals(entries, linear, tu_linear if from_tu else None)
    else:  # host code calls APIs (at::cuda::...) by names no item defines: keep every include
        externals = list(dict.fromkeys(linear.externals))
    ambiguous = _ambiguous(entries)
    return Closure(entries, externals, needs_torch, torch_names, ambiguous, from_tu)


def _merge_in_order(
    entries: list[Entry], usings: list[Entry], linear: Linear, tu_linear: Linear | None
) -> list[Entry]:
    order: dict[int, int] = {}
    base = 0
    if tu_linear is not None:
        for i, e in enumerate(tu_linear.entries):
            order.setdefault(id(e.item), i)
        base = len(tu_linear.entries)
    for i, e in enumerate(linear.entries):
        order.setdefault(id(e.item), base + i)
    merged = {id(e.item): e for e in [*entries, *usings]}
    return sorted(merged.values(), key=lambda e: order.get(id(e.item), 1 << 30))


def _externals(
    entries: list[Entry], linear: Linear, tu_linear: Linear | None
) -> list[ExternalInclude]:
    files = {e.item.file for e in entries}
    out, seen = [], set()
    for ext in (tu_linear.externals if tu_linear else []) + linear.externals:
        if ext.from_file in files and (ext.header, ext.guards) not in seen:
            seen.add((ext.header, ext.guards))
            out.append(ext)
    return out


def _ambiguous(entries: list[Entry]) -> dict[str, int]:
    """Function names defined in two places (files or namespaces) of the unit: same-named
    helpers from different headers. Overloads side by side in one file stay together."""
    places: dict[str, set[tuple]] = {}
    count: dict[str, int] = {}
    for e in entries:
        if e.item.kind in ("function", "decl") and e.item.names:
            n = e.item.names[0]
            places.setdefault(n, set()).add((e.item.namespace, e.item.file))
            count[n] = count.get(n, 0) + 1
    return {n: count[n] for n, p in places.items() if len(p) > 1}


_ONE_DEFINITION = frozenset({"variable", "typedef", "using"})  # no second one in a file


def _defines(item: Item) -> tuple | None:
    return (item.kind, item.names, item.namespace) if item.kind in _ONE_DEFINITION else None


def link_before(closure: Closure, other: Closure, root: Item) -> None:
    """Join `other`'s entries (another translation unit's link-time definitions) right before
    `root`, each once, and its includes; at the end when `root` is not there. A variable or
    type alias each unit defines for itself (OpenPCDet's `const int THREADS_PER_BLOCK_NMS` in
    the .cpp and the .cu: internal linkage, one per unit) is defined once in the joined file."""
    have = {id(e.item) for e in closure.entries}
    defined = {_defines(e.item) for e in closure.entries} - {None}
    extra = [
        e
        for e in other.entries
        if id(e.item) not in have and (_defines(e.item) is None or _defines(e.item) not in defined)
    ]
    at = next((i for i, e in enumerate(closure.entries) if e.item is root), len(closure.entries))
    closure.entries[at:at] = extra
    closure.externals += [x for x in other.externals if x not in closure.externals]
