"""A launcher that takes raw device pointers, bound through a small adapter of kminer's.

Older extensions launch from functions such as SparseConvNet's
`template <typename T> void ActivePooling_ForwardPass(T *in, T *out, Int batchSize, ...,
const Int *rules, bool average)`, whose callers take the library's own structures (a
`Metadata<Dimension> &`) that pybind cannot pass. The launcher itself is the op's device half,
and it is what the label keeps: the adapter takes a tensor for each pointer (its `data_ptr`),
a Python number for each scalar, launches on the current stream where the launcher takes one
(faster-rcnn.pytorch's `ROIPoolForwardLaucher(..., cudaStream_t stream)`), and instantiates a
template launcher for the floating dtype of its first `T *` tensor (those its unit compiled
with). An object of a class the repository
binds (`hashtable &table`) is made in the adapter from its bound constructor's arguments
(wrappers.bound_class). The repository's code is unchanged.
"""

from __future__ import annotations

import re

from wrappers.bound_class import BoundClass, construct, object_type
from wrappers.signature import Signature, bindable_type
from wrappers.staging import staging

_INTEGRAL = frozenset(
    "int int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t long short unsigned "
    "size_t char long long unsigned int unsigned long uint ushort ulong".split()
)
_FLOATING = frozenset({"float", "double"})
_STREAM = frozenset({"cudaStream_t", "at::cuda::CUDAStream", "c10::cuda::CUDAStream"})
_ALIAS = re.compile(r"\busing\s+(\w+)\s*=\s*([^;{}]+?)\s*;|\btypedef\s+([^;{}()]+?)\s+(\w+)\s*;")
_TYPENAMES = re.compile(r"(?:typename|class)\s+(\w+)")


def aliases(code: str) -> dict[str, str]:
    """`using Int = int32_t;` and `typedef int Int;` of the label's code: name → type. A name
    bound to several types names none of them (a dtype dispatch's `using scalar_t = float;`,
    then `double` in the next branch)."""
    out: dict[str, str] = {}
    several: set[str] = set()
    for m in _ALIAS.finditer(code):
        name, target = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        target = " ".join(target.split())
        if out.setdefault(name, target) != target:
            several.add(name)
    return {k: v for k, v in out.items() if k not in several}


def _resolved(core: str, names: dict[str, str]) -> str:
    """The type with its aliases replaced (`RuleBook`: `std::vector<std::vector<int32_t>>`)."""
    for _ in range(4):
        new = re.sub(r"[A-Za-z_]\w*", lambda m: names.get(m.group(0), m.group(0)), core)
        if new == core:
            break
        core = new
    return core


def _arith(core: str, names: dict[str, str]) -> str:
    """ "int", "float", "bool" or "" for what a type (through aliases) is."""
    core = _resolved(core, names).replace("std::", "")
    if core == "bool":
        return "bool"
    if core in _FLOATING:
        return "float"
    words = core.split()
    return "int" if words and all(w in _INTEGRAL for w in words) else ""


_SCALAR_TYPES = {"float": "at::kFloat", "double": "at::kDouble"}
_VECTOR = re.compile(r"(?:std::)?vector\s*<\s*(.+?)\s*>")


def _rows(ptype: str, names: dict[str, str]) -> tuple[str, bool] | None:
    """(element type, nested) for a `const` reference to a vector of numbers, or to a vector
    of such rows (SparseConvNet's `const RuleBook &`, `std::vector<std::vector<Int>>`), read
    from a tensor: its numbers, as one row."""
    core = " ".join(ptype.split())
    if not (core.startswith("const ") and core.endswith("&")) or "*" in core:
        return None
    m = _VECTOR.fullmatch(_resolved(core[len("const ") : -1].strip(), names))
    inner = _VECTOR.fullmatch(m.group(1)) if m else None
    elem = inner.group(1) if inner else (m.group(1) if m else "")
    return (elem, bool(inner)) if elem and _arith(elem, names) == "int" else None


