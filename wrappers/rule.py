"""Rule wrappers for plain kernels: pointers + one element count, indexed 1-D.

`k(const T* x, T* y, T alpha, int n)` with `i < n` (or a grid-stride loop over n) needs no
understanding to wrap: every pointer is a tensor of n elements, n is `numel()`, scalars pass
through, the non-const pointers are the outputs. Anything more (shapes, strides, several sizes)
is left to the mined or LLM paths.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from miner.candidate import Candidate
from wrappers.label import Exposed, environment

INTEGRAL = frozenset(
    {
        "int",
        "int64_t",
        "int32_t",
        "long",
        "unsigned",
        "size_t",
        "unsigned int",
        "long long",
        "uint32_t",
        "uint64_t",
        "uint",
        "ulong",
    }
)
FLOATS = frozenset({"float", "double"})
TEMPLATE_ID = "rule_elementwise.cpp.j2"


@dataclass
class RuleParam:
    name: str
    host_type: str = ""  # for scalars


@dataclass
class RuleWrapper:
    host_code: str
    functions: list[Exposed]


def _bare(t: str) -> str:
    return " ".join(
        w
        for w in t.replace("*", " * ").split()
        if w not in ("const", "__restrict__", "__restrict", "restrict")
    )


def rule_wrapper(cand: Candidate) -> RuleWrapper | None:
    k = cand.kernel
    if k.specialization or any(tp.kind != "type" for tp in k.template_params):
        return None
    type_params = {tp.name for tp in k.template_params}
    if len(type_params) > 1:
        return None
    tensors, scalars, sizes, call = [], [], [], []
    for p in k.params:
        core = _bare(p.type)
        if not p.name:
            return None
        if core.endswith("*") and core.count("*") == 1:
            tensors.append((p, "const" in p.type.split("*")[0]))
            call.append(f"{p.name}.data_ptr<{_elem(core, type_params)}>()")
        elif core in INTEGRAL:
            sizes.append(p)
            call.append("n")
        elif core in FLOATS or core in type_params:
            host = "double" if core in type_params or core == "double" else "float"
            scalars.append(RuleParam(p.name, host))
            call.append(f"static_cast<scalar_t>({p.name})" if core in type_params else p.name)
        else:
            return None
    if not tensors or len(sizes) != 1 or all(const for _, const in tensors):
        return None
    n = sizes[0].name
    src = k.source
    one_d = re.search(rf"CUDA_\w*1D\w*LOOP\s*\(\s*\w+\s*,\s*{n}\s*\)", src) or re.search(
        rf"\w+\s*<\s*{n}\b", src
    )
    if not one_d or re.search(r"\b(blockIdx|threadIdx)\.y\b|__shared__", src):
        return None
    index = _loop_index(src, n)
    if index is None or not all(_elementwise(src, p.name, index) for p, _ in tensors):
        return None
    grid_stride = bool(re.search(r"gridDim\.x|CUDA_\w*LOOP", src))
    dispatch, targs = "", ""
    if type_params:
        half = "half" in cand.unit.compiled_types
        dispatch = "AT_DISPATCH_FLOATING_TYPES_AND_HALF" if half else "AT_DISPATCH_FLOATING_TYPES"
        targs = "scalar_t"
    wrapper = f"kminer_{k.name}"
    host = (
        environment()
        .get_template(TEMPLATE_ID)
        .render(
            wrapper=wrapper,
            kernel=k.name,
            size=n,
            threads=256,
            grid_stride=grid_stride,
            tensor_params=[RuleParam(p.name) for p, _ in tensors],
            scalar_params=scalars,
            outputs=[RuleParam(p.name) for p, const in tensors if not const],
            dispatch=dispatch,
            targs=targs,
            call_args=", ".join(call),
        )
    )
    return RuleWrapper(host, [Exposed(k.name, f"&{wrapper}", "rule wrapper (elementwise)")])


def _loop_index(src: str, n: str) -> str | None:
    m = re.search(rf"CUDA_\w*1D\w*LOOP\s*\(\s*(\w+)\s*,\s*{n}\s*\)", src) or re.search(
        r"(\w+)\s*=\s*(?:\(?\w+\)?\s*)?blockIdx\.x\s*\*\s*blockDim\.x\s*\+\s*threadIdx\.x", src
    )
    return m.group(1) if m else None


def _elementwise(src: str, name: str, index: str) -> bool:
    """Every use of the pointer is `name[index]`: one element per loop step."""
    uses = re.findall(rf"(?<![\w.]){name}\b\s*(\[[^\]]*\])?", src.split("{", 1)[-1])
    return bool(uses) and all(u.replace(" ", "") == f"[{index}]" for u in uses)


def _elem(core: str, type_params: set[str]) -> str:
    base = core.replace("*", "").strip()
    return "scalar_t" if base in type_params else base
