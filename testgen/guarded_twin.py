"""The statement a CPU op runs under the guard its CUDA twin launches under.

SparseConvNet's `cuda_Convolution_updateOutput` fills the output with the bias by a launcher,
`if (bias.numel()) Convolution_fp_bias(oF, bias.data_ptr<T>(), op, nActiveOut);`, where its
CPU twin writes `if (bias.numel() and nActive) output_features.copy_(bias);`. No CPU function
takes what the launcher takes, but under the same condition on the same tensors the two do one
step of the op: the statement is the launcher's reference, run on the CPU op's tensors rebuilt
from the launcher's arguments as testgen.op_loop rebuilds them for a loop (viewed in the shapes
the CUDA op gives them, a tensor an `_out` call overwrites handed cleared).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from miner.filemodel import Item
from miner.textprep import blank_comments_and_strings, bracket_end
from testgen.argmap import call_args
from testgen.op_loop import cpu_twins, lift_span

_IF = re.compile(r"\bif\s*\(")
_AND = re.compile(r"&&|\band\b")


def _guarded(body: str) -> list[tuple[set[str], int, int]]:
    """(the terms of the condition, start, end) of each `if`'s then-branch in `body`."""
    text = blank_comments_and_strings(body)
    out = []
    for m in _IF.finditer(text):
        close = bracket_end(text, m.end() - 1, "(", ")")
        if close is None:
            continue
        terms = {"".join(t.split()) for t in _AND.split(text[m.end() : close - 1])}
        start = close + len(text[close:]) - len(text[close:].lstrip())
        if text.startswith("{", start):
            end = bracket_end(text, start, "{", "}")
        else:
            semi = text.find(";", start)
            end = semi + 1 if semi >= 0 else None
        if end is not None:
            out.append((terms - {""}, start, end))
    return out


def _single_statement(body: str, start: int, end: int) -> bool:
    text = blank_comments_and_strings(body[start:end]).strip()
    return text.count(";") == 1 and not re.search(r"\b(?:if|for|while|do|return)\b", text)


def guarded_twin(
    refs,
    launcher: Item,
    params: list[tuple[str, str]],
    paths: list[list[Item]],
    host_side: Callable[[Item], bool],
) -> tuple[Item, str, str, list[str]] | str | None:
    """(the CPU op, the helper's name, its code, the repository functions it calls) when a CUDA
    op calls `launcher` (exposed by an adapter of `params`) under a condition on its tensors
    and its CPU twin runs one statement under that condition (and maybe more terms); a reason
    when that statement cannot be run on the launcher's arguments; else None."""
    why = None
    for path in paths:
        if len(path) < 2 or path[0] is not launcher:
            continue
        caller = path[1]
        body = refs.body(caller)
        args = call_args(body, launcher.names[0])
        at = re.search(rf"(?<![\w.]){re.escape(launcher.names[0])}\s*(?:<[^<>;]*>)?\s*\(", body)
        if args is None or at is None or len(args) != len(params):
            continue
        guards = [g for g in _guarded(body) if g[1] <= at.start() < g[2]]
        terms = guards[-1][0] if guards else set()
        if not terms or not all(".numel()" in t for t in terms):
            continue
        for item in cpu_twins(refs, caller, host_side):
            cpu_body = refs.body(item)
            for cpu_terms, start, end in _guarded(cpu_body):
                if not terms <= cpu_terms or not _single_statement(cpu_body, start, end):
                    continue
                span = (start, end)
                found = lift_span(refs, launcher, params, None, body, args, item, span, "", True)
                if isinstance(found, tuple):
                    return (item, *found)
                why = why or found
    return why
