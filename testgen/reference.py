"""The repository's own CPU implementation of a kernel's op, as a standalone reference source.

Tests compare the label with the CPU code the repository ships for the same op, found in this
order: a registry (mmcv: `REGISTER_DEVICE_IMPL(key, CPU, fn)` beside the CUDA registration of
the label's chain, or of a sibling key the op function calls instead with the same arguments;
PyTorch's dispatcher: `TORCH_LIBRARY_IMPL(ns, CPU, m)` beside the op's CUDA block, pyg-lib),
a direct call (an op function that calls the launcher on GPU and `*_cpu`
otherwise, as mmcv's nms_rotated does), a `_cuda`→`_cpu` style twin (pytorch_scatter), a twin
taking one group of a launcher's groups (group_twin), the launcher's own CPU branch (spconv's
`device == torch::kCPU`: device_branch). Only a *definition* counts: a CPU function that is only
declared is a reason, not a reference.

The CPU function is extracted like a mined launcher (its closure over its own file's include
closure, the repository's torch includes kept, CUDA ones dropped, preprocessed for the host
compiler) and bound as `reference` with the label's first exposed function's signature: either
directly, when the signatures agree, or through an adapter whose arguments `argmap` reads back
from the calls between the two. The file has the label's layout (body markers, `kminer_bind`,
the module behind `#ifndef KMINER_BATCH`), so `wrappers.batching` batches references too.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from miner.candidate import Candidate, Reference
from miner.closure import Closure, compute_closure, link_before
from miner.cpp_expr import MacroEnv
from miner.discover import discover
from miner.extract import including_unit
from miner.filemodel import Item
from miner.includes import IncludeResolver, exists_on_system, is_torch_header
from miner.launches import include_graph
from miner.linearize import Linearizer
from miner.registrations import registrations
from miner.repo_model import Discovery
from miner.sources import GPU_SOURCE
from miner.textprep import blank_comments_and_strings
from miner.unit import render_host_code
from testgen.argmap import (
    Step,
    adapter,
    call_args,
    core_type,
    local_values,
    locals_of,
    map_arguments,
)
from testgen.call_site_twin import call_site_twin
from testgen.carry import bound_function, public_names, pybind_arg_names
from testgen.device_branch import host_closure, host_version
from testgen.group_twin import group_twin
from testgen.guarded_twin import guarded_twin
from testgen.mode_dispatch import dispatch_adapter, distinct, mode_of
from testgen.op_loop import op_loop
from testgen.pointer_twin import pointer_adapter, pointer_reference, twin_reference
from testgen.python_branch import branch_twins
from testgen.python_branch import cpu_call_args as python_cpu_args
from wrappers.adapter import aliases
from wrappers.kernel_twin import twin_names
from wrappers.legacy import header_lines, modernize
from wrappers.mined import LauncherIndex
from wrappers.opmap import TWINS
from wrappers.signature import Signature, parse_signature, specialized

_CPU_WORD = re.compile(r"cpu|CPU|Cpu")
_STEM = re.compile(r"_?(?:cuda|cpu|gpu)", re.IGNORECASE)
# a word naming another accelerator's backend (mmcv's `get_indice_pairs_forward_mlu` and
# `..._musa`, called with the CUDA function's very arguments under `at::kMLU`): no CPU side
_ACCELERATOR = re.compile(
    r"(?:^|_|(?<=[a-z0-9]))(?:MLU|MUSA|NPU|MPS|XPU|HIP|IPU|HPU|DIPU)(?=$|_|[A-Z])"
    r"|(?:^|_)(?:mlu|musa|npu|mps|xpu|hip|ipu|hpu|dipu)(?=$|_)"
)
_CUDA_HEADER = re.compile(
    r"^(cuda|cub/|thrust/|curand|cublas|cusparse|cufft|cudnn|nvToolsExt|nvtx|helper_cuda)"
    r"|^(ATen/cuda|c10/cuda|THC)/|\.cuh$"
)
# OpenPCDet's iou3d_cpu.cpp writes `__device__ Point(...)` and includes <cuda_runtime_api.h>,
# whose host_defines.h makes the qualifiers nothing on the host; a reference drops CUDA headers
_QUALIFIERS = re.compile(r"\b__(?:device|host|forceinline|global)__\b")
HOST_QUALIFIERS = "".join(
    f"#ifndef {name}\n#define {name}{value}\n#endif\n"
    for name, value in (("__device__", ""), ("__host__", ""), ("__forceinline__", " inline"))
)
DEPTH = 3  # callers above the exposed function searched for a bridge (mmcv: 1, nms_rotated: 1)
_QUALIFIER = re.compile(r"(?<![\w:])([A-Za-z_]\w*)\s*::")
_NAMESPACE = re.compile(r"\bnamespace\s+([A-Za-z_]\w*)\s*\{")
_KNOWN_NAMESPACES = {"std", "at", "torch", "c10", "caffe2", "pybind11", "py", "detail", "cuda"}
_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"[^"\n]*"[^\n]*$', re.MULTILINE)


def _without_repository_includes(text: str) -> str:
    """A vendored header's text with its `#include "..."` lines blanked (what they name is
    inlined before it, or is part of the extracted closure)."""
    return _QUOTED_INCLUDE.sub("", text)


def cpu_env() -> MacroEnv:
    """What g++ -std=c++17 predefines on Linux: no `__CUDACC__`, so host branches are taken."""
    env = MacroEnv()
    for name, value in {"__cplusplus": "201703L", "__linux__": "1", "__GNUC__": "12"}.items():
        env.define(name, None, value)
    for name in ("__x86_64__", "__STDC__"):
        env.define(name, None, "1")
    return env


@dataclass
class Located:
    mechanism: str  # registry | sibling | direct | twin | group twin | device branch | kernel twin
    # | op loop | guarded twin | call-site twin
    cpu: Item  # the CPU function's definition
    exposed: Signature  # the label's first exposed function
    args: list[str]  # the CPU call's arguments, over the exposed function's parameters
    via: str  # the function whose arguments the CPU function takes (device_fn, op function)
    template_args: str = ""  # the call site's explicit ones (`cpu_BatchNorm<float>(...)`)
    pointer_adapter: str = ""  # the label's adapter over a pointer launcher (pointer_adapter)
    group_helper: tuple[str, str] = ("", "")  # (name, code) looping a group twin (group_twin)
    closure: Closure | None = None  # computed already (a device branch's host version)
    twin_code: tuple[str, str] = ("", "")  # (code, target) of a kernel twin's adapter
    branches: tuple = ()  # mode dispatch: (mode, cpu Item, args, template args, via) per op


class RepoRefs:
    """One repository's functions, registrations and a host-side linearizer, built once."""

    def __init__(self, disc: Discovery, index: LauncherIndex | None = None) -> None:
        self.disc = disc
        self.index = index or LauncherIndex(disc)
        self.defs: dict[str, list[Item]] = {}
        self.decls: dict[str, list[Item]] = {}
        self.registry: dict[tuple[str, str], str] = {}
        self.types: dict[str, list[Item]] = {}  # classes by name: specializations too
        for model in disc.models.values():
            for item in model.items:
                if item.kind == "type" and item.names:
                    self.types.setdefault(item.names[0], []).append(item)
                if item.names and not item.device and item.kind in ("function", "decl"):
                    into = self.defs if item.kind == "function" else self.decls
                    into.setdefault(item.names[0], []).append(item)
            if "REGISTER_" in model.code or "TORCH_LIBRARY_IMPL" in model.code:
                for key, device, fn in registrations(model.code, model.text):
                    self.registry.setdefault((key, device), fn)
        resolver = IncludeResolver(list(disc.models))
        self.linearizer = Linearizer(disc.models, resolver, cpu_env())
        self._graph = include_graph(disc.models, resolver)
        self._reach: dict[str, set[str]] = {}
        self.kernel_items = {(fk.file, fk.kdef.name): fk.kdef.item for fk in disc.kernels}

    def context_linear(self, file: str):
        """The CPU-side linear view of the source that compiles `file` by `#include` (a unity
        build: SparseConvNet's CPU/*.cpp inside sparseconvnet_cpu.cpp, after the header that
        says `using Int = int32_t;`), or None when `file` is compiled alone."""
        unit = including_unit(
            self._graph, self._reach, file, allowed=lambda f: not GPU_SOURCE.search(f)
        )
        return self.linearizer.linear(unit) if unit else None

    def body(self, item: Item) -> str:
        return self.disc.models[item.file].code[item.start : item.end]

    def text(self, item: Item) -> str:
        return self.disc.models[item.file].text[item.start : item.end]

    def vendored_headers(self, file: str, body: str) -> list[tuple[str, str]]:
        """Headers `file` reaches by #include that declare a namespace the extracted `body`
        uses and does not declare (pytorch_cluster's knn_cpu: `nanoflann::KDTreeSingleIndex
        Adaptor`, from the header-only nanoflann.hpp the repository ships), whole and in
        include order (what they include from the repository first): a library's templates
        are not taken apart item by item."""
        used = set(_QUALIFIER.findall(blank_comments_and_strings(body))) - _KNOWN_NAMESPACES
        missing = used - set(_NAMESPACE.findall(body))
        out: list[tuple[str, str]] = []
        seen: set[str] = set()

        def visit(rel: str, depth: int) -> None:
            for inc in sorted(self._graph.get(rel, ())):
                if inc in seen or GPU_SOURCE.search(inc) or depth > 8:
                    continue
                seen.add(inc)
                text = self.disc.models[inc].code if inc in self.disc.models else ""
                declares = set(_NAMESPACE.findall(text)) & missing
                visit(inc, depth + 1)
                if declares:
                    out.append((inc, _without_repository_includes(text)))

        if missing:
            visit(file, 0)
        return out

    def signature(self, item: Item) -> Signature | None:
        return parse_signature(self.body(item), item.names[0], item.namespace)

    def definition(self, name: str, host_side: bool = False) -> Item | None:
        found = self.defs.get(name, [])
        if host_side:
            found = sorted(found, key=lambda it: not _host_side(it))
        return found[0] if found else None

    def params_of(self, name: str) -> list[str] | None:
        item = self.definition(name) or next(iter(self.decls.get(name, [])), None)
        sig = self.signature(item) if item else None
        return [n for _, n in sig.params] if sig else None

    def siblings(self, key: str) -> list[str]:
        """Other registry keys with a CPU function that an op function calls in place of `key`
        with the same arguments (mmcv's hard_voxelize_forward calls the nondeterministic key or
        the deterministic one, which alone has a CPU implementation): the same op, computed the
        way the CPU does it."""
        item = self.definition(key)
        params = self.params_of(key)
        out = []
        for caller in self.index.callers.get(key, []) if item and params else []:
            body = self.body(caller)
            mine = call_args(body, key)
            for other, device in self.registry:
                if device != "CPU" or other == key or other not in caller.refs:
                    continue
                if self.params_of(other) == params and call_args(body, other) == mine:
                    out.append(other)
        return out

    def upward(self, start: Item) -> list[list[Item]]:
        """Call paths from `start` to each function above it (breadth first, DEPTH levels)."""
        paths, queue, seen = [[start]], deque([[start]]), {id(start)}
        while queue:
            path = queue.popleft()
            if len(path) > DEPTH:
                continue
            for caller in self.index.callers.get(path[-1].names[0], []):
                if caller.kind == "function" and caller.names and id(caller) not in seen:
                    seen.add(id(caller))
                    paths.append([*path, caller])
                    queue.append([*path, caller])
        return paths

    def steps(self, path: list[Item]) -> list[Step] | None:
        out = []
        for callee, caller in itertools.pairwise(path):
            args = call_args(self.body(caller), callee.names[0])
            callee_params = self.params_of(callee.names[0])
            caller_sig = self.signature(caller)
            if args is None or callee_params is None or caller_sig is None:
                return None
            names = [n for _, n in caller_sig.params]
            out.append(Step(caller.names[0], names, callee.names[0], callee_params, args))
        return out


