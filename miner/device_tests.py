"""The two sides of a host function that asks where its tensors live.

spconv-derived launchers (mmcv's sparse max-pool and indice convolution, every copy of
traveller59/spconv) compute an op on either device: `if (device == torch::kCPU) { Functor<
tv::CPU, T>()(...); } else { Functor<tv::TorchGPU, T>()(...); }`. A label runs only on the GPU, so
it keeps the GPU side (the CPU functor is compiled in another source a label never links); the
reference runs only on the host, so it keeps the CPU side (testgen.device_branch). Only braced
branches of one plain test are cut; anything else is left as the repository wrote it.
"""

from __future__ import annotations

import dataclasses
import re

from miner.filemodel import Item
from miner.linearize import Linear
from miner.textprep import bracket_end

_IF = re.compile(r"\bif\s*\(")
_CPU_IS = re.compile(r"\bkCPU\b|\bis_cpu\s*\(|DeviceType::CPU\b")
_GPU_IS = re.compile(r"\bkCUDA\b|\bis_cuda\b|DeviceType::CUDA\b")
_NOT = re.compile(r"!=|^\s*!")


def _polarity(cond: str) -> bool | None:
    """True when the condition holds for CPU tensors, False for GPU ones, None when it is not
    one test of a tensor's device."""
    if "&&" in cond or "||" in cond:
        return None
    for pattern, on_cpu in ((_CPU_IS, True), (_GPU_IS, False)):
        if pattern.search(cond):
            return on_cpu != bool(_NOT.search(cond))
    return None


def keep_side(code: str, text: str, cpu: bool) -> tuple[str, str, list[str]]:
    """A function's blanked `code` and original `text` keeping only one side of each device
    test (nested ones too): the CPU's (`cpu`) or the GPU's; and the sides kept (blanked,
    innermost first, empty ones left out)."""
    edits: list[tuple[int, int, str, str]] = []
    found: list[str] = []
    at = 0
    while m := _IF.search(code, at):
        at = m.end()
        close = bracket_end(code, m.end() - 1, "(", ")")
        polarity = _polarity(code[m.end() : close - 1]) if close else None
        then = _skip(code, close) if close and polarity is not None else None
        then_end = bracket_end(code, then, "{", "}") if then and code[then] == "{" else None
        if then_end is None:
            continue
        ours = polarity == cpu  # the `then` block runs on the side kept
        end, kept = then_end, (then, then_end) if ours else (then, then)
        follow = _skip(code, then_end)
        if follow is not None and re.match(r"else\b", code[follow:]):
            block = _skip(code, follow + 4)
            block_end = bracket_end(code, block, "{", "}") if block and code[block] == "{" else None
            if block_end is None:  # `else if` or a lone statement: not this shape
                continue
            end = block_end
            kept = kept if ours else (block, block_end)
        sub_code, sub_text, sub_found = keep_side(code[slice(*kept)], text[slice(*kept)], cpu)
        found += sub_found + ([sub_code] if sub_code.strip("{} \n\t") else [])
        edits.append((m.start(), end, sub_code, sub_text))
        at = end
    for start, stop, sub_code, sub_text in reversed(edits):
        code = code[:start] + sub_code + code[stop:]
        text = text[:start] + sub_text + text[stop:]
    return code, text, found


def _skip(code: str, i: int) -> int | None:
    while i < len(code) and code[i].isspace():
        i += 1
    return i if i < len(code) else None


def one_side(item: Item, text: str, code: str, cpu: bool) -> tuple[Item, str, list[str]] | None:
    """`item` (its original `text` and blanked `code`) with one side of its device tests kept
    (its refs narrowed to what is left, the text as its override), the blanked code left and
    the sides kept; None when it has no device test to cut."""
    left_code, left_text, kept = keep_side(code, text, cpu)
    if left_code == code:
        return None
    side = "host" if cpu else "GPU"
    note = f"// kminer: the {side}'s side of each device test kept\n"
    words = set(re.findall(r"[A-Za-z_]\w*", left_code))
    return (
        dataclasses.replace(item, refs=item.refs & words, override=note + left_text),
        left_code,
        kept,
    )


def swapped(linear: Linear, original: Item, replacement: Item) -> Linear:
    """`linear` with `replacement` in the place of `original` (a closure over its text)."""
    entries = [
        dataclasses.replace(e, item=replacement) if e.item is original else e
        for e in linear.entries
    ]
    return dataclasses.replace(linear, entries=entries)
