"""Many labels in one translation unit: the text side of kminer's batched builds.

Kept free of kminer's other modules (standard library only) so that the same code runs on a
GPU machine that has nothing but python and torch (benchmarks/label_build.py, the verification
bundle).
"""

from __future__ import annotations

import itertools
import re

BODY_BEGIN = "// kminer-label-body-begin"
BODY_END = "// kminer-label-body-end"
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)", re.MULTILINE)
_MDEF = re.compile(r'\bm\.def\(\s*"(\w+)"')


def split_label(text: str) -> tuple[list[str], str]:
    """(include block lines, body) of a label rendered from prompts/label.cu.j2."""
    head, _, rest = text.partition(BODY_BEGIN)
    body, _, _ = rest.partition(BODY_END)
    lines = head.splitlines()
    start = next((i for i, ln in enumerate(lines) if "torch/extension.h" in ln), -1) + 1
    return [ln for ln in lines[start:] if ln.strip()], body.strip("\n")


def _include_units(lines: list[str]) -> list[list[str]]:
    """Include lines grouped so that an `#if ... #endif` block stays whole."""
    units, group, depth = [], [], 0
    for line in lines:
        word = line.lstrip()[1:].lstrip().split(" ", 1)[0] if line.lstrip().startswith("#") else ""
        if word.startswith("if"):
            depth += 1
        group.append(line)
        if word == "endif":
            depth -= 1
        if depth == 0:
            units.append(group)
            group = []
    return units + ([group] if group else [])


def batch_source(
    labels: list[tuple[str, str]], module: str | None = "kminer_batch", register: str | None = None
) -> tuple[str, dict[int, set[str]]]:
    """One translation unit for many labels; also which labels asked for each include line.

    With `module` the unit defines that Python module (one submodule `c_<id>` per label); with
    `register` it defines `void <register>(pybind11::module_&)` instead, so several units can
    be linked into one extension whose module is defined elsewhere (see `module_source`)."""
    out = ["#include <torch/extension.h>", "#define KMINER_BATCH 1"]
    owners: dict[int, set[str]] = {}
    placed: dict[str, range] = {}
    bodies: list[tuple[str, str]] = []
    for cid, text in labels:
        includes, body = split_label(text)
        for unit in _include_units(includes):
            key = "\n".join(x.strip() for x in unit)
            if key not in placed:
                placed[key] = range(len(out) + 1, len(out) + len(unit) + 1)
                out.extend(unit)
            for line_no in placed[key]:
                owners.setdefault(line_no, set()).add(cid)
        bodies.append((cid, body))
    hoisted: set[str] = set()
    for cid, body in bodies:
        macros = sorted(set(_DEFINE.findall(body)))
        body = _requalify(body, f"kminer_{cid}")
        body, operators = _global_operators(body)
        for text in operators:  # once per batch: two labels may carry the same one
            if text not in hoisted:
                hoisted.add(text)
                out.append(text)
        libraries = sorted(set(_NAMESPACE_LINE.findall(body)) & _LIBRARY_NAMESPACES)
        out += [
            f"namespace kminer_{cid} {{",
            *[f"using ::{name};" for name in sorted(set(_INTRINSIC_OVERLOAD.findall(body)))],
            *[f"namespace {name} {{ using namespace ::{name}; }}" for name in libraries],
            f'#line 2 "kminer_{cid}.cu"',  # as if the namespace line were line 1
            body,
            f"}}  // namespace kminer_{cid}",
            *[f"#undef {m}" for m in macros],
        ]
    out.append(f'#line {sum(x.count(chr(10)) + 1 for x in out) + 2} "batch.cu"')
    out.append(
        f"void {register}(pybind11::module_& m) {{"
        if register
        else f"PYBIND11_MODULE({module}, m) {{"
    )
    out += [
        f'  {{ auto s = m.def_submodule("c_{cid}"); kminer_{cid}::kminer_bind(s); }}'
        for cid, _ in bodies
    ]
    out.append("}")
    return "\n".join(out) + "\n", owners


