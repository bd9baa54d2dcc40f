"""Pointers a launcher hands to `cudaMemcpy`: host data it copies in, and device buffers it
stages that data in.

SparseConvNet's `InputLayer_fp(T *in, T *out, Int nRows, Int maxActive, Int nPlanes,
Int *rules_cpu, Int *rules_gpu, bool average)` copies the rule book from the host
(`cudaMemcpy(rules_gpu, rules_cpu, sizeof(Int) * nRows * (1 + maxActive),
cudaMemcpyHostToDevice)`) and launches the kernel on the copy. A pointer adapter that hands
every pointer a CUDA tensor's data gives `cudaMemcpy` a device address where it expects a host
one. So the adapter hands the source a host copy of its tensor, and makes the staging buffer
itself, in the copy's size (the launcher's own numbers) at least, holding the whole host tensor
before the launcher copies its part over it: a kernel reading past the part the launcher copies
reads what the CPU twin reads there, not what the allocator left. The binding then takes what
the op's CPU twin takes (the rule book once), and the repository's code is unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from miner.textprep import blank_comments_and_strings, bracket_end, split_top

_MEMCPY = re.compile(r"\bcudaMemcpy(?:Async)?\s*\(")
_WORD = re.compile(r"[A-Za-z_]\w*")


@dataclass
class Staging:
    host_in: set[str] = field(default_factory=set)  # copied from the host before the launch
    # staging buffer -> (its size in bytes, the host data copied into it)
    buffers: dict[str, tuple[str, str]] = field(default_factory=dict)


def _root(expr: str) -> str:
    """The pointer an argument addresses (`rules + o * n` and `&rules[0]`: `rules`)."""
    m = _WORD.search(expr.lstrip("&(* "))
    return m.group(0) if m else ""


def _body(code: str, name: str) -> str:
    """The launcher's body in the label's code ("" where it is not defined there)."""
    text = blank_comments_and_strings(code)
    for m in re.finditer(rf"(?<![\w:.]){re.escape(name)}\s*\(", text):
        close = bracket_end(text, m.end() - 1, "(", ")")
        if close is None:
            continue
        brace = re.match(r"\s*(?:const\s*)?\{", text[close:])
        if brace:
            start = close + brace.end() - 1
            end = bracket_end(text, start, "{", "}")
            if end is not None:
                return code[start:end]
    return ""


def staging(code: str, name: str, params: list[tuple[str, str]]) -> Staging:
    """What launcher `name` (its parameters `params`) copies from the host to the device. A
    source is host data only where no launch takes it as well (SparseConvNet's
    ActivePooling_ForwardPass copies `rules` and then launches on `rules` itself: only a
    device address serves both). A buffer is staged only when the copy's size is written in
    the launcher's numbers, the copy is its only write from the host, and nothing else of
    the host reads it."""
    body = _body(code, name)
    found = Staging()
    if not body:
        return found
    pointers = {n for t, n in params if "*" in t}
    numbers = {n for t, n in params if "*" not in t and "&" not in t}
    clean = blank_comments_and_strings(body)
    for m in _MEMCPY.finditer(clean):
        close = bracket_end(clean, m.end() - 1, "(", ")")
        args = split_top(body[m.end() : close - 1], angle=False) if close else []
        if len(args) < 4:
            continue
        dst, src, size, kind = (a.strip() for a in args[:4])
        if kind.endswith("HostToDevice") and _root(src) in pointers:
            found.host_in.add(_root(src))
            target = dst if _root(dst) == dst else ""
            words = set(_WORD.findall(re.sub(r"\bsizeof\s*\([^()]*\)", "1", size)))
            if target in pointers and words <= numbers and _written_once(clean, target):
                found.buffers[target] = (size, _root(src))
    launched = _launch_spans(clean)
    found.host_in = {n for n in found.host_in if not any(_uses(clean, n, launched))}
    found.buffers = {k: v for k, v in found.buffers.items() if v[1] in found.host_in}
    return found


def _launch_spans(body: str) -> list[tuple[int, int]]:
    spans = []
    for m in re.finditer(r">>>\s*\(", body):
        close = bracket_end(body, m.end() - 1, "(", ")")
        if close is not None:
            spans.append((m.end(), close))
    return spans


def _uses(body: str, name: str, spans: list[tuple[int, int]]) -> list[bool]:
    """For each use of `name`, whether it is a launch's argument."""
    found = re.finditer(rf"(?<![\w.]){re.escape(name)}\b", body)
    return [any(a <= m.start() < b for a, b in spans) for m in found]


def _written_once(body: str, name: str) -> bool:
    """`name` is one copy's destination and otherwise only launches' argument."""
    copies = [
        m for m in _MEMCPY.finditer(body) if re.match(rf"\s*{re.escape(name)}\s*,", body[m.end() :])
    ]
    uses = _uses(body, name, _launch_spans(body))
    return len(copies) == 1 and sum(uses) == len(uses) - 1