def locate(cand: Candidate, refs: RepoRefs, label_text: str = "") -> Located | str:
    """The CPU function for the candidate's op and how to call it, or why there is none."""
    exposed = (cand.wrapper.functions or [cand.wrapper.launcher])[0]
    e_item = refs.definition(exposed) if exposed else None
    sig = refs.index.signature(e_item) if e_item else None  # a template: at the label's args
    kernel_item = (  # a label over the kernel alone (wrappers.kernel_twin)
        refs.kernel_items.get((cand.kernel.file, cand.kernel.name))
        if cand.wrapper.launcher == cand.kernel.name
        else None
    )
    adapted = pointer_adapter(cand, refs, label_text, kernel_item) if sig is None else None
    if isinstance(adapted, str):
        return adapted
    if adapted:
        e_item, sig, adapter_text = adapted
    if sig is None:
        return f"no label function to match: {exposed or 'no wrapper'} has no definition"
    params = [n for _, n in sig.params]
    if not all(params):
        return f"{exposed} has unnamed parameters"
    if adapted and kernel_item is not None:  # 0. the kernel's own twin
        for twin in twin_names(cand.kernel.name):
            item = refs.definition(twin, host_side=True)
            if item is None or not _host_side(item) or refs.params_of(twin) != params:
                continue
            if _only_raises(refs.body(item)):
                return f"{twin} only raises: the repository has no CPU implementation"
            code = twin_reference(refs.signature(item), qualified(item))
            if code is None:
                return f"{twin} takes what no tensor, number or flag gives"
            return Located("kernel twin", item, sig, params, twin, "", adapter_text, twin_code=code)
    paths = refs.upward(e_item)
    undefined: list[str] = []
    reasons: list[str] = []

    def attempt(mechanism: str, cpu: str, path: list[Item], cpu_args: list[str] | None):
        item = refs.definition(cpu, host_side=True)
        if item is None:
            if cpu in refs.decls:
                undefined.append(cpu)
            return None
        if _only_raises(refs.body(item)):
            reasons.append(f"{cpu} only raises: the repository has no CPU implementation")
            return None
        steps = refs.steps(path)
        if steps is None or cpu_args is None:
            reasons.append(f"cannot read the calls from {exposed} up to {path[-1].names[0]}")
            return None
        bridge = path[-1]
        body = refs.body(bridge)
        mapped = map_arguments(steps, params, cpu_args, locals_of(body), cpu, local_values(body))
        if isinstance(mapped, str):
            reasons.append(mapped)
            return None
        if adapted:  # the twin takes the launcher's pointers as they are, or no reference
            if mapped != params or refs.params_of(cpu) != params:
                reasons.append(f"{cpu} takes other arguments than {cand.wrapper.launcher}")
                return None
            return Located(mechanism, item, sig, mapped, bridge.names[0], "", adapter_text)
        plain = specialized(sig) if sig.template else sig
        if plain is None:
            reasons.append(f"{cpu} found, but {exposed} is a function template: no adapter")
            return None
        return Located(mechanism, item, plain, mapped, bridge.names[0])

    for path in paths:  # 1. the registry: <key> has a CUDA function on the chain and a CPU one
        name = path[-1].names[0]
        for (key, device), fn in refs.registry.items():
            if device != "CUDA" or fn != name:
                continue
            if (key, "CPU") in refs.registry:
                found = attempt("registry", refs.registry[(key, "CPU")], path, refs.params_of(name))
                if found:
                    return found
            for sibling in refs.siblings(key):  # the same op's other key, with a CPU function
                cpu = refs.registry[(sibling, "CPU")]
                found = attempt("sibling", cpu, path, refs.params_of(name))
                if found:
                    return found
    directs: list[tuple[Located, dict[str, str]]] = []
    for path in paths:  # 2. an op function (the exposed one too) calling a CPU function itself
        caller = path[-1]
        if _REGISTRATION.match(caller.names[0]):
            continue  # a module's bindings name every op's functions, calling none of them
        on_path = {p.names[0] for p in path}
        callee = path[-2].names[0] if len(path) > 1 else ""
        other_branch = _other_device_branch(refs.body(caller), callee, refs.defs)
        for ref in sorted(caller.refs):
            if ref in on_path or not (_CPU_WORD.search(ref) or ref in other_branch):
                continue
            if _ACCELERATOR.search(ref) and not _CPU_WORD.search(ref):
                continue
            same = _STEM.sub("", ref).strip("_") == _STEM.sub("", caller.names[0]).strip("_")
            if _twin_of(ref, on_path) or same or ref in other_branch:
                found = attempt("direct", ref, path, call_args(refs.body(caller), ref))
                if found:
                    explicit = re.search(
                        rf"\b{re.escape(ref)}\s*<([^<>();]*)>\s*\(", refs.body(caller)
                    )
                    found.template_args = explicit.group(1).strip() if explicit else ""
                    directs.append((found, mode_of(refs.steps(path))))
                    break
    if directs:  # each op's own CPU function, where wrappers fix the label's modes apart
        return _dispatched(directs, refs)
    for path in paths:  # 3. a twin with the same parameters
        name = path[-1].names[0]
        for a, b in TWINS:
            twin = name.replace(a, b)
            if twin == name or (twin not in refs.defs and twin not in refs.decls):
                continue
            mine, theirs = refs.params_of(name), refs.params_of(twin)
            if mine is not None and theirs is not None and len(mine) != len(theirs):
                reasons.append(f"twin {twin} takes {len(theirs)} arguments, {name} {len(mine)}")
                continue
            found = attempt("twin", twin, path, mine)
            if found:
                return found
    found = _python_branch(refs, cand, paths, attempt, reasons)  # 3b. the CPU binding the
    if found:  # repository's Python calls in the CUDA binding's place on CPU tensors
        return found
    if adapted:  # 4. a twin taking one group of the launcher's list of groups
        found = group_twin(refs, e_item, sig.params, _host_side)
        if isinstance(found, tuple) and _only_raises(refs.body(found[0])):
            found = f"{found[0].names[0]} only raises: the repository has no CPU implementation"
        if isinstance(found, tuple):
            twin, helper_name, helper = found
            params = [n for _, n in sig.params]
            via = e_item.names[0]
            return Located(
                "group twin", twin, sig, params, via, "", adapter_text, (helper_name, helper)
            )
        if found:
            reasons.append(found)
        lifted = op_loop(refs, e_item, sig.params, paths, _host_side)
        if isinstance(lifted, tuple):
            op, helper_name, helper, called = lifted
            params = [n for _, n in sig.params]
            closure = _closure_of(refs, called, op)
            return Located(
                "op loop",
                op,
                sig,
                params,
                e_item.names[0],
                "",
                adapter_text,
                (helper_name, helper),
                closure,
            )
        if lifted:
            reasons.append(lifted)
        guarded = guarded_twin(refs, e_item, sig.params, paths, _host_side)
        if isinstance(guarded, tuple):
            op, helper_name, helper, called = guarded
            closure = _closure_of(refs, called, op)
            helper = _label_aliases(label_text, helper + adapter_text) + helper
            via = e_item.names[0]
            pair = (helper_name, helper)
            return Located("guarded twin", op, sig, params, via, "", adapter_text, pair, closure)
        if guarded:
            reasons.append(guarded)
        launcher_params = refs.params_of(e_item.names[0]) or []
        kept = [i for i, n in enumerate(launcher_params) if n in params]
        found = call_site_twin(refs, paths, e_item.names[0], kept, _host_side)
        if found is not None:
            twin, op = found
            _, aliases = render_host_code(cpu_closure(refs, twin), refs.disc.models)
            code = twin_reference(refs.signature(twin), qualified(twin), aliases)
            if code is not None and not _only_raises(refs.body(twin)):
                return Located(
                    "call-site twin",
                    twin,
                    sig,
                    params,
                    op.names[0],
                    "",
                    adapter_text,
                    twin_code=code,
                )
    host = _device_branch(refs, e_item, sig) if not adapted else None
    if isinstance(host, Located):  # 5. the launcher's own CPU branch (device_branch)
        return host
    if host:
        reasons.append(host)
    if reasons:
        return reasons[0]
    if undefined:
        return f"{undefined[0]} is declared but not defined in the repository"
    return f"no CPU function: no CPU registration, direct call or CPU twin around {exposed}"


