"""Write the standalone `.cu` of one kernel: includes, its closure in compiler order, the kernel,
and for a template a host stub that launches it for concrete types.

The stub launches rather than explicitly instantiates: `template __global__ void k<float>(...)`
makes cudafe++ instantiate the body in the host pass, which fails on helpers defined only under
`__CUDA_ARCH__`; a `<<<>>>` launch instantiates it the way the repository's own launcher does.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from miner.candidate import Reason
from miner.closure import LIBRARY_NAMESPACES, Closure
from miner.filemodel import FileModel, KernelDef
from miner.includes import exists_on_system, is_torch_header
from miner.linearize import Entry

PRELUDE = ("cuda_runtime.h", "cuda_fp16.h", "cfloat", "cstdint", "cassert", "cmath", "cstdio")
TORCH_PRELUDE = (
    "c10/util/Half.h",
    "c10/util/BFloat16.h",
    "c10/macros/Macros.h",
    "ATen/core/TensorAccessor.h",
)
# torch headers that pull in all of ATen (or Python): 10 s become 40-80 s per unit
HEAVY_TORCH = frozenset(
    {
        "torch/extension.h",
        "torch/all.h",
        "torch/torch.h",
        "torch/types.h",
        "torch/script.h",
        "torch/python.h",
        "ATen/ATen.h",
        "ATen/Functions.h",
        "ATen/cuda/CUDAContext.h",
        "ATen/cuda/CUDAApplyUtils.cuh",
        "Python.h",
    }
)
HEAVY_TORCH_DIRS = ("pybind11/", "torch/csrc/", "THC/THC.h")
# what device code can use from a heavy header, included instead of it
LIGHT_FOR_HEAVY = {
    "ATen/cuda/CUDAApplyUtils.cuh": ("ATen/cuda/Atomic.cuh", "ATen/cuda/detail/IndexUtils.cuh"),
}
DTYPES = ("float", "double", "half")
_TENSOR_TYPE = re.compile(r"\b(?:at|torch)\s*::\s*Tensor\b")
INST_BEGIN = "// kminer-inst-begin "
INST_END = "// kminer-inst-end "
_BUILTIN_TYPES = frozenset(
    """
int unsigned long short char bool float double int8_t int16_t int32_t int64_t uint8_t
uint16_t uint32_t uint64_t size_t
""".split()
)
# a template type parameter that holds indices, sizes or counts, not the data: `index_t`,
# `size_type`, `coordinate_int_type`, `MapItype` (an integer type by its name), never a dtype
_INDEX_NAME = re.compile(
    r"^(?:index|idx|int|integer|i)(?:_?t(?:ype)?)?$|^(?:index|idx)\w*$"
    r"|^(?:size|count|offset|length)_?t(?:ype)?$|_int(?:_t|_type)?$|_int_"
    r"|(?-i:[a-z]I(?:type|Type|T)$|^Itype$)",
    re.IGNORECASE,
)


@dataclass
class RenderedUnit:
    text: str
    hash: str
    needs_torch: bool
    instantiations: list[str]
    spans: list[tuple[int, int]]  # per closure entry: first and last line in `text`


def half_type(needs_torch: bool) -> str:
    return "at::Half" if needs_torch else "__half"


_THRUST_FUNCTIONAL = re.compile(r"\bthrust\s*::\s*(?:unary|binary)_function\b")
# CCCL 3 (CUDA 13) removed thrust's C++98 function-object bases, which older device code
# still derives its functors from (MinkowskiEngine); they come back as CCCL 2 had them
THRUST_COMPAT = """\
// kminer: thrust::unary_function / binary_function, removed in CCCL 3, as CCCL 2 defined them
#include <thrust/version.h>
#if THRUST_MAJOR_VERSION >= 3
namespace thrust {
template <typename Argument, typename Result>
struct unary_function { typedef Argument argument_type; typedef Result result_type; };
template <typename Argument1, typename Argument2, typename Result>
struct binary_function {
  typedef Argument1 first_argument_type;
  typedef Argument2 second_argument_type;
  typedef Result result_type;
};
}  // namespace thrust
#endif"""