# A repository may overload a CUDA intrinsic at global scope (pytorch_scatter: __shfl_up_sync
# for at::Half; torchsparse: atomicCAS for int8_t, built on the int one), or a vector
# constructor or math function (NVIDIA's helper_math.h, vendored far and wide: `float2
# make_float2(float s) { return make_float2(s, s); }`, `float2 fminf(float2, float2)`). Inside
# the label's namespace that overload would hide the global ones (the bfloat16 __shfl_up_sync,
# the `atomicCAS(int *, int, int)` it calls, CUDA's two-float make_float2), so the namespace
# brings them back with a using-declaration. Only names CUDA's runtime headers declare.
_INTRINSIC_OVERLOAD = re.compile(
    r"^[^=;/(]*__device__[^=;(]*[\s*&](__shfl\w*|__ldg\w*"
    r"|atomic(?:Add|Sub|Exch|Min|Max|Inc|Dec|CAS|And|Or|Xor)(?:_block|_system)?"
    r"|make_(?:u?char|u?short|u?int|u?long|u?longlong|float|double)[1-4]"
    r"|f?min|f?max|fminf|fmaxf|floorf?|ceilf?|truncf?|roundf?|fabsf?|sqrtf?|rsqrtf|fmodf?"
    r"|expf?|logf?|powf?|sinf?|cosf?|tanhf?)\s*\(",
    re.MULTILINE,
)
_NAMESPACE_LINE = re.compile(r"^namespace (\w+) \{", re.MULTILINE)
# A repository may put its host functions in a library's namespace (longcw/RoIAlign.pytorch:
# `namespace torch { void crop_and_resize_gpu_forward(torch::Tensor image, ...) }`): inside the
# label's namespace that opens `kminer_<id>::torch`, where `torch::Tensor` finds nothing, so the
# label's own namespace of that name sees the library's through a using-directive. Only the
# namespaces torch/extension.h, included first, has declared.
_LIBRARY_NAMESPACES = {"torch", "at", "c10", "std", "pybind11"}
# An operator a repository defines at global scope for CUDA's own vector types (mamba:
# `float2 operator+(const float2 &, const float2 &)`, which `cub::BlockReduce<float2>::Sum`
# finds by argument-dependent lookup): inside the label's namespace no lookup from CUB's code
# finds it, so it stays at global scope, ahead of the namespace, once per batch.
_VECTOR_TYPE = (
    r"(?:const\s+)?(?:__)?(?:float|double|u?int|u?short|u?char|u?long(?:long)?|half|nv_bfloat16)"
    r"[1-4]\s*&?\s*\w*"
)
_GLOBAL_OPERATOR = re.compile(
    r"^(?:(?:inline|static|__host__|__device__|__forceinline__|constexpr)\s+)*[\w:]+\s*&?\s*"
    rf"operator\s*[-+*/%^&|]=?\s*\(\s*{_VECTOR_TYPE}\s*(?:,\s*{_VECTOR_TYPE}\s*)?\)\s*\{{",
    re.MULTILINE,
)


def _global_operators(body: str) -> tuple[str, list[str]]:
    """The body without its operators on CUDA vector types (blank lines in their place, so
    line numbers hold), and those operators' texts."""
    found = []
    for m in reversed(list(_GLOBAL_OPERATOR.finditer(body))):
        depth, end = 0, None  # (not miner.textprep's bracket_end: this module travels to the
        for j in range(m.end() - 1, len(body)):  # GPU box, which has only the stdlib and torch)
            depth += (body[j] == "{") - (body[j] == "}")
            if depth == 0:
                end = j + 1
                break
        if end is None:
            continue
        text = body[m.start() : end]
        found.append(text)
        body = body[: m.start()] + "\n" * text.count("\n") + body[end:]
    return body, found[::-1]


def _requalify(body: str, outer: str) -> str:
    """`::detail::x` names the global namespace; inside the label's namespace the body's own
    top-level namespaces live under `outer`, so such references are pointed there."""
    names = set(_NAMESPACE_LINE.findall(body))
    if not names:
        return body
    pattern = re.compile(r"(?<![\w>:])::\s*(" + "|".join(map(re.escape, sorted(names))) + r")\s*::")
    return pattern.sub(lambda m: f"::{outer}::{m.group(1)}::", body)


def module_source(register_fns: list[str]) -> str:
    """The C++ file that defines the extension module over several batch units."""
    decls = "".join(f"void {fn}(pybind11::module_& m);\n" for fn in register_fns)
    calls = "".join(f"  {fn}(m);\n" for fn in register_fns)
    return (
        f"#include <torch/extension.h>\n{decls}"
        f"PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{calls}}}\n"
    )


_ERROR_START = re.compile(
    r"^(?:\S.*?)(?:\(\d+\)|:\d+:\d+): (?:catastrophic |fatal )?error", re.MULTILINE
)


def blame(log: str, include_owner: dict[int, set[str]]) -> dict[str, str]:
    """label id -> its first error line, for every label an error of a batch's compiler log
    mentions (by the `#line` file name of its body, or an include line only it asked for).
    The log must name the batch file `batch.cu` or `batch.cpp`, without a folder."""
    blamed: dict[str, str] = {}
    starts = [m.start() for m in _ERROR_START.finditer(log)] + [len(log)]
    for a, b in itertools.pairwise(starts):
        block = log[a:b]
        first = " ".join(block.splitlines()[0].split())
        # the label whose file the error is in; the notes below may point into others (a
        # label that never closes its namespace has "to match this {" in the next one)
        ids = set(re.findall(r"kminer_([0-9A-Za-z_]+?)\.cu", block.splitlines()[0]))
        m = re.match(r"batch\.(?:cu|cpp)[(:](\d+)", block)
        if m:
            ids |= include_owner.get(int(m.group(1)), set())
        if not ids:  # an error in torch's headers: the labels its notes name
            ids = set(re.findall(r"kminer_([0-9A-Za-z_]+?)\.cu", block))
        for cid in ids:
            blamed.setdefault(cid, re.sub(r"^\S*kminer_\w+?\.cu", "label.cu", first)[:300])
    return blamed


def exposed_names(label_text: str) -> list[str]:
    """Python names a label's binding defines (its `m.def("...")` calls)."""
    return _MDEF.findall(split_label(label_text)[1])
