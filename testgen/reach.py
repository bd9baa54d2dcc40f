"""Which branches of a kernel the test's inputs can reach, so wrong variants are put where the
test can see them.

A mode switch (`if (pool_mode == 0)` in mmcv's roi_align) decided by a launch argument the
repository's tests always give the same value leaves the other branch unexercised: a variant
placed there survives every case, and says nothing about the test. The scalar arguments of the
kernel launch are computed from the launcher's arguments in each base call (the cases
interpreter; locals such as `channels = input.size(1)` included), and a branch whose condition
is false for every base call is dead for this test. Anything that cannot be decided is live.
"""

from __future__ import annotations

import re

import tree_sitter as ts

from miner.textprep import blank_comments_and_strings, split_top
from miner.treewalk import LANGUAGE
from testgen.interp import Unmappable, evaluate, run_statements


def _launch(code: str, kernel: str) -> tuple[int, list[str]] | None:
    """Offset and argument texts of the first `kernel<...><<<...>>>(args)` launch."""
    m = re.search(rf"\b{re.escape(kernel)}\s*(?:<[^;{{}}]*?>)?\s*<<<.*?>>>\s*\(", code, re.DOTALL)
    if m is None:
        return None
    depth = 0
    for j in range(m.end() - 1, len(code)):
        depth += (code[j] == "(") - (code[j] == ")")
        if depth == 0:
            return m.start(), [" ".join(a.split()) for a in split_top(code[m.end() : j])]
    return None


def kernel_scalars(
    label_text: str, kernel: str, launcher: str, params: list[str], launcher_args: dict
) -> dict:
    """{kernel parameter: value} for the launch arguments the interpreter can compute."""
    code = blank_comments_and_strings(label_text)
    found = _launch(code, kernel)
    if found is None:
        return {}
    at, args = found
    starts = [m.end() for m in re.finditer(rf"\b{re.escape(launcher)}\s*\([^;]*?\)\s*\{{", code)]
    start = max((s for s in starts if s <= at), default=0)
    env = run_statements(code[start - 1 : at], launcher_args)
    out = {}
    for name, expr in zip(params, args, strict=False):
        try:
            value = evaluate(expr, env)
        except (Unmappable, ArithmeticError, IndexError, TypeError):
            continue
        if isinstance(value, bool | int | float) and not hasattr(value, "shape"):
            out[name] = value
    return out


def _condition(text: str, known: dict) -> bool | None:
    """A C++ condition over known scalars, or None when undecidable."""
    py = re.sub(r"&&", " and ", text)
    py = re.sub(r"\|\|", " or ", py)
    py = re.sub(r"!(?!=)", " not ", py)
    try:
        value = evaluate(py.strip(), known)
    except (Unmappable, ArithmeticError, TypeError):
        return None
    return bool(value) if isinstance(value, bool | int | float) else None


def _assigned(body: str, names: set[str]) -> set[str]:
    return {
        n
        for n in names
        if re.search(rf"(?<![=!<>])\b{re.escape(n)}\s*(?:[-+*/%&|^]?=(?!=)|\+\+|--)", body)
        or re.search(rf"(?:\+\+|--)\s*{re.escape(n)}\b", body)
    }


def dead_spans(label_text: str, kernel: str, known: dict) -> list[tuple[int, int]]:
    """Byte spans of the kernel's branches that `known` makes unreachable."""
    code = blank_comments_and_strings(label_text)
    root = ts.Parser(LANGUAGE).parse(code.encode("latin-1", errors="replace")).root_node
    name = kernel.split("::")[-1]
    spans: list[tuple[int, int]] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "function_definition":
            decl = node.child_by_field_name("declarator")
            body = node.child_by_field_name("body")
            text = code[decl.start_byte : decl.end_byte] if decl else ""
            if body is not None and re.match(rf"(?:[\w:]+::)?{re.escape(name)}\s*\(", text.strip()):
                reassigned = _assigned(code[body.start_byte : body.end_byte], set(known))
                spans += _dead_in(
                    body, code, {k: v for k, v in known.items() if k not in reassigned}
                )
            continue
        stack.extend(node.children)
    return spans


def _dead_in(body: ts.Node, code: str, known: dict) -> list[tuple[int, int]]:
    out = []
    stack = [body]
    while stack:
        node = stack.pop()
        if node.type == "if_statement":
            cond = node.child_by_field_name("condition")
            then = node.child_by_field_name("consequence")
            other = node.child_by_field_name("alternative")
            value = _condition(code[cond.start_byte : cond.end_byte], known) if cond else None
            if value is False and then is not None:
                out.append((then.start_byte, then.end_byte))
            if value is True and other is not None:
                out.append((other.start_byte, other.end_byte))
        stack.extend(node.children)
    return out
