"""A kernel whose CPU twin takes its very parameters, bound by itself.

Some repositories port each kernel to a CPU loop of the same parameter list: torchsparse's
`gather_kernel(n_k, n_in, c, in_feat, out_feat, kmap, transpose)` has `gather_cpu` with that
list. The op around such a kernel may have no CPU counterpart of its shape: the CUDA host
function `conv_forward_gather_scatter_cuda_fallback` runs a gather, a matmul and a scatter per
kernel offset, and the CPU op takes other arguments. A label over the kernel itself can be
checked against the twin one launch at a time: kminer's pointer adapter (wrappers.adapter)
takes a tensor per pointer and launches the kernel with the grid and block the repository's
own launch computes, read back to the kernel's parameters (`ceil((double)(n_active_feats *
n_in_channels) / 256)` at `gather_kernel<<<...>>>(n_active_feats, n_in_feats, n_in_channels,
...)` becomes `ceil((double)(n_k * c) / 256)`). testgen.reference calls the twin through an
adapter of its own over the same tensors.

The kernel label is chosen over the mined one only where no function the mined label exposes
has a twin of its own: an op-level CPU function checks the host code as well.
"""

from __future__ import annotations

import re

from miner.candidate import Kernel
from miner.filemodel import Item
from miner.repo_model import FoundKernel
from miner.sources import GPU_SOURCE
from miner.textprep import bracket_end, split_top
from wrappers.adapter import adapt
from wrappers.mined import LauncherIndex, launcher_candidates
from wrappers.opmap import TWINS
from wrappers.signature import Signature

_KERNEL_WORD = re.compile(r"_?(?:kernel|Kernel|KERNEL)$")
_DEVICE_WORD = re.compile(r"_?(?:cuda|gpu|CUDA|GPU|Cuda|Gpu)$")
_CPU_ENDINGS = ("_cpu", "_cpu_kernel", "CPU", "Cpu", "_cpu_impl")
# names a launch configuration may use besides the kernel's parameters and the code's own
# macros, functions and constants
_LANGUAGE = frozenset(
    "double float int long unsigned short char bool size_t int64_t int32_t uint32_t uint64_t uint "
    "static_cast const sizeof ceil floor ceilf floorf min max std at c10 dim3 scalar_t true "
    "false".split()
)
_IDENT = re.compile(r"(?<![\w.>:])[A-Za-z_]\w*")
_PLAIN_ARG = re.compile(r"^(?:\(\s*[\w\s:]+\)\s*|static_cast\s*<[^<>]+>\s*\(\s*)?(\w+)\s*\)?$")


def twin_names(kernel: str) -> list[str]:
    """Names a CPU twin of `kernel` may have: its device word swapped (`im2col_gpu_kernel`:
    `im2col_cpu_kernel`), or its stem with a CPU ending (`gather_kernel`: `gather_cpu`)."""
    out = [kernel.replace(a, b) for a, b in TWINS if a in kernel]
    stem = _DEVICE_WORD.sub("", _KERNEL_WORD.sub("", kernel))
    if stem and stem != kernel:
        out += [stem + ending for ending in _CPU_ENDINGS]
    return [n for n in dict.fromkeys(out) if n != kernel]


def has_twin(names: list[str], defined) -> bool:
    """Whether one of the host functions `names` has a twin by the op naming (`_cuda`/`_cpu`)."""
    return any(n.replace(a, b) != n and n.replace(a, b) in defined for n in names for a, b in TWINS)


def _defined_in(code: str, name: str) -> bool:
    n = re.escape(name)
    return bool(
        re.search(rf"^[ \t]*#[ \t]*define[ \t]+{n}\b", code, re.MULTILINE)
        or re.search(rf"\b{n}\s*\([^;{{}}]*\)\s*(?:const\s*)?(?:noexcept\s*)?\{{", code)
        or re.search(rf"\b(?:constexpr|const)\b[^;=(){{}}]*\b{n}\s*=", code)
        or re.search(rf"\benum\b[^;]*\{{[^}}]*\b{n}\b", code)
    )


