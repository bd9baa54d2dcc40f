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

import dataclasses
import re

from miner.closure import Closure, compute_closure
from miner.device_tests import one_side, swapped
from miner.filemodel import Item

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
    cut = one_side(item, text, code, cpu=True)
    if cut is None or not cut[2]:
        return None
    host, code, kept = cut
    text = host.override
    brace = code.find("{")
    shift = len(text) - len(code)  # the note before the text
    gpu_only = [(a + brace, b + brace, "") for a, b, _ in _gpu_statements(code[brace:])]
    code = _apply(code, gpu_only)
    text = _apply(text, [(a + shift, b + shift, r) for a, b, r in gpu_only])
    if "<<<" in code:
        return None
    words = set(re.findall(r"[A-Za-z_]\w*", code))
    return dataclasses.replace(host, refs=host.refs & words, override=text), kept


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    for start, end, repl in sorted(edits, reverse=True):
        text = text[:start] + repl + text[end:]
    return text


def host_closure(refs, original: Item, host: Item, on_cpu) -> Closure:
    """The closure of the host version over its file, with the CPU-side specializations of the
    class templates it uses (each with its own closure) placed before it."""
    linear = swapped(refs.linearizer.linear(original.file), original, host)
    launching = frozenset(  # the GPU specializations beside it: they launch kernels
        id(e.item)
        for e in linear.entries
        if e.item.kind == "type" and _specializes(refs, e.item) and "<<<" in _code(refs, e.item)
    )
    closure = compute_closure(host, linear, refs.context_linear(original.file), launching)
    types = {n for e in closure.entries if e.item.kind == "type" for n in e.item.names}
    known = {id(e.item) for e in closure.entries}
    for name in sorted(types):
        for spec in refs.types.get(name, []):
            if id(spec) in known or not on_cpu(spec) or not _specializes(refs, spec):
                continue
            if "<<<" in _code(refs, spec):
                continue
            other = compute_closure(spec, refs.linearizer.linear(spec.file))
            extra = [e for e in other.entries if id(e.item) not in known]
            known |= {id(e.item) for e in extra}
            at = next(i for i, e in enumerate(closure.entries) if e.item is host)
            closure.entries[at:at] = extra
            closure.externals += [x for x in other.externals if x not in closure.externals]
    return closure


def _code(refs, item: Item) -> str:
    return refs.disc.models[item.file].code[item.start : item.end]


def _specializes(refs, item: Item) -> bool:
    """A class template specialization (`struct F<tv::CPU, T, I> {`), not a primary one."""
    head = _code(refs, item).split("{", 1)[0]
    return bool(re.search(rf"\b(?:struct|class)\s+{re.escape(item.names[0])}\s*<", head))