_REGISTRATION = re.compile(r"^(?:PYBIND11_MODULE|TORCH_LIBRARY\w*|TORCH_EXTENSION_NAME)$")
_RAISES = re.compile(
    r"^(?:AT_ERROR|TORCH_CHECK_NOT_IMPLEMENTED|throw\b|std::abort|abort|exit"
    r"|(?:TORCH_CHECK|AT_ASSERTM?|TORCH_INTERNAL_ASSERT|AT_CHECK|assert)\s*\(\s*(?:false|0)\b)"
)


def _only_raises(definition: str) -> bool:
    """A CPU function that exists only to refuse (`AT_ERROR("Not implement on cpu")`): its
    first statement raises, whatever follows to please the compiler (pytorch3d's
    `AT_ERROR("Not Implemented"); return std::make_tuple(pix_to_face, pix_to_face);`)."""
    body = blank_comments_and_strings(definition)
    inner = body[body.find("{") + 1 : body.rfind("}")]
    statements = [st.strip().lstrip("{ \t\n") for st in inner.split(";") if st.strip()]
    return bool(statements) and bool(_RAISES.match(statements[0]))


_DEVICE_TEST = re.compile(
    r"\.is_cuda\s*\(\s*\)|\bis_cuda\b|\.device\s*\(\s*\)\s*\.\s*type\s*\(\s*\)\s*==\s*"
    r"(?:(?:at|torch|c10)::)?(?:kCUDA|DeviceType::CUDA)\b"
)


