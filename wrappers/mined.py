"""The repository's own launcher as the wrapper: the host function that launches the kernel.

From a kernel's launch sites we take the enclosing host function. If pybind can bind its
signature we expose it as is; otherwise we climb to the functions that call it (mmcv: the
`*_cuda` wrappers over `...KernelLauncher`, spconv: the `...Launcher` over a functor) until one
can be bound. The label holds the closure of that function: launcher, kernels, helpers and the
repository's own torch includes, exactly as the repository compiles them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from miner.aliases import DEFINE_LINE, define_scope_end
from miner.closure import Closure, compute_closure, link_before
from miner.device_tests import one_side, swapped
from miner.extract import Extractor
from miner.filemodel import Item
from miner.repo_model import Discovery, FoundKernel
from miner.sources import GPU_SOURCE
from miner.specializations import fill_defaults, link_specializations
from miner.unit import render_host_code
from wrappers.adapter import adapt, aliases
from wrappers.bound_class import BoundClass, bound_classes, method_adapter, method_signature
from wrappers.label import Exposed, with_wrapper_includes
from wrappers.signature import Signature, bindable, bindable_type, parse_signature

SITE_PREFERENCE = {"chevron": 0, "launch_api": 1, "address": 2, "macro": 3, "reference": 4}
TU_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx")
HOST_SUFFIXES = (*TU_SUFFIXES, ".h", ".hpp", ".cuh")


@dataclass
class MinedWrapper:
    launcher: Item  # the host code containing the launch (function or functor struct)
    exposed: list[Signature]
    includes: list[str]
    code: str
    chain: list[str] = field(default_factory=list)  # launcher → ... → exposed, by name

    enums: frozenset[str] = frozenset()

    def functions(self) -> list[Exposed]:
        return [Exposed(s.name, s.reference(self.enums)) for s in self.exposed]


def _expanded(refs: frozenset[str], macros: dict[str, frozenset[str]]) -> set[str]:
    """`refs` with the names used by the macros of the file they name, and by theirs: a host
    function that calls its launcher from a local `#define` (one call per tile size) calls it."""
    seen, todo = set(refs), [r for r in refs if r in macros]
    while todo:
        new = macros[todo.pop()] - seen
        seen |= new
        todo += [r for r in new if r in macros]
    return seen


class LauncherIndex:
    """Host functions and who calls whom, by name, over the whole repository."""

    def __init__(self, disc: Discovery) -> None:
        self.disc = disc
        self.callers: dict[str, list[Item]] = {}
        enums: set[str] = set()
        for model in disc.models.values():
            macros = {it.names[0]: it.refs for it in model.items if it.kind == "macro"}
            for item in model.items:
                if item.kind in ("type", "typedef") and item.names and _is_enum(model, item):
                    enums.add(item.names[0] if item.kind == "type" else item.names[-1])
                if item.kind in ("function", "macro_use") and not item.device:
                    for ref in _expanded(item.refs, macros):
                        self.callers.setdefault(ref, []).append(item)
        self.enums = frozenset(enums)
        code = "\n".join(m.code for m in disc.models.values())
        self.classes = bound_classes(code, aliases(code)) if "py::class_" in code else {}

    def method(self, item: Item) -> tuple[BoundClass, Signature] | None:
        """The bound class and plain signature of a method defined outside its class."""
        model = self.disc.models.get(item.file)
        if model is None or item.kind != "function" or not item.names:
            return None
        code = model.code[item.start : item.end]
        for cls in dict.fromkeys(self.classes.values()):  # each class once (two keys each)
            if cls.template in code:
                sig = method_signature(code, item.names[0], cls.template)
                if sig is not None:
                    return cls, sig
        return None

    def calls_its_own(self, caller: Item, name: str, item: Item) -> bool:
        """Whether `caller` calls another function named `name` than `item`: one defined in
        its own file (C++ finds that one; a CPU twin's helper shares the CUDA one's name)."""
        model = self.disc.models.get(caller.file)
        return model is not None and any(
            it is not item and it.kind == "function" and not it.device and it.names[:1] == (name,)
            for it in model.items
        )

    def enclosing(self, file: str, line: int) -> Item | None:
        """The top-level host item (function, or struct holding a functor) around a line."""
        model = self.disc.models.get(file)
        if model is None:
            return None
        best = None
        for item in model.items:
            if item.device or not (
                item.kind in ("function", "type", "macro_use") or _defines(model, item)
            ):
                continue
            first, last = item.line, model.lines.line(max(item.start, item.end - 1))
            if first <= line <= last and (best is None or item.start > best.start):
                best = item
        return best

    def signature(self, item: Item) -> Signature | None:
        model = self.disc.models.get(item.file)
        if not item.names or not (item.kind == "function" or _defines(model, item)):
            return None
        code = model.code[item.start : item.end]
        sig = parse_signature(code, item.names[0], item.namespace)
        if sig is not None and sig.template:
            sig.template_args = self.instantiation(item.names[0])
        return sig

    def instantiation(self, name: str) -> str:
        """Template arguments the repository itself uses for a function template: from an
        explicit instantiation or a call with constant arguments."""
        pattern = re.compile(rf"\b{re.escape(name)}\s*<([^<>;{{}}()]*)>\s*\(")
        for model in self.disc.models.values():
            if name not in model.code:
                continue
            for m in pattern.finditer(model.code):
                args = m.group(1).strip()
                if (
                    args
                    and re.fullmatch(r"[\w\s,:]+", args)
                    and not re.search(r"\b[A-Z][a-z]\w*\b|\b[a-z_]\w*_t\b|NDim|\bT\b", args)
                ):
                    return args
        return ""


def _defines(model, item: Item) -> bool:
    """A `decl` that is a function definition the grammar could not read as one: a body
    holding a macro call without its semicolon (SparseConvNet's `RULEBOOKITERATOR((k<<<...>>>
    (...)); , )`) turns `void f(...) {...}` into a declaration spanning the whole body."""
    if model is None or item.kind != "decl" or len(item.names) != 1:
        return False
    text = model.code[item.start : item.end]
    head = text.split("{", 1)[0]
    return "{" in text and text.rstrip().endswith("}") and re.search(r"\)\s*$", head) is not None


def _is_enum(model, item: Item) -> bool:
    head = model.code[item.start : item.end].split("{", 1)[0].split()
    return bool(head) and (head[0] == "enum" or head[:2] == ["typedef", "enum"])


def _home(kernel_file: str, site_file: str) -> int:
    """How much of the kernel file's name the launching file's name starts with: a kernel
    that several ops launch belongs to the op named like its file (nms_cuda_kernel.cuh is
    nms_cuda.cu's, though iou3d_cuda.cu launches it too), whose CPU twin is its reference."""
    a, b = Path(kernel_file).stem, Path(site_file).stem
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def launcher_candidates(fk: FoundKernel, disc: Discovery, index: LauncherIndex) -> list[Item]:
    sites = sorted(
        disc.launches.get(id(fk.kdef), []),
        key=lambda s: (
            SITE_PREFERENCE.get(s.kind, 9),
            not s.file.endswith(TU_SUFFIXES),
            -_home(fk.file, s.file),
        ),
    )
    found: list[Item] = []
    for site in sites:
        item = index.enclosing(site.file, site.line)
        items = [item] if item is not None else _macro_invokers(disc, index, site)
        for item in items:
            if item not in found and item is not fk.kdef.item:
                found.append(item)
    return found


def _macro_invokers(disc: Discovery, index: LauncherIndex, site) -> list[Item]:
    """The functions that invoke the macro a launch is written in (SparseConvNet's `bmd_f`
    expands `SPARSECONVNET_FOO(32, 32)`, whose body holds the `<<<...>>>`): they launch it."""
    model = disc.models.get(site.file)
    if model is None:
        return []
    for m in DEFINE_LINE.finditer(model.code):
        first, last = model.lines.line(m.start()), model.lines.line(max(m.start(), m.end() - 1))
        if first <= site.line <= last and m.group("params") is not None:
            name = m.group("name")
            callers = [c for c in index.callers.get(name, []) if c.kind == "function"]
            end = define_scope_end(model.code, m)  # defined anew or undefined: another
            scoped = [c for c in callers if c.file == site.file and m.end() <= c.start < end]
            if end < len(model.code):
                return scoped
            others = [c for c in callers if c.file != site.file]
            return scoped + nearest_first(others, site.file)
    return []


def exposed_for(
    launcher: Item, index: LauncherIndex, depth: int = 3
) -> tuple[Item, list[str]] | None:
    """The launcher itself if bindable, else the nearest bindable caller (breadth first)."""
    frontier = [(launcher, [launcher.names[0] if launcher.names else "?"])]
    seen = {id(launcher)}
    for _ in range(depth + 1):
        nxt = []
        for item, chain in frontier:
            sig = index.signature(item)
            if sig is not None and bindable(sig, index.enums):
                return item, chain
            for name in item.names[:1]:
                for caller in nearest_first(index.callers.get(name, []), launcher.file):
                    if index.calls_its_own(caller, name, item):
                        continue  # `BatchNormalization_ForwardPass` in CPU/ and in CUDA/
                    if id(caller) not in seen and caller.file.endswith(HOST_SUFFIXES):
                        seen.add(id(caller))
                        nxt.append((caller, [*chain, caller.names[0] if caller.names else "?"]))
        frontier = nxt
    return None


def unmined_why(fk: FoundKernel, extractor: Extractor, index: LauncherIndex) -> str:
    """Why no launcher of the repository could be mined: what a curator reads beside
    `needs_llm` (MinkowskiEngine's ops take a coordinate manager object Python cannot pass)."""
    launchers = list(launcher_candidates(fk, extractor.disc, index))
    if not launchers:
        return "no host function launches it"
    sig = index.signature(launchers[0])
    name = launchers[0].names[0] if launchers[0].names else "?"
    if sig is None:
        return f"its launcher {name} has no signature kminer reads"
    odd = [t for t, _ in sig.params if not bindable_type(t, index.enums)]
    if not bindable_type(sig.returns):
        odd.insert(0, sig.returns)
    if sig.template and not sig.template_args and not odd:
        return f"its launcher {name} is a template no caller instantiates where Python reaches"
    what = f" (`{' '.join(odd[0].split())[:60]}`)" if odd else ""
    return f"neither its launcher {name} nor a caller takes only what Python can pass{what}"


def nearest_first(items: list, file: str) -> list:
    """Items (callers, found kernels) sharing the longest folder prefix with `file` first (the
    same backend)."""
    here = file.split("/")

    def shared(item) -> int:
        n = 0
        for a, b in zip(here, item.file.split("/"), strict=False):
            if a != b:
                break
            n += 1
        return n

    return sorted(items, key=lambda it: (-shared(it), it.file, getattr(it, "start", 0)))


def _link_declared(closure: Closure, extractor: Extractor, root: Item, rounds: int = 3) -> None:
    """Host functions the closure calls but only declares (`void im2col_cuda(...);` from a
    header), defined in another CUDA source of the repository: their closures are linked in
    before `root`, as the linker would. Without them the label builds, then fails to import
    (undefined symbol). CPU definitions are never linked into a label."""
    models = extractor.disc.models
    for _ in range(rounds):
        have = {n for e in closure.entries if e.item.kind != "decl" for n in e.item.names}
        used = set().union(*(e.item.refs for e in closure.entries if e.item.kind != "decl"))
        wanted = {
            e.item.names[0]
            for e in closure.entries
            if e.item.kind == "decl" and e.item.names and e.item.names[0] in used - have
        }
        found = []
        for name in sorted(wanted):
            defs = [
                it
                for f, m in models.items()
                if GPU_SOURCE.search(f) and name in m.code
                for it in m.items
                if it.kind == "function" and not it.device and it.names[:1] == (name,)
            ]
            if defs:
                found.append(nearest_first(defs, root.file)[0])
        if not found:
            return
        for d in found:
            other = compute_closure(d, extractor.linearizer.linear(d.file))
            link_before(closure, other, root)


def _spans(model, item: Item) -> tuple[str, str]:
    return model.text[item.start : item.end], model.code[item.start : item.end]


def _closure(item: Item, extractor: Extractor, gpu_side: Item | None = None) -> Closure:
    """What `item` needs from its file (`gpu_side`: what of it a label keeps); a file compiled
    only inside another source gets that source's earlier context (SparseConvNet's CUDA/*.cu
    see `using Int = int32_t;` there)."""
    linear = extractor.linearizer.linear(item.file)
    if gpu_side is not None:
        linear = swapped(linear, item, gpu_side)
    return compute_closure(gpu_side or item, linear, extractor.context_linear(item.file))


def _gpu_side(item: Item, models) -> Item | None:
    """The exposed function without the CPU side of its device tests: a label runs on the GPU,
    and the CPU functor such a side calls is compiled in a source no label links (mmcv's
    `SparseMaxPoolForwardFunctor<tv::CPU, ...>`: undefined symbol at import)."""
    span = slice(item.start, item.end)
    cut = one_side(item, models[item.file].text[span], models[item.file].code[span], cpu=False)
    return cut[0] if cut else None


def _holds(closure: Closure, fk: FoundKernel) -> bool:
    return any(e.item is fk.kdef.item for e in closure.entries)


def mine_wrapper(
    fk: FoundKernel,
    extractor: Extractor,
    index: LauncherIndex,
    dtypes: tuple[str, ...] = (),
    also: Item | None = None,
) -> MinedWrapper | None:
    """`dtypes`: what the kernel's unit compiled with (an adapter instantiates only those);
    `also`: another host function the label holds too (a backward's forward)."""
    disc = extractor.disc
    for launcher in launcher_candidates(fk, disc, index):
        found = exposed_for(launcher, index)
        if found is None:
            continue
        exposed, chain = found
        gpu_side = _gpu_side(exposed, disc.models)
        closure = _closure(exposed, extractor, gpu_side)
        root = gpu_side or exposed
        if not _holds(closure, fk):
            # the launcher lives in another translation unit: link its closure in
            other = _closure(launcher, extractor)
            if not _holds(other, fk):
                continue
            link_before(closure, other, root)
        if also is not None:
            link_before(closure, _closure(also, extractor, _gpu_side(also, disc.models)), root)
        link_specializations(closure, extractor, root, GPU_SOURCE)
        _link_declared(closure, extractor, root)
        fill_defaults(closure, lambda it: _spans(disc.models[it.file], it))
        includes, code = render_host_code(closure, disc.models)
        sig = index.signature(exposed)
        return MinedWrapper(launcher, [sig], includes, code, chain, index.enums)
    adapted = _adapted(fk, extractor, index, dtypes or ("float", "double"))
    return adapted or _method_adapted(fk, extractor, index)


def _adapted(
    fk: FoundKernel, extractor: Extractor, index: LauncherIndex, dtypes: tuple[str, ...]
) -> MinedWrapper | None:
    """The launcher itself behind kminer's pointer adapter (wrappers.adapter), when no caller
    up the chain can be bound but the launcher takes only pointers to numbers and numbers."""
    for launcher in launcher_candidates(fk, extractor.disc, index):
        sig = index.signature(launcher)
        if sig is None:
            continue
        closure = _closure(launcher, extractor)
        if not _holds(closure, fk):
            continue
        _link_declared(closure, extractor, launcher)
        includes, code = render_host_code(closure, extractor.disc.models)
        made = adapt(sig, code, dtypes, index.classes)
        if made is None:
            continue
        adapter_sig, adapter_code = made
        chain = [launcher.names[0]]
        if "getCurrentCUDAStream" in adapter_code:  # the current stream, for a cudaStream_t
            includes = with_wrapper_includes(includes)
        return MinedWrapper(launcher, [adapter_sig], includes, f"{code}\n{adapter_code}", chain)
    return None


def _method_adapted(fk: FoundKernel, extractor: Extractor, index: LauncherIndex):
    """A launcher that is a method of a class the repository binds (torchsparse's
    `GPUHashTable<K, V>::insert_many`): the nearest method up its callers whose arguments
    pybind can pass (`insert_vals(at::Tensor keys)`), behind an adapter making the object
    from its bound constructor's arguments (wrappers.bound_class)."""
    if not index.classes:
        return None
    for launcher in launcher_candidates(fk, extractor.disc, index):
        frontier, seen = [(launcher, [launcher.names[0]])], {id(launcher)}
        for _ in range(3):
            nxt = []
            for item, chain in frontier:
                found = index.method(item)
                made = method_adapter(*found) if found else None
                if made is not None:
                    closure = _closure(item, extractor)
                    if _holds(closure, fk):
                        _link_declared(closure, extractor, item)
                        includes, code = render_host_code(closure, extractor.disc.models)
                        sig, text = made
                        return MinedWrapper(launcher, [sig], includes, f"{code}\n{text}", chain)
                for caller in index.callers.get(item.names[0], []):
                    if id(caller) not in seen and caller.kind == "function" and caller.names:
                        seen.add(id(caller))
                        nxt.append((caller, [*chain, caller.names[0]]))
            frontier = nxt
    return None
