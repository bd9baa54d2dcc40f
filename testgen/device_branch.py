"""A launcher that computes its op on the CPU itself when handed CPU tensors.

Code derived from spconv (mmcv's sparse max-pool and indice convolution, and the many copies of
traveller59/spconv) writes one host function per op that asks where its tensors live and calls
a functor specialized for the CPU or for the GPU:
`if (device == torch::kCPU) { Functor<tv::CPU, T>()(...); } else { Functor<tv::TorchGPU, T>()
(...); TV_CHECK_CUDA_ERR(); }`. No CPU registration reaches it (the op is registered for CUDA
only), yet its CPU branch is the repository's own CPU implementation of the same op. The
reference is that function with each GPU branch cut away, and the statements only a GPU build
can run (device guards, CUDA error checks) dropped, compiled for the host. The `tv::CPU`
specializations live in the repository's CPU sources, explicitly instantiated there for the
linker; they join the closure after the primary template, as the linker would join them.
"""

from __future__ import annotations

import re

from miner.closure import Closure, compute_closure, link_before
from miner.device_tests import one_side, swapped
from miner.filemodel import Item
from miner.specializations import fill_defaults, is_specialization

_GPU_ONLY = re.compile(  # a statement only a CUDA build runs: a guard, a stream, an error check
    r"::\s*cuda\s*::|\bcuda[A-Z]\w*\s*\(|\b[A-Z0-9_]*CUDA[A-Z0-9_]*\s*\("
)  # a launch (`<<<`) outside the device tests is no such statement: that op has no CPU side


def _gpu_statements(code: str) -> list[tuple[int, int, str]]:
    """Blank the simple statements a CUDA build alone can run."""
    out = []
    for m in re.finditer(r"[^;{}]*;", code):
        if _GPU_ONLY.search(m.group(0)):
            out.append((m.start(), m.end(), ""))
    return out


def host_version(item: Item, text: str, code: str) -> tuple[Item, list[str]] | None:
    """`item` (a function, its original `text` and blanked `code`) with only its CPU branches
    and no GPU-only statements, and those branches; None when it has no CPU branch or still
    launches a kernel."""
    brace = code.find("{")
    gpu_only = [(a + brace, b + brace, "") for a, b, _ in _gpu_statements(code[brace:])]
    cut = one_side(item, _apply(text, gpu_only), _apply(code, gpu_only), cpu=True)
    if cut is None or not cut[2] or "<<<" in cut[1]:
        return None
    return cut[0], cut[2]


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    for start, end, repl in sorted(edits, reverse=True):
        text = text[:start] + repl + text[end:]
    return text


def host_closure(refs, original: Item, host: Item, on_cpu) -> Closure:
    """The closure of the host version over its file, with the CPU-side specializations of the
    class templates it uses (each with its own closure) placed before it."""
    linear = swapped(refs.linearizer.linear(original.file), original, host)
    launching = frozenset(  # the GPU specializations beside it: they launch kernels
        id(e.item) for e in linear.entries if e.item.kind == "type" and _launching(refs, e.item)
    )
    closure = compute_closure(host, linear, refs.context_linear(original.file), launching)
    types = {n for e in closure.entries if e.item.kind == "type" for n in e.item.names}
    for name in sorted(types):
        for spec in refs.types.get(name, []):
            if any(e.item is spec for e in closure.entries) or not on_cpu(spec):
                continue
            if not is_specialization(spec, refs.body(spec)) or _launching(refs, spec):
                continue
            link_before(closure, compute_closure(spec, refs.linearizer.linear(spec.file)), host)
    fill_defaults(closure, lambda it: (refs.text(it), refs.body(it)))
    return closure


def _launching(refs, item: Item) -> bool:
    """A GPU specialization: it launches kernels."""
    body = refs.body(item)
    return "<<<" in body and is_specialization(item, body)