def _other_device_branch(body: str, callee: str, defined: dict) -> set[str]:
    """Functions the op function calls with `callee`'s very arguments when it also asks whether
    a tensor is on the GPU (`if (x.device().is_cuda()) return f_cuda(a, b); else return
    f_cpp(a, b);`): the CPU side of the op, whatever its name says."""
    text = blank_comments_and_strings(body)
    mine = call_args(body, callee) if callee else None
    if mine is None or not _DEVICE_TEST.search(text):
        return set()
    named = set(re.findall(r"\b([A-Za-z_]\w*)\s*(?:<[^<>;()]*>)?\s*\(", text))
    return {n for n in named - {callee} if n in defined and call_args(body, n) == mine}


def _device_branch(refs: RepoRefs, item: Item, sig: Signature) -> Located | str | None:
    model = refs.disc.models[item.file]
    found = host_version(item, model.text[item.start : item.end], model.code[item.start : item.end])
    if found is None:
        return None
    host, branches = found
    if all(_only_raises(b) for b in branches):
        return f"{item.names[0]}'s CPU branch only raises: no CPU implementation"
    plain = specialized(sig) if sig.template else sig
    if plain is None:
        return f"{item.names[0]} has a CPU branch, but is a function template: no adapter"
    closure = host_closure(refs, item, host, _host_side)
    params = [n for _, n in sig.params]
    bound = sig.template_args if sig.template else ""  # the label's instantiation (`f<3>`)
    return Located(
        "device branch", host, plain, params, item.names[0], template_args=bound, closure=closure
    )