def adapt(
    sig: Signature,
    code: str,
    dtypes: tuple[str, ...] = ("float", "double"),
    classes: dict[str, BoundClass] | None = None,
    launch: str = "",
) -> tuple[Signature, str] | None:
    """The adapter's signature and text for launcher `sig`, or None when a parameter is
    neither a pointer to numbers, a number, nor an object of one of `classes` (the bound
    classes: wrappers.bound_class), or what it returns is neither a number nor bindable.
    A template launcher is instantiated only for `dtypes` that its unit compiled with
    (SparseConvNet's double convolution asks for more shared memory than a block has).
    `launch`: the `<<<...>>>` of a kernel adapted itself (wrappers.kernel_twin), checked."""
    typenames = _TYPENAMES.findall(sig.template)
    if sig.template and (len(typenames) != 1 or "," in sig.template):
        return None  # only `template <typename T>`: one dtype to dispatch on
    names, classes = aliases(code), classes or {}
    number = "" if sig.returns == "void" else _arith(sig.returns, names)
    if number:  # a number comes back as a Python number (SparseConvNet's flop count)
        host_return = {"bool": "bool", "float": "double", "int": "int64_t"}[number]
    elif sig.returns == "void" or bindable_type(_resolved(sig.returns, names)):
        host_return = _resolved(sig.returns, names)  # tensors come back as they are
    else:
        return None
    params, call, dispatch, prelude = [], [], "", ""
    staged = staging(code, sig.name, sig.params) if code else None
    buffers: list[tuple[str, str]] = []
    for i, (ptype, pname) in enumerate(sig.params):
        name = pname or f"arg{i}"
        core = " ".join(re.sub(r"\b(const|volatile|__restrict__|__restrict)\b", " ", ptype).split())
        named = object_type(ptype)  # as written, or through the label's aliases
        cls = next((classes[k] for k in (named, _resolved(named, names)) if k in classes), None)
        if cls is not None and core.count("*") <= 1:  # built from its constructor's arguments
            made, line = construct(cls, name)
            params += made
            prelude += line
            call.append(f"&{name}" if core.endswith("*") else name)
            continue
        if core in _STREAM:  # the stream it launches on: the current one, as the label's own
            call.append("at::cuda::getCurrentCUDAStream()")
            continue
        if core.endswith("*") and core.count("*") == 1:
            base = core[:-1].strip()
            if typenames and base == typenames[0]:
                elem, dispatch = "scalar_t", dispatch or name
            elif _arith(base, names):
                elem = base
            else:
                return None
            if staged and name in staged.buffers:  # made here: its size is the copy's
                buffers.append((name, staged.buffers[name]))
                call.append(f"reinterpret_cast<{elem} *>(kminer_{name}.data_ptr())")
                continue
            params.append(("at::Tensor", name))
            if staged and name in staged.host_in:  # the launcher copies it from the host
                prelude += f"  auto kminer_{name} = {name}.to(at::kCPU).contiguous();\n"
                call.append(f"kminer_{name}.data_ptr<{elem}>()")
                continue
            call.append(f"{name}.data_ptr<{elem}>()")
            continue
        rows = _rows(ptype, names)
        if rows:  # a container of numbers the caller filled: a tensor's numbers here
            elem, nested = rows
            params.append(("at::Tensor", name))
            prelude += (
                f"  auto kminer_{name}_t = {name}.contiguous();\n"
                f"  std::vector<{elem}> kminer_{name}_row(kminer_{name}_t.data_ptr<{elem}>(),\n"
                f"      kminer_{name}_t.data_ptr<{elem}>() + kminer_{name}_t.numel());\n"
            )
            if nested:
                row = f"kminer_{name}_row"
                prelude += f"  std::vector<std::vector<{elem}>> kminer_{name}{{{row}}};\n"
            call.append(f"kminer_{name}" if nested else f"kminer_{name}_row")
            continue
        if "*" in core or "&" in core:
            return None
        kind = "float" if typenames and core == typenames[0] else _arith(core, names)
        resolved = _resolved(core, names)
        if not kind and bindable_type(resolved):  # a vector of numbers, a string
            params.append((resolved, name))
            call.append(name)
            continue
        if not kind:
            return None
        host = {"bool": "bool", "float": "double", "int": "int64_t"}[kind]
        params.append((host, name))
        target = "scalar_t" if typenames and core == typenames[0] else core
        call.append(f"static_cast<{target}>({name})")
    if typenames and not dispatch:
        return None
    host = staged.host_in if staged else set()
    on = next((n for t, n in params if t == "at::Tensor" and n not in host), "")
    if buffers and not on:
        return None
    for name, (size, src) in buffers:
        data = f"kminer_{src}.view(at::kByte).reshape(-1)"
        prelude += (
            f"  auto kminer_{name} = at::empty({{std::max<int64_t>(static_cast<int64_t>({size}), "
            f"{data}.numel())}}, {on}.options().dtype(at::kByte));\n"
            f"  kminer_{name}.narrow(0, 0, {data}.numel()).copy_({data});\n"
        )
    adapter = f"kminer_{sig.name}"
    decl = ", ".join(f"{t} {n}" for t, n in params)
    args = ", ".join(call)
    floating = [t for t in dtypes if t in _SCALAR_TYPES]
    if typenames and not floating:
        return None
    returned = host_return != "void"
    give = f"return static_cast<{host_return}>(" if number else ("return " if returned else "")
    close = ")" if number else ""
    checked = "    C10_CUDA_KERNEL_LAUNCH_CHECK();\n" if launch else ""
    if typenames:
        branches = "".join(
            f"  if ({dispatch}.scalar_type() == {_SCALAR_TYPES[t]}) {{\n"
            f"    using scalar_t = {t};\n"
            f"    {give}{sig.qualified}<scalar_t>{launch}({args}){close};\n"
            + checked
            + ("" if returned else "    return;\n")
            + "  }\n"
            for t in floating
        )
        only = " or ".join(floating)
        body = f'{branches}  TORCH_CHECK(false, "{sig.name}: {only} only");\n'
        if returned:
            body += f"  return {host_return}();\n"
    else:
        body = f"  {give}{sig.qualified}{launch}({args}){close};\n" + checked.replace("    ", "  ")
    body = prelude + body
    text = (
        f"// kminer adapter: {sig.name} takes device pointers; each is a tensor's data here\n"
        f"{host_return} {adapter}({decl}) {{\n{body}}}\n"
    )
    return Signature(adapter, adapter, host_return, params), text
