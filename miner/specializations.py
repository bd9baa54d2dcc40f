"""Class template specializations joined to the code that names their primary.

Code derived from spconv declares a functor's primary template in a header, with only the
declaration of its `operator()` (default arguments included: `bool resetGrid = false`), and
defines the specialization for each device in that device's source. Each translation unit sees
the primary alone; the linker joins the specialization's definition. A label is one file, so it
takes in every GPU specialization of the primaries it uses from the repository's CUDA sources.
C++ then resolves each call against the specialization, whose members repeat the parameters
without their defaults: a call that leaves one out no longer compiles. The primary's defaults
are copied onto the specialization's members of the same name and arity.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from miner.closure import Closure, compute_closure, link_before
from miner.extract import Extractor
from miner.filemodel import Item
from miner.linearize import Entry
from miner.textprep import bracket_end, split_top

_SIGNATURE = re.compile(r"(operator\s*\(\s*\)|~?[A-Za-z_]\w*)\s*\(")
_BODY_OR_END = re.compile(r"\s*(?:const\b|noexcept\b|override\b|\s)*[;{]")


def is_specialization(item: Item, code: str) -> bool:
    """A class template specialization (`struct F<tv::CPU, T, I> {`), not a primary one
    (`code`: the item's blanked text)."""
    head = code.split("{", 1)[0]
    return bool(re.search(rf"\b(?:struct|class)\s+{re.escape(item.names[0])}\s*<", head))


def _declared(code: str) -> list[tuple[str, list[tuple[int, int]]]]:
    """Member function signatures (`name(type a, type b = 1)` before `;`, `{` or a qualifier),
    each with its parameters' spans; calls are left out (a parameter needs a type and a name)."""
    out = []
    for m in _SIGNATURE.finditer(code):
        end = bracket_end(code, m.end() - 1, "(", ")")
        if end is None or not _BODY_OR_END.match(code, end):
            continue
        spans, at = [], m.end()
        for part in split_top(code[m.end() : end - 1]):
            at = code.index(part, at)
            spans.append((at, at + len(part)))
            at += len(part)
        heads = [code[a:b].split("=", 1)[0].strip() for a, b in spans]
        if all(re.search(r"[\w>&*\]]\s*[&*]?\s*[A-Za-z_]\w*$", h) and " " in h for h in heads):
            out.append((re.sub(r"\s+", "", m.group(1)), spans))
    return out


def with_defaults(spec: tuple[str, str], primary: tuple[str, str]) -> str | None:
    """The specialization's text with the primary's default arguments on its members (None:
    nothing to add); each is given as its original text and its blanked code."""
    (spec_text, spec_code), (primary_text, primary_code) = spec, primary
    defaults: dict[tuple[str, int], dict[int, str]] = {}
    for name, spans in _declared(primary_code):
        given = {  # the default as written (a string literal is blank in the code)
            i: primary_text[a + primary_code[a:b].index("=") + 1 : b].strip()
            for i, (a, b) in enumerate(spans)
            if "=" in primary_code[a:b]
        }
        if given:
            defaults[(name, len(spans))] = given
    edits = []
    for name, spans in _declared(spec_code):
        for i, default in defaults.get((name, len(spans)), {}).items():
            a, b = spans[i]
            if "=" not in spec_code[a:b]:
                edits.append((b, f" = {default}"))
    for at, extra in sorted(edits, reverse=True):
        spec_text = spec_text[:at].rstrip() + extra + spec_text[at:]
    return spec_text if edits else None


def fill_defaults(closure: Closure, spans_of: Callable[[Item], tuple[str, str]]) -> None:
    """Each specialization in the closure gets the defaults of its primary there (`spans_of`:
    an item's original text and blanked code)."""
    primaries: dict[str, tuple[str, str]] = {}
    specializations = []
    for k, e in enumerate(closure.entries):
        if e.item.kind != "type" or not e.item.names:
            continue
        sp = spans_of(e.item)
        if is_specialization(e.item, sp[1]):
            specializations.append((k, e, sp))
        else:
            primaries.setdefault(e.item.names[0], sp)
    for k, e, sp in specializations:
        primary = primaries.get(e.item.names[0])
        filled = with_defaults(sp, primary) if primary and not e.item.override else None
        if filled is not None:
            closure.entries[k] = Entry(dataclasses.replace(e.item, override=filled), e.guards)


def link_specializations(
    closure: Closure, extractor: Extractor, root: Item, gpu_source: re.Pattern
) -> None:
    """The GPU specializations (`struct F<tv::TorchGPU, T, I> {` in a source `gpu_source`
    matches) of the class templates the closure uses, each with its closure, before `root`, as
    the linker joins them. mmcv's indice convolution launcher calls a gather and a scatter
    functor; its labels held only the one on the kernel's path and failed to import (undefined
    symbol `SparseScatterAddFunctor<tv::TorchGPU, double, int>::operator()`)."""
    models = extractor.disc.models
    done: set[int] = set()
    while True:
        have = {id(e.item) for e in closure.entries}
        used = set().union(*(e.item.refs for e in closure.entries if e.item.kind != "decl"))
        primaries = {  # id of each primary the closure uses, by name
            id(e.item): e.item.names[0]
            for e in closure.entries
            if e.item.kind == "type" and e.item.names[:1] and e.item.names[0] in used
        }
        names = set(primaries.values())
        found = []
        for f, m in models.items():
            if not gpu_source.search(f):
                continue
            for it in m.items:
                if it.kind != "type" or not it.names or it.names[0] not in names:
                    continue
                if id(it) in have or id(it) in done:
                    continue
                if not is_specialization(it, m.code[it.start : it.end]):
                    continue
                done.add(id(it))
                linear = extractor.linearizer.linear(it.file)
                # it specializes the closure's primary only where its file sees that one (a
                # file of its own may declare another primary of the same name)
                if any(primaries.get(id(e.item)) == it.names[0] for e in linear.entries):
                    found.append((it, linear))
        if not found:
            return
        for spec, linear in found:
            link_before(closure, compute_closure(spec, linear), root)