def _python_branch(refs: RepoRefs, cand: Candidate, paths: list, attempt, reasons: list[str]):
    """Step 3b of `locate`: the candidate's binding, with a CPU binding that the repository's
    Python calls in its place on CPU tensors (testgen/python_branch.py), from the path up to
    the function the binding exposes."""
    for python_name in public_names(cand):
        bound = bound_function(refs, python_name) or python_name
        path = next((p for p in paths if p[-1].names[0] == bound), None)
        cuda_params = refs.params_of(bound)
        if path is None or not cuda_params:
            continue
        for twin in branch_twins(refs.disc.root, python_name):
            cpu = bound_function(refs, twin.cpu_binding, cpu_side=True)
            cpu_params = refs.params_of(cpu) if cpu and cpu != bound else None
            if cpu_params is None:  # (a binding name both modules define: the CPU one's)
                continue
            names = pybind_arg_names(refs, twin.cpu_binding)
            args = python_cpu_args(twin, cuda_params, cpu_params, names)
            if isinstance(args, str):
                reasons.append(args)
                continue
            found = attempt("python branch", cpu, path, args)
            if found:
                return found
    return None


def _twin_of(cpu: str, names: set[str]) -> bool:
    return any(n.replace(a, b) == cpu for n in names for a, b in TWINS)


