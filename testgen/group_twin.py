"""A CPU twin that takes one group of the list of groups its launcher takes.

A launcher of raw pointers may take a rule book, a list of index groups it copies to the GPU one
at a time (SparseConvNet's `cuda_MaxPooling_ForwardPass(T *in, T *out, Int nPlanes, ...,
RuleBook _rules)`), where the CPU twin takes a single group as a pointer and a count
(`MaxPooling_ForwardPass(T *in, T *out, Int nPlanes, ..., const Int *rules, Int nHot)`). The
repository's own CPU op loops over the groups and calls the twin once per group, saying how a
group's length becomes the count (`Int nHot = r.size() / 2;`) and what else moves between groups
(`oF += nPlanes * spatialVolume;`). That loop, lifted out of the CPU op with its arguments
renamed to the launcher's parameters, is the reference: a helper with the launcher's
signature, called by the label's own adapter in the launcher's place.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from miner.filemodel import Item
from miner.textprep import IDENT, bracket_end, split_top
from testgen.argmap import plain_name
from testgen.pointer_twin import RepoRefs

_LOOPS = (  # over the groups `g`: by range, or by index up to its size
    re.compile(
        r"\bfor\s*\(\s*(?:const\s+)?auto\s*&{0,2}\s*\w+\s*:\s*(?P<g>[A-Za-z_]\w*)\s*\)\s*\{"
    ),
    re.compile(
        r"\bfor\s*\([^;{}]*;[^;{}]*<\s*(?:\(\s*\w+\s*\)\s*)?(?P<g>[A-Za-z_]\w*)\s*\.\s*size\s*\("
        r"\s*\)\s*;[^;{}]*\)\s*\{"
    ),
)
_GROUPS = re.compile(r"\bvector\s*<\s*(?:std\s*::\s*)?vector\s*<")
_DEVICE_PREFIX = re.compile(r"^(?:cuda|gpu)_|_(?:cuda|gpu)$", re.IGNORECASE)
_COUNT = re.compile(r"\bint\b|\blong\b|int\d+_t|\bInt\b|\bLong\b|size_t|\bunsigned\b")


def group_twin(
    refs: RepoRefs, launcher: Item, params: list[tuple[str, str]], cpu_side: Callable[[Item], bool]
) -> tuple[Item, str, str] | str | None:
    """(the twin, the helper's name, its code) when `launcher` (exposed by an adapter of
    `params`) takes a list of groups where a twin on the `cpu_side` takes one group; a reason
    when the twin is there but takes something else or no CPU code loops over it; else None."""
    l_sig = refs.signature(launcher)
    groups = groups_index(params)
    if l_sig is None or groups is None or l_sig.returns.strip() != "void":
        return None
    for twin in twin_names(launcher.names[0]):
        item = refs.definition(twin, host_side=True)
        t_sig = refs.signature(item) if item else None
        if t_sig is None or not cpu_side(item):
            continue
        callers = [
            refs.body(it)
            for items in refs.defs.values()
            for it in items
            if twin in it.refs and it is not item and cpu_side(it)
        ]
        loop, why = group_loop(l_sig.params, t_sig.params, callers, twin, groups)
        if not loop:
            return why
        name = f"kminer_groups_{launcher.names[0]}"
        return item, name, helper_code(name, l_sig.template, l_sig.params, groups, loop)
    return None


def twin_names(launcher: str) -> list[str]:
    """The launcher's name without its device word (`cuda_X` → `X`)."""
    bare = _DEVICE_PREFIX.sub("", launcher)
    return [bare] if bare and bare != launcher else []


def groups_index(params: list[tuple[str, str]]) -> int | None:
    """The one parameter that is a list of lists (the adapter's reading of `RuleBook`)."""
    found = [i for i, (t, _) in enumerate(params) if _GROUPS.search(t)]
    return found[0] if len(found) == 1 else None


def group_loop(
    launcher_params: list[tuple[str, str]],
    twin_params: list[tuple[str, str]],
    caller_bodies: list[str],
    twin: str,
    groups: int,
) -> tuple[str, str]:
    """(the body of a helper with the launcher's parameters that calls `twin` once per group,
    as the first of `caller_bodies` that loops over groups and calls it does, ""); ("", why)
    when the twin takes no group where the launcher takes the groups, or no caller loops."""
    if len(twin_params) != len(launcher_params) + 1:
        return "", f"{twin} takes {len(twin_params)} arguments, not one more than the launcher's"
    pointer, count = twin_params[groups][0], twin_params[groups + 1][0]
    if "*" not in pointer or "*" in count or not _COUNT.search(count):
        return "", f"{twin} takes no group (a pointer and a count) where the launcher takes groups"
    for body in caller_bodies:
        lifted = _lift(body, launcher_params, twin, groups)
        if lifted:
            return lifted, ""
    return "", f"no CPU code loops over groups calling {twin}"


def _lift(body: str, launcher_params: list, twin: str, groups: int) -> str | None:
    call = re.compile(rf"(?<![\w.>])(?:\w+::)*{re.escape(twin)}\s*(?:<[^<>;{{}}]*>)?\s*\(")
    names = [n for _, n in launcher_params]
    loops = sorted((m for r in _LOOPS for m in r.finditer(body)), key=lambda m: m.start())
    for loop in loops:
        end = bracket_end(body, loop.end() - 1, "{", "}")
        block = body[loop.end() : end - 1] if end else ""
        at = call.search(block)
        if not at:
            continue
        close = bracket_end(block, at.end() - 1, "(", ")")
        args = split_top(block[at.end() : close - 1]) if close else []
        if len(args) != len(names) + 1:
            continue
        renames: dict[str, str] = {loop.group("g"): names[groups]}
        new_args = []
        for k, arg in enumerate(args):
            if k in (groups, groups + 1):
                new_args.append(arg)
                continue
            param = names[k if k < groups else k - 1]
            new_args.append(param)
            plain = plain_name(arg)
            if plain and plain == arg.strip() and plain != param:
                renames[plain] = param
        rest = block[: at.start()] + "\x00" + block[close:]

        def renamed(text: str, table: dict = renames) -> str:
            return IDENT.sub(lambda m: table.get(m.group(0), m.group(0)), text)

        head = block[at.start() : at.end()]
        new_block = renamed(rest).replace("\x00", f"{head}{', '.join(new_args)})")
        return f"  {renamed(loop.group(0))}{new_block}}}\n"
    return None


def helper_code(
    name: str, template: str, launcher_params: list[tuple[str, str]], groups: int, loop: str
) -> str:
    """The helper: the launcher's template header and parameters, the groups taken as whatever
    list of lists the adapter passes."""
    inner = re.fullmatch(r"\s*template\s*<(.*)>\s*", template or "", re.DOTALL)
    inner = inner.group(1).strip() if inner else ""
    header = f"template <{', '.join(p for p in (inner, 'typename KminerGroups') if p)}>"
    params = [
        f"const KminerGroups &{n}" if i == groups else f"{t} {n}"
        for i, (t, n) in enumerate(launcher_params)
    ]
    return f"{header}\nvoid {name}({', '.join(params)}) {{\n{loop}}}\n"
