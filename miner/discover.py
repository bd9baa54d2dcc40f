"""Find every `__global__` definition of a repository, with its signature and launch sites.

tree-sitter-cuda reads each file once (about 1.5 ms per file). Three things it cannot see are
handled around it: qualifier macros are substituted before parsing (`aliases`), kernels stamped
out by macros are expanded (`macro_kernels`), and every `__global__` token the tree does not
account for is read by a small token scan, so a parse error never loses a kernel.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from miner.aliases import DEFINE_LINE, collect_aliases
from miner.filemodel import FileModel, Item, KernelDef, refs_in
from miner.launches import find_launch_sites
from miner.macro_kernels import (
    Expansion,
    find_invocations,
    find_kernel_macros,
    name_macro_uses,
)
from miner.repo_model import Discovery, FoundKernel
from miner.sources import scan_tree
from miner.textprep import (
    blank_comments_and_strings,
    bracket_end,
    decode,
    first_branch_view,
    split_top,
)
from miner.treewalk import FileParser

log = logging.getLogger(__name__)


def discover(root: Path, max_bytes: int | None = None, on_file=None) -> Discovery:
    """Scan, parse and read every kernel of the tree at `root`; `on_file(total)` is called once
    per parsed file (progress bars)."""
    inventory = scan_tree(root, **({"max_bytes": max_bytes} if max_bytes else {}))
    texts = {f.rel: decode(f.data) for f in inventory.files}
    codes = {rel: blank_comments_and_strings(t) for rel, t in texts.items()}
    aliases = collect_aliases(list(codes.values()))
    parser = FileParser()
    models: dict[str, FileModel] = {}
    for rel, text in texts.items():
        code = codes[rel]
        rewritten = aliases.rewrite(text, code)
        models[rel] = parser.parse(rel, text, code, rewritten)
        if on_file is not None:
            on_file(len(texts))
    disc = Discovery(root, inventory, models, aliases)
    global_words = {"__global__"} | aliases.global_aliases
    for rel, model in models.items():
        for kdef in model.kernels:
            disc.kernels.append(_found(model, kdef))
        model.excluded_spans = _outside_defines(model)  # a macro's text is no declaration
        disc.declarations += sum(
            1
            for it in model.items
            if it.kind == "decl" and any(n == s[2] for s in model.excluded_spans for n in it.names)
        )
        if model.error_count:
            disc.parse_errors.append(rel)
    _macro_kernels(disc, texts, codes, global_words, parser)
    name_macro_uses(models, parser)
    _fallback_scan(disc, global_words)
    disc.instantiations = sum(
        1
        for m in models.values()
        for s in m.excluded_spans
        if not any(it.kind == "decl" and it.start == s[0] for it in m.items)
    )
    disc.launches = find_launch_sites(disc)
    disc.kernels.sort(key=lambda k: (k.file, k.line, k.kdef.name))
    return disc


def _outside_defines(model: FileModel) -> list:
    """The model's excluded spans (declarations, instantiations) that are not inside a
    `#define`: `#define HEAD(name) __global__ void name(float* x)` declares nothing until used."""
    if "define" not in model.code:
        return model.excluded_spans
    defines = [(m.start(), m.end()) for m in DEFINE_LINE.finditer(model.code)]
    return [x for x in model.excluded_spans if not any(a <= x[0] < b for a, b in defines)]


def _found(model: FileModel, kdef: KernelDef, **kw) -> FoundKernel:
    lines = model.lines
    return FoundKernel(
        kdef,
        model.rel,
        lines.line(kdef.global_offset),
        lines.line(kdef.start),
        lines.line(max(kdef.start, kdef.end - 1)),
        model.text[kdef.start : kdef.end],
        **kw,
    )


def _macro_kernels(disc: Discovery, texts, codes, global_words, parser: FileParser) -> None:
    macros = {}
    for rel, code in codes.items():
        for m in find_kernel_macros(rel, code, texts[rel], global_words):
            macros[m.name] = m
    if not macros:
        return
    for rel, code in codes.items():
        for exp in find_invocations(rel, code, texts[rel], macros):
            _add_expansion(disc, exp, parser)


def _add_expansion(disc: Discovery, exp: Expansion, parser: FileParser) -> None:
    """Parse the expanded text as its own little file and graft its kernels onto the invoker."""
    model = disc.models[exp.file]
    text = exp.text
    code = blank_comments_and_strings(text)
    rewritten = disc.aliases.rewrite(text, code)
    sub = parser.parse(exp.file, text, code, rewritten)
    line = model.lines.line(exp.start)
    for kdef in sub.kernels:
        item = kdef.item
        # the expansion replaces the invocation span in the invoking file
        item.start, item.end, item.line = exp.start, exp.end, line
        item.override = text
        kdef.start, kdef.end, kdef.global_offset = exp.start, exp.end, exp.start
        model.items.append(item)
        _replace_invocation_item(model, exp, item)
        disc.kernels.append(
            FoundKernel(
                kdef,
                exp.file,
                line,
                line,
                model.lines.line(exp.end - 1),
                text,
                from_macro=exp.macro.name,
            )
        )


def _replace_invocation_item(model: FileModel, exp: Expansion, item: Item) -> None:
    """Swap the parser's item for the invocation with the expanded kernel, in event order."""

    def walk(events: list) -> bool:
        for i, ev in enumerate(events):
            if isinstance(ev, Item) and ev.start <= exp.start < max(ev.end, ev.start + 1):
                events[i] = item
                return True
            branches = getattr(ev, "branches", None)
            if branches and any(walk(b[2]) for b in branches):
                return True
        return False

    if not walk(model.events):
        model.events.append(item)