def _label_aliases(label_text: str, code: str) -> str:
    """The label's own type aliases that `code` reads (`using Int = int32_t;`: a repository
    with one alias per build reads the one its label was built with)."""
    used = set(re.findall(r"[A-Za-z_]\w*", code))
    return "".join(f"using {k} = {v};\n" for k, v in aliases(label_text).items() if k in used)


def _dispatched(directs: list[tuple[Located, dict[str, str]]], refs: RepoRefs) -> Located:
    """The first op's CPU function, or one per op (testgen/mode_dispatch.py) where the ops'
    wrappers call the label's function with constants that tell them apart."""
    first = directs[0][0]
    by_call: dict[tuple, tuple[Located, dict[str, str]]] = {}  # one CPU function may serve
    for loc, mode in directs:  # two ops with its arguments swapped
        by_call.setdefault((loc.cpu.names[0], tuple(loc.args)), (loc, mode))
    kept = list(by_call.values())
    if len(kept) < 2 or not distinct([mode for _, mode in kept]):
        return first
    first.mechanism = "mode dispatch"
    first.branches = tuple(
        (mode, loc.cpu, loc.args, loc.template_args, loc.via) for loc, mode in kept
    )
    names = list(dict.fromkeys(loc.cpu.names[0] for loc, _ in kept))
    first.closure = _closure_of(refs, names, first.cpu)
    return first