# THC's device helpers (THCDeviceUtils.cuh, also reached through THC/THC.h), which torch no
# longer ships: device code of old extensions calls them; guarded, so a label whose legacy block
# (wrappers/legacy.py) defines them too has them once
THC_DEVICE_COMPAT = """\
// kminer: THCCeilDiv and THCRoundUp, which torch's THC headers defined before they were removed
#ifndef KMINER_THC_DEVICE_UTILS
#define KMINER_THC_DEVICE_UTILS 1
template <typename T>
__host__ __device__ __forceinline__ T THCCeilDiv(T a, T b) { return (a + b - 1) / b; }
template <typename T>
__host__ __device__ __forceinline__ T THCRoundUp(T a, T b) { return THCCeilDiv(a, b) * b; }
#endif"""
_THC_DEVICE_USE = re.compile(r"\bTHC(?:CeilDiv|RoundUp)\b")
_THC_DEVICE_DEF = re.compile(
    r"\bTHC(?:CeilDiv|RoundUp)\s*\([^()]*\)\s*(?:const\s*)?\{|#\s*define\s+THC(?:CeilDiv|RoundUp)\b"
)

# ATen's grid-stride loop macro (<ATen/cuda/detail/KernelUtils.h>), which kernels of code that
# grew out of ATen use without including it: ATen's own text, so a label with both has it once
KERNEL_LOOP_COMPAT = """\
// kminer: CUDA_KERNEL_LOOP as ATen's <ATen/cuda/detail/KernelUtils.h> defines it
#ifndef CUDA_KERNEL_LOOP
#define CUDA_KERNEL_LOOP_TYPE(i, n, index_type)                         \\
  int64_t _i_n_d_e_x = ((int64_t) blockIdx.x) * blockDim.x + threadIdx.x;           \\
  for (index_type i=_i_n_d_e_x; _i_n_d_e_x < (n); _i_n_d_e_x+=blockDim.x * gridDim.x, i=_i_n_d_e_x)
#define CUDA_KERNEL_LOOP(i, n) CUDA_KERNEL_LOOP_TYPE(i, n, int)
#endif"""
_KERNEL_LOOP_USE = re.compile(r"\bCUDA_KERNEL_LOOP(?:_TYPE)?\s*\(")
_KERNEL_LOOP_DEF = re.compile(r"#\s*define\s+CUDA_KERNEL_LOOP\b")
# at::cuda::ATenCeilDiv comes with <ATen/cuda/CUDAApplyUtils.cuh>, a heavy header a unit leaves
# out (LIGHT_FOR_HEAVY); detectron2's nms_rotated kernel calls it in device code
ATEN_CEIL_DIV_COMPAT = """\
// kminer: at::cuda::ATenCeilDiv as <ATen/cuda/ApplyGridUtils.cuh> defines it (without the CUDA
// context that header includes)
#ifndef KMINER_ATEN_CEIL_DIV
#define KMINER_ATEN_CEIL_DIV 1
namespace at { namespace cuda {
template <typename T>
__host__ __device__ __forceinline__ T ATenCeilDiv(T a, T b) { return (a + b - 1) / b; }
} }
#endif"""
_ATEN_CEIL_DIV_USE = re.compile(r"\bATenCeilDiv\s*[(<]")
_ATEN_CEIL_DIV_DEF = re.compile(r"\w\s+ATenCeilDiv\s*\([^()]*\)\s*\{")
# (a use, the repository's own definition, the block defining it again) of names torch removed
# or keeps only in headers a unit leaves out
_REMOVED_NAMES = (
    (_THC_DEVICE_USE, _THC_DEVICE_DEF, THC_DEVICE_COMPAT),
    (_KERNEL_LOOP_USE, _KERNEL_LOOP_DEF, KERNEL_LOOP_COMPAT),
    (_ATEN_CEIL_DIV_USE, _ATEN_CEIL_DIV_DEF, ATEN_CEIL_DIV_COMPAT),
)