_GLOBAL_SCAN_CACHE: dict[str, re.Pattern] = {}


def _fallback_scan(disc: Discovery, global_words: set[str]) -> None:
    """Every `__global__` token must belong to a definition, declaration, instantiation or
    macro; any other one is a definition tree-sitter could not read: extract it by tokens."""
    key = "|".join(sorted(global_words))
    pattern = _GLOBAL_SCAN_CACHE.setdefault(key, re.compile(r"\b(?:" + key + r")\b"))
    for rel, model in disc.models.items():
        code = model.code
        if not pattern.search(code):
            continue
        covered = [(k.start, k.end) for k in model.kernels]
        covered += [(s, e) for s, e, _ in model.excluded_spans if _ends_with_semicolon(code, e)]
        covered += [
            (it.start, it.end)
            for it in model.items
            if it.kind == "macro" or (it.kind == "decl" and _ends_with_semicolon(code, it.end))
        ]
        covered += [(m.start(), m.end()) for m in DEFINE_LINE.finditer(code)]
        view = None
        for m in pattern.finditer(code):
            if any(s <= m.start() < e for s, e in covered):
                continue
            view = view or first_branch_view(code)
            kdef = token_scan_kernel(model, m.start(), view)
            if kdef is None:
                continue
            covered.append((kdef.start, kdef.end))
            model.kernels.append(kdef)
            model.items.append(kdef.item)
            model.events.append(kdef.item)
            disc.kernels.append(_found(model, kdef, parse_fallback=True))
            log.info(
                "%s:%d: kernel %s read by token scan", rel, model.lines.line(m.start()), kdef.name
            )


_NAME_BEFORE_PAREN = re.compile(r"([A-Za-z_]\w*)\s*(<[^;{}()]*>)?\s*\($")


def _ends_with_semicolon(code: str, end: int) -> bool:
    return code[:end].rstrip().endswith(";")


def token_scan_kernel(model: FileModel, pos: int, view: str | None = None) -> KernelDef | None:
    """Read a definition from tokens: name before the first '(' (past launch bounds), the
    parameter list, then the body's braces counted along one preprocessor path."""
    code = view if view is not None else model.code
    i, n = pos, len(code)
    # find the parameter list: the first '(' at depth 0 that is not __launch_bounds__(...)
    while i < n:
        c = code[i]
        if c in ";{}":
            return None
        if c == "(":
            head = code[pos : i + 1]
            if re.search(r"__launch_bounds__\s*\($|__align__\s*\($", head):
                i = bracket_end(code, i, "(", ")")
                if i is None:
                    return None
                continue
            break
        i += 1
    else:
        return None
    m = _NAME_BEFORE_PAREN.search(code[pos : i + 1])
    if not m:
        return None
    close = bracket_end(code, i, "(", ")")
    if close is None:
        return None
    j = close
    while j < n and code[j] not in "{;":
        j += 1
    if j >= n or code[j] == ";":
        return None  # a declaration
    end = bracket_end(code, j, "{", "}")
    if end is None:
        return None
    end = _close_conditionals(model.code, pos, end)
    start = _template_start(code, pos)
    params = []
    for ptext in split_top(code[i + 1 : close - 1]):
        words = re.findall(r"[A-Za-z_]\w*", ptext)
        pname = words[-1] if len(words) > 1 else ""
        ptype = ptext[: ptext.rfind(pname)].strip() if pname else ptext
        params.append((" ".join(ptype.split()), pname, " ".join(ptext.split())))
    spec = (
        (m.group(2) or "")[1:-1].strip()
        if code[start:pos].strip().startswith("template")
        and re.match(r"template\s*<\s*>", code[start:pos].strip())
        else ""
    )
    item = Item(
        "kernel",
        (m.group(1),),
        model.rel,
        start,
        end,
        model.lines.line(start),
        (),
        refs_in(model.code, start, end),
        device=True,
        spec=spec,
    )
    return KernelDef(m.group(1), (), start, end, pos, params, [], spec, [], item, True)


_PP = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|endif)\b.*$", re.MULTILINE)


def _close_conditionals(code: str, start: int, end: int) -> int:
    """Extend a definition that ends inside an #if it opened to that #if's #endif."""
    depth = 0
    for m in _PP.finditer(code, start):
        if m.start() >= end and depth <= 0:
            break
        depth += 1 if m.group(1) != "endif" else -1
        if m.start() >= end and depth == 0:
            return m.end()
    return end


def _template_start(code: str, pos: int) -> int:
    """Walk back over qualifiers and one `template <...>` header to the definition's start."""
    i = pos
    while True:
        j = i
        while j > 0 and code[j - 1] in " \t\r\n":
            j -= 1
        m = re.search(
            r"(static|inline|__forceinline__|extern\s+\"C\")\s*$", code[max(0, j - 20) : j]
        )
        if m:
            i = j - (len(m.group(0)))
            continue
        if j > 0 and code[j - 1] == ">":
            depth, k = 0, j - 1
            while k >= 0:
                if code[k] == ">":
                    depth += 1
                elif code[k] == "<":
                    depth -= 1
                    if depth == 0:
                        break
                k -= 1
            before = code[max(0, k - 12) : k]
            t = re.search(r"template\s*$", before)
            if t:
                return k - len(t.group(0))
        return i