def _closure_of(refs: RepoRefs, names: list[str], op: Item) -> Closure:
    """The closure of the repository functions a lifted loop calls (not of the op around it,
    whose Metadata-like objects the loop never touches), as one unit; empty when it calls none."""
    closure = Closure(entries=[], externals=[], needs_torch=True)
    for name in names:
        item = refs.definition(name, host_side=True)
        if item is not None and _host_side(item):
            link_before(closure, cpu_closure(refs, item), op)
    return closure


def cpu_closure(refs: RepoRefs, item: Item) -> Closure:
    """The CPU function's closure; helpers only declared there get their definitions (and
    what those need) from the file that defines them, as a linker would."""
    closure = compute_closure(
        item, refs.linearizer.linear(item.file), refs.context_linear(item.file)
    )
    for _ in range(3):
        have = {n for e in closure.entries if e.item.kind != "decl" for n in e.item.names}
        used = set().union(*(e.item.refs for e in closure.entries if e.item.kind != "decl"))
        wanted = [
            d
            for e in closure.entries
            if e.item.kind == "decl" and e.item.names and e.item.names[0] in used - have
            for d in [refs.definition(e.item.names[0], host_side=True)]
            if d is not None and _host_side(d)
        ]
        if not wanted:
            break
        for d in wanted:
            link_before(closure, compute_closure(d, refs.linearizer.linear(d.file)), item)
    return closure


def cpu_includes(closure: Closure) -> list[str]:
    """The closure files' includes a host compiler can use (torch's, the system's), guarded
    as they were; CUDA headers are dropped."""
    lines: list[str] = []
    seen = {"torch/extension.h"}
    for ext in closure.externals:
        h = ext.header
        if h in seen or _CUDA_HEADER.search(h) or not (is_torch_header(h) or exists_on_system(h)):
            continue
        seen.add(h)
        inc = [f"#include <{h}>"]
        lines += (
            [f"#if {' && '.join(f'({g})' for g in ext.guards)}", *inc, "#endif"]
            if (ext.guards)
            else inc
        )
    return lines


def _host_side(item: Item) -> bool:
    """Whether a definition is in a file a CPU build compiles too (no .cu, no cuda/ folder)."""
    return not GPU_SOURCE.search(item.file)


def qualified(item: Item) -> str:
    """The function's name as a call outside its namespaces spells it (anonymous ones left out)."""
    ns = [n for n in item.namespace if n and not n.startswith("extern")]
    return "::".join((*ns, item.names[0]))


def _host_source(refs: RepoRefs, closure: Closure, file: str, code: str = "") -> tuple[str, str]:
    """(the head: rewrite headers, torch's and the closure's includes; the closure's code with
    the whole headers it needs, then `code`) of a CPU build, modernized together."""
    _, body = render_host_code(closure, refs.disc.models)
    vendored = refs.vendored_headers(file, body)
    body = (
        "".join(
            f"// {rel} (whole: a library the repository ships)\n{text}\n" for rel, text in vendored
        )
        + body
    )
    modern = modernize(cpu_includes(closure), [body, code], cuda=False)
    body, code = modern.codes
    if _QUALIFIERS.search(body):  # a CPU twin copied from CUDA code keeps its qualifiers
        body = HOST_QUALIFIERS + body
    head = (
        "".join(f"{ln}\n" for ln in header_lines(modern.rewrites))
        + "#include <torch/extension.h>\n"
        + "".join(f"{ln}\n" for ln in modern.includes)
    )
    return head, f"{body.rstrip()}\n\n{code}"