def launch_config(kernel: Kernel, launcher_code: str, label_code: str) -> str | None:
    """The `<<<...>>>` arguments of the kernel's launch in `launcher_code` (comments blanked),
    over the kernel's parameter names; the stream is the current one. None when the launch
    reads a name that is neither a parameter the call passes as it is nor the code's own."""
    params = [p.name for p in kernel.params]
    name = re.escape(kernel.name)
    for m in re.finditer(rf"\b{name}\b\s*(?:<[^;{{}}]*?>)?\s*<<<", launcher_code):
        close = launcher_code.find(">>>", m.end())
        rest = launcher_code[close + 3 :] if close >= 0 else ""
        open_paren = close + 3 + len(rest) - len(rest.lstrip())
        if not rest.lstrip().startswith("("):
            continue
        end = bracket_end(launcher_code, open_paren, "(", ")")
        if end is None:
            continue
        args = split_top(launcher_code[open_paren + 1 : end - 1])
        if len(args) != len(params):
            continue
        renamed = {}
        for arg, param in zip(args, params, strict=True):
            plain = _PLAIN_ARG.match(arg.strip())
            if plain:
                renamed.setdefault(plain.group(1), param)
        config = split_top(launcher_code[m.end() : close])
        if not 2 <= len(config) <= 4:
            continue
        mapped = [_renamed(c, renamed, params, label_code) for c in config[:3]]
        if None in mapped:
            continue
        if len(mapped) == 2:  # no shared memory given
            mapped.append("0")
        return ", ".join([*mapped, "at::cuda::getCurrentCUDAStream()"])
    return None


def _renamed(expr: str, renamed: dict[str, str], params: list[str], code: str) -> str | None:
    unknown = False

    def one(m: re.Match) -> str:
        nonlocal unknown
        word = m.group(0)
        if word in renamed:
            return renamed[word]
        if word in _LANGUAGE or (word not in params and _defined_in(code, word)):
            return word
        unknown = True
        return word

    out = _IDENT.sub(one, expr.strip())
    return None if unknown else out


def kernel_signature(kernel: Kernel) -> Signature | None:
    """The kernel as a function the adapter calls: one type parameter at most, every
    parameter named."""
    if kernel.specialization or not all(p.name for p in kernel.params):
        return None
    if any(tp.kind != "type" for tp in kernel.template_params) or len(kernel.template_params) > 1:
        return None
    template = "".join(f"template <typename {tp.name}>" for tp in kernel.template_params)
    qualified = "::".join(n for n in (kernel.namespace, kernel.name) if n)
    params = [(p.type, p.name) for p in kernel.params]
    return Signature(kernel.name, qualified, "void", params, template)


def find_twin(kernel: Kernel, index: LauncherIndex, functions: dict) -> Item | None:
    """The host function outside GPU sources named as the kernel's twin, with the kernel's
    parameter names in order (`functions`: wrappers.opmap.functions_by_name)."""
    names = [p.name for p in kernel.params]
    for twin in twin_names(kernel.name):
        for item in functions.get(twin, []):
            sig = None if GPU_SOURCE.search(item.file) else index.signature(item)
            if sig is not None and [n for _, n in sig.params] == names:
                return item
    return None


def kernel_adapter(
    kernel: Kernel,
    fk: FoundKernel,
    index: LauncherIndex,
    device_code: str,
    dtypes: tuple[str, ...],
) -> tuple[Signature, str] | None:
    """The adapter launching the kernel as the repository's first readable launch does."""
    sig = kernel_signature(kernel)
    if sig is None:
        return None
    for launcher in launcher_candidates(fk, index.disc, index):
        code = index.disc.models[launcher.file].code[launcher.start : launcher.end]
        config = launch_config(kernel, code, device_code)
        if config is not None:
            return adapt(sig, device_code, dtypes, launch=f"<<<{config}>>>")
    return None