# standard names a repository's code often gets through torch's headers (a full ATen include
# brings <iomanip> and <sstream>), which a unit's lighter includes do not
_STD_HEADER_OF = {
    "setprecision": "iomanip",
    "setw": "iomanip",
    "setfill": "iomanip",
    "stringstream": "sstream",
    "ostringstream": "sstream",
    "istringstream": "sstream",
    "cout": "iostream",
    "cerr": "iostream",
}
_STD_USE = re.compile(r"\bstd\s*::\s*(" + "|".join(_STD_HEADER_OF) + r")\b")
# toolkit and c10 headers whose names code gets through a heavy header a unit leaves out
# (torch/extension.h brings cuda.h and cuda_bf16.h): flash-fft-conv's `c10::complex<at::Half>`,
# its `set_value(__nv_bfloat162*, ...)` overloads, `#if CUDA_VERSION >= 9000` picking
# `__shfl_xor_sync` over the removed `__shfl_xor`
_HEADER_OF_USE = (
    (re.compile(r"\bc10\s*::\s*complex\b"), "c10/util/complex.h"),
    (re.compile(r"\b__nv_bfloat162?\b|\b__float22?bfloat162?_rn\b"), "cuda_bf16.h"),
    (re.compile(r"\bCUDA_VERSION\b"), "cuda.h"),
)


def compat_lines(closure: Closure, models: dict[str, FileModel]) -> list[str]:
    """What today's toolkit (CCCL, torch's THC) removed and the closure's code still uses, defined
    again, and the standard headers its code uses without including them."""
    texts = [e.item.source(models[e.item.file].text) for e in closure.entries]
    included = {e.header for e in closure.externals}
    wanted = {_STD_HEADER_OF[m] for t in texts for m in _STD_USE.findall(t)}
    wanted |= {h for use, h in _HEADER_OF_USE if any(map(use.search, texts))}
    if not closure.needs_torch:
        wanted.discard("c10/util/complex.h")
    wanted -= included
    lines = [f"#include <{h}>" for h in sorted(wanted)]
    if any(_THRUST_FUNCTIONAL.search(t) for t in texts):
        lines += THRUST_COMPAT.splitlines()
    for use, own, block in _REMOVED_NAMES:
        if any(map(use.search, texts)) and not any(map(own.search, texts)):
            lines += block.splitlines()
    return lines


def render_unit(
    kdef: KernelDef,
    closure: Closure,
    models: dict[str, FileModel],
    header: str,
    site_args: list[list[str]],
    dtypes: tuple[str, ...] = DTYPES,
) -> RenderedUnit:
    """The unit's text. `site_args` holds the template arguments written at each launch."""
    out = [f"// {line}" for line in header.splitlines()]
    out += [f"#include <{h}>" for h in PRELUDE]
    if closure.needs_torch:
        out += [f"#include <{h}>" for h in TORCH_PRELUDE]
        out.append("namespace torch { using namespace at; }  // as <torch/types.h> has it")
        if "acc_type" in closure.torch_names:
            out.append("#include <ATen/AccumulateType.h>")
    out += _externals(closure)
    out += compat_lines(closure, models)
    # host code in the closure (a class's methods beside its device ones) that names the
    # tensor type itself needs its declaration, which the light prelude leaves out
    if closure.needs_torch and any(
        _TENSOR_TYPE.search(e.item.source(models[e.item.file].text)) for e in closure.entries
    ):
        out.append("#include <ATen/core/Tensor.h>")
    out.append("")
    spans: list[tuple[int, int]] = []
    out += _body(closure.entries, models, len(out), spans)
    instantiations: list[str] = []
    if kdef.template_params and not kdef.specialization:
        body = models[kdef.item.file].code[kdef.start : kdef.end]
        stub, instantiations = launch_stub(kdef, closure, site_args, dtypes, body)
        out.append(stub)
    text = "\n".join(out) + "\n"
    return RenderedUnit(
        text,
        hashlib.sha256(text.encode("latin-1")).hexdigest()[:20],
        closure.needs_torch,
        instantiations,
        spans,
    )