def render(cand: Candidate, loc: Located, refs: RepoRefs) -> str:
    closure = loc.closure or cpu_closure(refs, loc.cpu)
    cpu = qualified(loc.cpu)
    called = f"{cpu}<{loc.template_args}>" if loc.template_args else cpu  # T not from `double eps`
    overloads = sum(
        e.item.kind == "function" and e.item.names[:1] == loc.cpu.names[:1] for e in closure.entries
    )
    note = f"{cpu} takes {loc.via}'s arguments, read back from its calls down to"
    if loc.branches:
        ops = ", ".join(f"{qualified(item)} ({via})" for _, item, _, _, via in loc.branches)
        code, target = dispatch_adapter(
            loc.exposed,
            [
                (mode, f"{qualified(item)}<{targs}>" if targs else qualified(item), args)
                for mode, item, args, targs, _ in loc.branches
            ],
            refs.index.enums,
            f"each op's CPU function takes its op's arguments, read back from its calls down to "
            f"{loc.exposed.name}, under the constants its wrapper passes: {ops}",
        )
    elif loc.mechanism in ("kernel twin", "call-site twin"):
        code, target = loc.twin_code
    elif loc.pointer_adapter:
        helper_name, helper = loc.group_helper
        code, target = pointer_reference(
            loc.pointer_adapter,
            loc.exposed.name,
            cand.wrapper.launcher,
            helper_name or cpu,
            tensors=loc.mechanism in ("op loop", "guarded twin"),
        )
        why = {
            "op loop": f"{cpu}'s loop over the rule book its CUDA twin hands the launcher",
            "guarded twin": f"{cpu}'s statement under the condition its CUDA twin launches under",
            "group twin": f"{cpu} takes one group; the CPU op's loop over groups",
        }.get(loc.mechanism, "")
        code = f"// kminer: {why}\n{helper}{code}" if helper else code
    else:
        code, target = adapter(
            loc.exposed,
            called,
            loc.args,
            refs.index.enums,
            refs.signature(loc.cpu) if overloads == 1 else None,
            f"{note}\n// {loc.exposed.name} ({loc.mechanism})",
            widen_ints=loc.mechanism == "python branch",
        )
    head, source = _host_source(refs, closure, loc.cpu.file, code)
    prov = cand.provenance
    return (
        f"// kminer reference {cand.id}: {cpu} ({loc.mechanism}) for {loc.exposed.name}\n"
        f"// from {prov.repo_url} @ {prov.commit[:12]}  {loc.cpu.file}:{loc.cpu.line}  "
        f"license: {prov.license}\n"
        "// Build: torch.utils.cpp_extension.load(name, sources=[this file]), CPU only. "
        "`reference` takes\n// the arguments of the label's first function, in its order. "
        "-DKMINER_BATCH leaves out the module.\n" + head + f"// kminer-label-body-begin\n{source}"
        f'void kminer_bind(pybind11::module_& m) {{ m.def("reference", {target}); }}\n'
        "// kminer-label-body-end\n\n#ifndef KMINER_BATCH\n"
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { kminer_bind(m); }\n#endif\n"
    )


def module_source(refs: RepoRefs, item: Item, bind_as: str) -> str:
    """A CPU function of the repository with its closure, as a module of its own that binds it
    under `bind_as` (the name the repository's Python calls it by: testgen.driver_twin)."""
    head, source = _host_source(refs, cpu_closure(refs, item), item.file)
    bind = f'{{ m.def("{bind_as}", &{qualified(item)}); }}'
    return f"{head}{source}PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {bind}\n"


def find_reference(
    cand: Candidate, repo_root: Path, workdir: Path, refs: RepoRefs | None = None
) -> Reference | str:
    """Write `references/<id>.cpp` under `workdir` and describe it, or say why there is none.
    Pass `refs` (one per repository) when calling for many candidates."""
    refs = refs or RepoRefs(discover(repo_root))
    label = workdir / cand.wrapper.label_path if cand.wrapper.label_path else None
    label_text = label.read_text("utf-8", errors="replace") if label and label.is_file() else ""
    loc = locate(cand, refs, label_text)
    if isinstance(loc, str):
        return loc
    text = render(cand, loc, refs)
    rel = f"references/{cand.id}.cpp"
    (workdir / "references").mkdir(parents=True, exist_ok=True)
    (workdir / rel).write_text(text, encoding="latin-1", errors="replace")
    enums = refs.index.enums
    return Reference(
        kind="cpp",
        function=loc.cpu.names[0],
        file=loc.cpu.file,
        path=rel,
        hash=hashlib.sha256(text.encode("latin-1", errors="replace")).hexdigest()[:20],
        exposed="reference",
        signature=["int64_t" if core_type(t) in enums else t for t, _ in loc.exposed.params],
    )
