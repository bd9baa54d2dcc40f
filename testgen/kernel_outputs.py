"""Which outputs of its host function a kernel writes, where the function launches several.

PyTorch-Encoding's `ScaledL2_Backward_CUDA` launches `ScaledL2_GradX_kernel` into `GX_` and
`ScaledL2_GradC_kernel` into `GC_`, and returns `{GX_, GC_, GS_}`. Its CPU twin computes `GC`
with the opposite sign (the CUDA kernel is right: the repository's gradcheck runs on CUDA), so
every case of the GradX kernel's test disagreed on `GC` and was left out as outside the op's
contract: no valid case, kill rate 0 for a kernel that is correct. A kernel's row asks for that
kernel (the rest of the file is given), so its test compares the outputs it writes; another
kernel's output is that kernel's row's to check. Read from the label: the kernel's parameters it
stores through, the launch's arguments for them, and the host variables those come from, back
to a returned tensor or a tensor argument. When nothing can be traced, or the kernel writes
none of the outputs directly (a buffer another kernel reads), every output stays compared.
"""

from __future__ import annotations

import re

from testgen.argmap import paren_args
from testgen.variants import _Kernel

_NOT_A_TENSOR = frozenset(
    "static_cast reinterpret_cast const_cast data_ptr data packed_accessor32 packed_accessor64 "
    "accessor scalar_t float double int long half at torch c10 std void const unsigned "
    "contiguous devicetensor DeviceTensor".split()
)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_RETURN_LIST = re.compile(r"\breturn\s*(?:std::make_tuple\s*\(|\{)([^;]*?)[)}]\s*;")
# a tensor made anew (`at::zeros({n}, vol.options())`): what it is made like is not where it is
_MADE = re.compile(r"\b(?:zeros|empty|ones|full|rand\w*|arange)(?:_like)?\s*\(|\.options\s*\(")
_RETURN_ONE = re.compile(r"\breturn\s+([A-Za-z_]\w*)\s*;")


def _host_body(label_text: str, function: str) -> str:
    """The text of the host function's definition in the label ('' when not found)."""
    for m in re.finditer(rf"\b{re.escape(function)}\s*\(", label_text):
        close = label_text.find(")", m.end())
        brace = label_text.find("{", m.end())
        semi = label_text.find(";", m.end())
        if brace < 0 or (0 <= semi < brace and label_text[close + 1 : semi].strip() == ""):
            continue
        depth = 0
        for j in range(brace, len(label_text)):
            depth += (label_text[j] == "{") - (label_text[j] == "}")
            if depth == 0:
                return label_text[m.start() : j + 1]
    return ""


def _roots(expr: str, body: str, names: set[str], hops: int = 4) -> set[str]:
    """The host tensors (`names`) an argument expression comes from, through local
    definitions (`DeviceTensor<T, 3> GX = devicetensor<T, 3>(GX_);`)."""
    found: set[str] = set()
    todo, seen = [expr], set()
    for _ in range(hops):
        nxt = []
        for e in todo:
            for ident in _IDENT.findall(e):
                if ident in _NOT_A_TENSOR or ident in seen:
                    continue
                seen.add(ident)
                if ident in names:
                    found.add(ident)
                    continue
                d = re.search(rf"\b{re.escape(ident)}\s*=\s*([^;]*);", body)
                if d and not _MADE.search(d.group(1)):  # a view of a tensor, not a new one
                    nxt.append(d.group(1))
        todo = nxt
    return found


def _launch_args(body: str, kernel: str) -> list[str] | None:
    """The arguments of the first `kernel<...><<<...>>>(...)` launch in the body."""
    m = re.search(rf"\b{re.escape(kernel)}\s*(?:<[^;]*?>)?\s*<<<[^;]*?>>>\s*\(", body)
    return paren_args(body, m.end() - 1) if m else None


def _returned(body: str) -> list[str]:
    m = _RETURN_LIST.search(body)
    if m:
        return [a.strip() for a in m.group(1).split(",")]
    one = _RETURN_ONE.search(body)
    return [one.group(1)] if one else []


def _writes(label_text: str, kernel: str, params: list[str]) -> list[int] | None:
    """Positions of the kernel's parameters it stores through (directly or by an atomic)."""
    try:
        k = _Kernel(label_text, kernel.split("::")[-1])
    except ValueError:
        return None
    written = {k.root(d.target) for d in k.stores if d.target is not None}
    return [i for i, p in enumerate(params) if p in written]


def unchecked(
    label_text: str, kernel: str, kernel_params: list[str], function: str, host_params: list[str]
) -> tuple[list[int], list[int]]:
    """(returned outputs, arguments) of `function` that other kernels of the label write and
    `kernel` does not: left out of its test's comparison. ([], []) when not traced."""
    body = _host_body(label_text, function)
    others = [n for n in re.findall(r"\b(\w+)\s*(?:<[^;<>]*(?:<[^;<>]*>[^;<>]*)*>)?\s*<<<", body)
              if n != kernel.split("::")[-1]]  # fmt: skip
    if not body or not others:
        return [], []
    returned = _returned(body)
    names = set(returned) | set(host_params)

    def written_by(name: str) -> set[str] | None:
        params = kernel_params if name == kernel.split("::")[-1] else _params_of(label_text, name)
        args = _launch_args(body, name)
        at = _writes(label_text, name, params) if params else None
        if args is None or at is None:
            return None
        return set().union(*(_roots(args[i], body, names) for i in at if i < len(args)))

    mine = written_by(kernel.split("::")[-1])
    if not mine:
        return [], []
    theirs = set()
    for other in dict.fromkeys(others):
        got = written_by(other)
        if got is None:
            return [], []
        theirs |= got
    skip = theirs - mine
    return (
        [i for i, r in enumerate(returned) if r in skip],
        [i for i, p in enumerate(host_params) if p in skip],
    )


def _params_of(label_text: str, kernel: str) -> list[str]:
    """A kernel's parameter names, from its definition in the label."""
    m = re.search(rf"__global__\s+[^;{{]*?\b{re.escape(kernel)}\s*\(", label_text)
    if not m:
        return []
    depth, start = 0, m.end() - 1
    for j in range(start, len(label_text)):
        depth += (label_text[j] == "(") - (label_text[j] == ")")
        if depth == 0:
            inner = label_text[start + 1 : j]
            break
    else:
        return []
    out = []
    for part in re.split(r",(?![^<>]*>)", inner):
        ids = _IDENT.findall(part.split("=")[0])
        out.append(ids[-1] if ids else "")
    return out