def _externals(closure: Closure, all_torch: bool = False) -> list[str]:
    """The closure files' own includes; torch ones only when light and the unit needs torch
    (`all_torch`: every torch include, for host code such as mined launchers)."""
    lines: list[str] = []
    seen = set(PRELUDE) | (set() if all_torch else set(TORCH_PRELUDE))
    for ext in closure.externals:
        h = ext.header
        if h in seen:
            continue
        if is_torch_header(h) and all_torch:
            pass
        elif is_torch_header(h):
            if not closure.needs_torch:
                continue
            if h in HEAVY_TORCH or h.startswith(HEAVY_TORCH_DIRS):
                for light in LIGHT_FOR_HEAVY.get(h, ()):
                    if light not in seen:
                        seen.add(light)
                        lines += _guarded([f"#include <{light}>"], ext.guards)
                continue
        elif not exists_on_system(h):
            continue
        seen.add(h)
        inc = f"#include <{h}>"
        lines += _guarded([inc], ext.guards)
    return lines


def missing_headers(closure: Closure) -> list[str]:
    """Headers the closure includes that are neither in the repository nor on this machine."""
    found = [e.header for e in closure.externals]
    return sorted({h for h in found if not is_torch_header(h) and not exists_on_system(h)})


def explain_missing(missing: list[str], reason, detail: str) -> tuple:
    """(reason, detail) of a compile or build error: `missing_header` when the closure lacked
    headers (the error is their absence, whatever the compiler says it tripped on)."""
    if not missing or reason not in (Reason.COMPILE_ERROR, Reason.BUILD_ERROR):
        return reason, detail
    where = "not in the repository, not on this machine"
    return Reason.MISSING_HEADER, f"{', '.join(missing[:3])} not found ({where}): {detail}"


def render_host_code(closure: Closure, models: dict[str, FileModel]) -> tuple[list[str], str]:
    """Includes and body of host code (a launcher and what it needs, kernels included) for a
    label: the repository's torch includes are kept, since host code calls into ATen."""
    includes = [f"#include <{h}>" for h in PRELUDE] + _externals(closure, all_torch=True)
    return includes, "\n".join(_body(closure.entries, models, 0, []))


def _guarded(lines: list[str], guards: tuple[str, ...]) -> list[str]:
    if not guards:
        return lines
    cond = " && ".join(f"({g})" for g in guards)
    return [f"#if {cond}", *lines, "#endif"]


def _ns_open(ns: tuple[str, ...]) -> list[str]:
    return [f"{n} {{" if n.startswith("extern") else f"namespace {n} {{" for n in ns]


def _ns_close(ns: tuple[str, ...]) -> list[str]:
    return ["}" + f"  // {n}" for n in reversed(ns)]


def _body(
    entries: list[Entry], models: dict[str, FileModel], first: int, spans: list[tuple[int, int]]
) -> list[str]:
    """Items re-wrapped in namespaces and guards; records each item's line span in `spans`.
    A namespace named by a macro whose items all share guards has them around it too: it was
    opened under them (robin_hood's C++11 fallback `namespace ROBIN_HOOD_STD {`, where
    ROBIN_HOOD_STD is `std` otherwise) and must not open when they are false, or
    `robin_hood::std` hides `std::swap` from the code that follows. (Another namespace opens
    as before: empty, it is harmless, and a later `using namespace` may need it.)"""
    lines: list[str] = []
    defined_macros: set[str] = set()
    macros = {n for e in entries if e.item.kind == "macro" for n in e.item.names}
    for ns, run in _namespace_runs(entries):
        common = _common_guards([e.guards for e in run]) if macros.intersection(ns) else ()
        if common:
            lines.append("#if " + " && ".join(f"({g})" for g in common))
        lines += _ns_open(ns)
        for entry in run:
            item = entry.item
            text = item.source(models[item.file].text).rstrip("\n")
            chunk = [f"// {item.file}:{item.line}"]
            if item.kind == "macro":
                name = item.names[0] if item.names else ""
                if name in defined_macros:
                    chunk.append(f"#undef {name}")
                defined_macros.add(name)
            own = entry.guards[len(common) :]
            # one list element per line, so that list positions are line numbers
            start = first + len(lines) + 1 + len(chunk) + (1 if own else 0)
            text_lines = text.split("\n")
            spans.append((start, start + len(text_lines) - 1))
            lines += _guarded(chunk + text_lines, own)
        lines += _ns_close(ns)
        if common:
            lines.append("#endif")
    return lines


