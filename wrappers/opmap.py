"""The repository's own path from a kernel to its public op, recorded for the test stage.

mmcv: kernel → `ROIAlignForwardCUDAKernelLauncher` → `roi_align_forward_cuda` (cudabind.cpp) →
`REGISTER_DEVICE_IMPL(roi_align_forward_impl, CUDA, ...)` → `roi_align_forward_impl` (the op
.cpp) with `REGISTER_DEVICE_IMPL(roi_align_forward_impl, CPU, roi_align_forward_cpu)` as the CPU
twin. pytorch_scatter: `scatter_cuda` ↔ `scatter_cpu` by name. Tests use the CPU side as a
reference, so finding it here saves them guessing.
"""

from __future__ import annotations

import re

from miner.filemodel import Item
from miner.registrations import registrations as registered
from miner.repo_model import Discovery

_PYDEF = re.compile(r"\bm\.def\s*\(\s*\"(\w+)\"\s*,\s*&?\s*([\w:]+)")
# torch::RegisterOperators().op("ns::name", &fn): the op is torch.ops.ns.name
_REGOP = re.compile(r"\.op\s*\(\s*\"(?:\w+::)?(\w+)\"\s*,\s*&?\s*([\w:]+)")
TWINS = (("_cuda", "_cpu"), ("_gpu", "_cpu"), ("CUDA", "CPU"), ("Cuda", "Cpu"), ("cuda", "cpu"))


def functions_by_name(disc: Discovery) -> dict[str, list[Item]]:
    out: dict[str, list[Item]] = {}
    for model in disc.models.values():
        for item in model.items:
            if item.kind == "function" and item.names:
                out.setdefault(item.names[0], []).append(item)
    return out


def _autograd_classes(disc: Discovery) -> dict[str, list[str]]:
    """Callee → the C++ autograd Functions (`struct K : Function<K>`) whose methods call it.
    Their `forward` is reached only through `K::apply(...)`, which names K, not the callee.
    Read once per discovery (op_map runs for every candidate)."""
    out = getattr(disc, "_autograd_classes", None)
    if out is None:
        out = {}
        for model in disc.models.values():
            for item in model.items:
                if item.kind == "type" and item.names and {"Function", "forward"} <= item.refs:
                    for ref in item.refs:
                        out.setdefault(ref, []).append(item.names[0])
        disc._autograd_classes = out  # type: ignore[attr-defined]
    return out


def _callers_up(chain: list[str], callers: dict[str, list[Item]], disc: Discovery) -> list[str]:
    names = list(dict.fromkeys(chain))
    classes = _autograd_classes(disc)
    frontier = list(names)
    for _ in range(4):  # callers further up: *_cuda wrappers, autograd Functions, registries
        nxt = []
        for name in frontier:
            via = [c for klass in classes.get(name, []) for c in callers.get(klass, [])]
            for caller in [*callers.get(name, []), *via]:
                if caller.kind == "function" and caller.names and caller.names[0] not in names:
                    names.append(caller.names[0])
                    nxt.append(caller.names[0])
        frontier = nxt
    return names


def binding_names(disc: Discovery) -> dict[str, str]:
    """C++ function → the name Python calls it by (`m.def("name", &fn)`, `.op("ns::name",
    &fn)`), read once per discovery."""
    out = getattr(disc, "_binding_names", None)
    if out is None:
        out = {}
        for model in disc.models.values():
            for marker, pattern in (("m.def", _PYDEF), (".op", _REGOP)):
                if marker in model.code:  # names are string literals: read the text
                    found = pattern.finditer(model.text)
                    out.update({m.group(2).split("::")[-1]: m.group(1) for m in found})
        disc._binding_names = out  # type: ignore[attr-defined]
    return out


def _registrations(disc: Discovery) -> list[tuple[str, str, str, str]]:
    """(op key, device, function, file) of every registration, read once per discovery."""
    out = getattr(disc, "_registrations", None)
    if out is None:
        out = [
            (key, device, fn, rel)
            for rel, model in disc.models.items()
            if "REGISTER_" in model.code or "TORCH_LIBRARY_IMPL" in model.code
            for key, device, fn in registered(model.code, model.text)
        ]
        disc._registrations = out  # type: ignore[attr-defined]
    return out


def op_map(disc: Discovery, chain: list[str], callers: dict[str, list[Item]]) -> dict:
    """Everything known about the op around `chain` (launcher first, exposed function last)."""
    functions = functions_by_name(disc)
    names = _callers_up(chain, callers, disc)
    registrations = _registrations(disc)
    bindings = binding_names(disc)
    result: dict = {"launcher": chain[0] if chain else "", "chain": names}
    for key, device, fn, rel in registrations:
        if fn in names and device == "CUDA":
            result.update(dispatch_key=key, device_fn=fn, registered_in=rel)
            op_def = functions.get(key, [])
            if op_def:
                result["op_file"] = op_def[0].file
            break
    key = result.get("dispatch_key")
    cpu = [(fn, rel) for k, dev, fn, rel in registrations if key and k == key and dev == "CPU"]
    if not cpu:
        for name in names:
            for a, b in TWINS:
                twin = name.replace(a, b)
                if twin != name and twin in functions:
                    cpu.append((twin, functions[twin][0].file))
                    break
            if cpu:
                break
    if cpu:
        fn, registered_in = cpu[0]
        # one name on both sides (pyg-lib's scatter_sum_kernel): the definition beside the CPU
        # registration, else one outside a CUDA source
        defs = sorted(
            functions.get(fn, []), key=lambda d: (d.file != registered_in, d.file.endswith(".cu"))
        )
        result.update(cpu_fn=fn, cpu_file=defs[0].file if defs else registered_in)
    public = [bindings[n] for n in names if n in bindings]
    if key:
        public += [
            bindings[c.names[0]] for c in callers.get(key, []) if c.names and c.names[0] in bindings
        ]
    public = list(dict.fromkeys(public))
    if public:
        result["python_name"] = public[0]
    if len(public) > 1:  # one launcher under several ops (spmm_sum, spmm_mean, ... → spmm_fw)
        result["python_names"] = public
    return result
