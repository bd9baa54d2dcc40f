"""Kernels written inside a function-like macro and stamped out by its invocations.

`#define DEFINE_FILL(NAME, T) __global__ void NAME(T* x) {...}` defines no kernel by itself;
each `DEFINE_FILL(fill_f32, float)` does. We expand such invocations (parameters, `#` and `##`)
so each stamped kernel becomes a candidate whose source is the expanded text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from miner.aliases import DEFINE_LINE
from miner.textprep import blank_comments_and_strings, bracket_end, split_top

_IDENT = re.compile(r"[A-Za-z_]\w*")


@dataclass
class KernelMacro:
    name: str
    params: list[str]
    body: str  # continuation lines joined with newlines
    file: str
    start: int
    end: int


@dataclass
class Expansion:
    macro: KernelMacro
    file: str  # where the invocation is
    start: int  # invocation span in that file (original offsets)
    end: int
    text: str  # the expanded source


def find_kernel_macros(rel: str, code: str, text: str, global_words: set[str]) -> list[KernelMacro]:
    found = []
    if "define" not in code:
        return found
    for m in DEFINE_LINE.finditer(code):
        if m.group("params") is None:
            continue
        body_code = m.group("body")
        if not any(re.search(rf"\b{w}\b", body_code) for w in global_words):
            continue
        params = [p.strip() for p in m.group("params")[1:-1].split(",") if p.strip()]
        body = text[m.start("body") : m.end("body")].replace("\\\n", "\n")
        found.append(KernelMacro(m.group("name"), params, body, rel, m.start(), m.end()))
    return found


def split_args(text: str) -> list[str]:
    """Macro arguments: commas split outside parentheses and brackets, not outside `<>`."""
    return split_top(text, angle=False) or [""]


def expand(macro: KernelMacro, args: list[str]) -> str:
    """Substitute arguments the way the preprocessor does for one level (#, ##, __VA_ARGS__)."""
    params = list(macro.params)
    mapping: dict[str, str] = {}
    for i, p in enumerate(params):
        if p == "..." or p.endswith("..."):
            key = "__VA_ARGS__" if p == "..." else p[:-3]
            mapping[key] = ", ".join(args[i:])
            break
        mapping[p] = args[i] if i < len(args) else ""
    body = macro.body
    variadic = next((k for k in mapping if k == "__VA_ARGS__" or f"{k}..." in params), None)
    if variadic is not None and not mapping[variadic].strip():  # no variadic arguments given
        body = re.sub(rf",\s*##\s*{variadic}\b", "", body)  # GNU: `, ##__VA_ARGS__` drops the comma
    body = re.sub(  # C++20: __VA_OPT__(x) is x when variadic arguments were given
        r"__VA_OPT__\s*\(([^()]*)\)",
        lambda m: m.group(1) if variadic is not None and mapping[variadic].strip() else "",
        body,
    )
    body = re.sub(
        r"(?<!#)#\s*([A-Za-z_]\w*)",
        lambda m: '"' + mapping[m.group(1)] + '"' if m.group(1) in mapping else m.group(0),
        body,
    )
    body = _IDENT.sub(lambda m: mapping.get(m.group(0), m.group(0)), body)
    return re.sub(r"[ \t]*##[ \t]*", "", body)


def find_invocations(
    rel: str, code: str, text: str, macros: dict[str, KernelMacro]
) -> list[Expansion]:
    """Invocations of kernel macros outside `#define` lines."""
    out: list[Expansion] = []
    if not macros:
        return out
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, macros)) + r")\s*\(")
    define_spans = [(m.start(), m.end()) for m in DEFINE_LINE.finditer(code)]
    for m in pattern.finditer(code):
        if any(s <= m.start() < e for s, e in define_spans):
            continue
        open_paren = m.end() - 1
        depth, close = 0, None
        for j in range(open_paren, min(len(code), open_paren + 20000)):
            if code[j] == "(":
                depth += 1
            elif code[j] == ")":
                depth -= 1
                if depth == 0:
                    close = j
                    break
        if close is None:
            continue
        macro = macros[m.group(1)]
        args = split_args(text[open_paren + 1 : close])
        expanded, end = expand(macro, args), close + 1
        body = _body_after(code, end) if not expanded.rstrip().endswith(("}", ";")) else None
        if body is not None:  # `KERNEL_HEAD(name, ...) { body }`: the macro gives the head only
            expanded, end = expanded.rstrip() + " " + text[body[0] : body[1]], body[1]
        out.append(Expansion(macro, rel, m.start(), end, expanded))
    return out


def _body_after(code: str, at: int) -> tuple[int, int] | None:
    """The span of the `{...}` block right after `at` (only blanks between), if there is one."""
    start = at
    while start < len(code) and code[start] in " \t\r\n":
        start += 1
    if start >= len(code) or code[start] != "{":
        return None
    end = bracket_end(code, start, "{", "}", limit=200_000)
    return (start, end) if end is not None else None


_INVOCATION = re.compile(r"\s*([A-Za-z_]\w*)\s*\((.*)\)\s*;?\s*\Z", re.DOTALL)


def name_macro_uses(models: dict, parser) -> int:
    """Give top-level macro invocations the names their expansion defines.

    `ATOMIC(Add)` at file scope defines `AtomicAddIntegerImpl` by token pasting; without this a
    kernel using that name could not find its definition. Returns how many items were named."""
    macros: dict[str, KernelMacro] = {}
    for model in models.values():
        for item in model.items:
            if item.kind != "macro":
                continue
            m = DEFINE_LINE.match(model.text, item.start)
            if m and m.group("params") is not None and item.names:
                params = [p.strip() for p in m.group("params")[1:-1].split(",") if p.strip()]
                body = model.text[m.start("body") : m.end("body")].replace("\\\n", "\n")
                macros.setdefault(
                    item.names[0],
                    KernelMacro(item.names[0], params, body, model.rel, m.start(), m.end()),
                )
    named = 0
    for model in models.values():
        for item in model.items:
            if item.kind != "other":
                continue
            m = _INVOCATION.match(model.code, item.start, item.end)
            if not m or m.group(1) not in macros:
                continue
            args = split_args(model.text[m.start(2) : m.end(2)])
            text = expand(macros[m.group(1)], args)
            sub = parser.parse(model.rel, text, blank_comments_and_strings(text), None)
            names = [n for it in sub.items if it.kind not in ("other", "macro") for n in it.names]
            if names:
                item.kind = "macro_use"
                item.names = tuple(dict.fromkeys(names))
                item.refs = item.refs | frozenset().union(*(it.refs for it in sub.items))
                named += 1
    return named