def _namespace_runs(entries: list[Entry]) -> list[tuple[tuple[str, ...], list[Entry]]]:
    """Consecutive entries of one namespace. A macro belongs to the run it sits in when it has
    the guards of the entry before it; otherwise it stands outside any namespace (a `#define`
    has none), so that it never stops a run's shared guards from holding for the run."""
    runs: list[tuple[tuple[str, ...], list[Entry]]] = []
    for entry in entries:
        item = entry.item
        ns = tuple(item.namespace)
        if item.kind == "macro":
            inside = runs and runs[-1][1][-1].guards == entry.guards
            ns = runs[-1][0] if inside else ()
        if runs and runs[-1][0] == ns:
            runs[-1][1].append(entry)
        else:
            runs.append((ns, [entry]))
    return runs


def _common_guards(guards: list[tuple[str, ...]]) -> tuple[str, ...]:
    common = []
    for parts in zip(*guards, strict=False):  # stops at the shortest
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return tuple(common)


def _constant(arg: str, known: set[str]) -> bool:
    """A template argument usable outside its launch site: literals and unit-level names."""
    words = re.findall(r"(?<![\w.])[A-Za-z_]\w*", arg)
    return bool(arg) and all(w in known or w in ("true", "false") for w in words)


def _object_of(kdef: KernelDef, type_name: str, body: str) -> bool:
    """Whether a kernel parameter of type `type_name` (or a pointer to one) is used as an
    object: `table.insert(...)`, `view->size`."""
    for ptype, pname, _ in kdef.params:
        core = re.sub(r"\bconst\b|[*&\s]", "", ptype)
        if (
            pname
            and core == type_name
            and re.search(rf"\b{re.escape(pname)}\s*(?:\.|->)\s*[A-Za-z_]", body)
        ):
            return True
    return False


def _enum_first(type_text: str, closure: Closure) -> str | None:
    name = type_text.split("::")[-1].strip()
    for e in closure.entries:
        it = e.item
        if it.kind == "type" and len(it.names) > 1 and it.names[0] == name:
            return f"{type_text.strip()}::{it.names[1]}"
    return None


def _concrete_type(arg: str, known: set[str]) -> bool:
    """A type written at a launch that names one type anywhere (`c10::complex<float>`, a struct
    of the closure), not a dtype placeholder of the launcher (`scalar_t`, `acc_type<scalar_t>`)."""
    if arg in _BUILTIN_TYPES or not re.search(r"::|<", arg):
        return False
    words = re.findall(r"[A-Za-z_]\w*(?=\s*::)|(?<!::)(?<![\w])[A-Za-z_]\w*", arg)
    # names of the libraries a unit can include, torch's among them
    allowed = LIBRARY_NAMESPACES | {"at", "c10", "torch", "const", "true", "false"}
    allowed |= _BUILTIN_TYPES | known
    return all(w in allowed for w in words)


def template_arguments(
    kdef: KernelDef, closure: Closure, site_args: list[list[str]], dtype: str, body: str = ""
) -> list[tuple[str, str, str]] | None:
    """(kind, name, value) per template parameter for one dtype; None if it cannot be chosen
    (`body`: the kernel's code, where a traits parameter shows as `Traits::`)."""
    chosen: list[tuple[str, str, str]] = []
    dtype_given = False
    known = {n for e in closure.entries for n in e.item.names}
    for pos, tp in enumerate(kdef.template_params):
        at_sites = [args[pos] for args in site_args if pos < len(args)]
        kind, name = tp["kind"], tp["name"]
        if kind == "pack":
            break
        if kind == "template":
            return None
        if kind == "type":
            if re.search(rf"\b{re.escape(name)}\s*::", body) or _object_of(kdef, name, body):
                return None  # a traits class or an object's class (a hash table's device view
                # whose members the kernel calls), not an element type: no dtype stands in
            literal = next((a for a in at_sites if a in _BUILTIN_TYPES), None)
            default = (tp["default"] or "").split()
            pinned = bool(at_sites) and all(_concrete_type(a, known) for a in at_sites)
            if pinned and len(set(at_sites)) == 1:  # every launch names the one type it runs
                value, dtype_given = at_sites[0], True
            elif _INDEX_NAME.search(name):
                value = literal or "int"
            elif default and set(default) <= _BUILTIN_TYPES - {"float", "double", "bool"}:
                value = literal or " ".join(default)  # `key_type = int64_t`: keys, no dtype
            elif not dtype_given:
                value, dtype_given = dtype, True
            else:
                value = literal or tp["default"] or dtype
            chosen.append(("type", name, value))
            continue
        ptype = tp["type"].strip()
        literal = next((a for a in at_sites if _constant(a, known)), None)
        value = literal or tp["default"]
        if not value:
            if ptype == "bool":
                value = "true"
            elif ptype in _BUILTIN_TYPES or ptype.startswith(("unsigned", "const")):
                value = "32"
            else:  # an enum's first value; else an integer alias (SCN's `Int`): 32, never a
                value = _enum_first(ptype, closure) or "32"  # zero-sized shared array
        chosen.append(("value", name, value))
    return chosen


def launch_stub(
    kdef: KernelDef,
    closure: Closure,
    site_args: list[list[str]],
    dtypes: tuple[str, ...],
    body: str = "",
) -> tuple[str, list[str]]:
    lines = ["", f"// kminer: launch {kdef.name} for concrete types"]
    made: list[str] = []
    params = []
    # a parameter pack is instantiated empty (template_arguments stops at it), so the function
    # parameters it types (`Args... args`) are not passed
    packs = [tp["name"] for tp in kdef.template_params if tp["kind"] == "pack" and tp["name"]]
    expands = (
        re.compile(rf"\b(?:{'|'.join(map(re.escape, packs))})\b[^,]*\.\.\.") if packs else None
    )
    for i, (_ptype, pname, ptext) in enumerate(kdef.params):
        if ptext in ("void", "...") or (expands and expands.search(ptext)):
            continue
        params.append((ptext if pname else f"{ptext} kminer_p{i}", pname or f"kminer_p{i}"))
    ns = tuple(n for n in kdef.namespace if not n.startswith("extern"))
    lines += _ns_open(ns)
    chosen = {}
    for dtype in dtypes:
        args = template_arguments(kdef, closure, site_args, _dtype_spelling(dtype, closure), body)
        if args is not None:
            chosen.setdefault(tuple(args), []).append(dtype)
    for args, alike in chosen.items():
        # a launch that pins its type gives every dtype one instantiation: named by the dtype
        # its type is made of (`c10::complex<double>`: double), else the first
        values = " ".join(v for _, _, v in args)
        dtype = next((d for d in alike if re.search(rf"\b{d}\b", values, re.I)), alike[0])
        made.append(dtype)
        aliases = []
        for kind, name, value in args:
            aliases.append(
                f"using {name} = {value};"
                if kind == "type"
                else f"constexpr auto {name} = {value};"
            )
        targs = ", ".join(name for _, name, _ in args)
        plist = ", ".join(p for p, _ in params)
        call_args = ", ".join(n for _, n in params)
        lines += [
            f"{INST_BEGIN}{dtype}",
            f"namespace kminer_inst_{dtype} {{",
            *aliases,
            f"void launch({plist}) {{ {kdef.name}<{targs}><<<1, 1>>>({call_args}); }}",
            "}",
            f"{INST_END}{dtype}",
        ]
    lines += _ns_close(ns)
    return "\n".join(lines), made


def _dtype_spelling(dtype: str, closure: Closure) -> str:
    return half_type(closure.needs_torch) if dtype == "half" else dtype


def drop_instantiations(text: str, dtypes: set[str]) -> str:
    """The unit without the launch stubs of `dtypes` (those the template does not allow)."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith(INST_BEGIN) and line[len(INST_BEGIN) :].strip() in dtypes:
            skipping = True
        if not skipping:
            out.append(line)
        if skipping and line.startswith(INST_END):
            skipping = False
    return "".join(out)


def instantiation_lines(text: str) -> dict[str, tuple[int, int]]:
    """dtype → (first, last) 1-based line of its launch stub."""
    spans: dict[str, tuple[int, int]] = {}
    start = 0
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith(INST_BEGIN):
            start = no
        elif line.startswith(INST_END):
            spans[line[len(INST_END) :].strip()] = (start, no)
    return spans
