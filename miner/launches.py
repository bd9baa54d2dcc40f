"""Where each kernel is launched: `k<<<...>>>`, `cudaLaunchKernel((void*)k, ...)`, `&k<...>`.

A kernel that is never launched nor referenced is kept but flagged: it is still real code, yet
no host path of the repository exercises it. Same-named kernels in different files are told
apart by the include graph: a launch can only reach kernels its file can see.
"""

from __future__ import annotations

import bisect
import re

from miner.aliases import DEFINE_LINE, define_scope_end
from miner.candidate import LaunchSite
from miner.filemodel import Cond, FileModel, Include
from miner.includes import IncludeResolver
from miner.macro_kernels import split_args
from miner.repo_model import Discovery

_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
_LAUNCH_API = re.compile(
    r"\b(cudaLaunch\w*|cudaFuncSetAttribute|cudaFuncGetAttributes|"
    r"cudaOccupancy\w*|cuLaunch\w*|hipLaunch\w*)\s*\("
)
_ADDRESS = re.compile(
    r"(?:&|\(\s*(?:const\s+)?void\s*\*\s*\)\s*&?|reinterpret_cast\s*<[^>]*>\s*\(\s*&?)\s*"
    r"(?:[A-Za-z_]\w*\s*::\s*)*$"
)
_DIRECTIVE_LINE = re.compile(r"^[ \t]*#[ \t]*define\b")
# a type alias written inside the launching function: `using scalar_t = c10::complex<float>;`,
# `typedef float scalar_t;`
_LOCAL_USING = re.compile(r"\busing\s+([A-Za-z_]\w*)\s*=\s*([^;{}]+);")
_LOCAL_TYPEDEF = re.compile(r"\btypedef\s+([^;{}]+?)\s+([A-Za-z_]\w*)\s*;")


def include_graph(models: dict[str, FileModel], resolver: IncludeResolver) -> dict[str, set[str]]:
    """file → files it includes directly (all #if branches)."""
    graph: dict[str, set[str]] = {}
    for rel, model in models.items():
        out: set[str] = set()

        def walk(events, rel=rel, out=out) -> None:
            for ev in events:
                if isinstance(ev, Include):
                    target = resolver.resolve(rel, ev.path, ev.angle)
                    if target:
                        out.add(target)
                elif isinstance(ev, Cond):
                    for _, _, evs in ev.branches:
                        walk(evs)

        walk(model.events)
        graph[rel] = out
    return graph


def reachable(graph: dict[str, set[str]], start: str, cache: dict[str, set[str]]) -> set[str]:
    if start not in cache:
        seen, stack = {start}, [start]
        while stack:
            for nxt in graph.get(stack.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        cache[start] = seen
    return cache[start]


def _angle_end(code: str, j: int) -> int | None:
    depth = 0
    for k in range(j, min(len(code), j + 400)):
        c = code[k]
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
            if depth == 0:
                return k + 1
        elif c in ";{}":
            return None
    return None


def _classify(code: str, pos: int, end: int) -> tuple[str, str, str]:
    """(kind, template args, launch config) of a kernel name occurrence at code[pos:end]."""
    j = end
    while j < len(code) and code[j] in " \t\r\n":
        j += 1
    targs = ""
    if code.startswith("<", j) and not code.startswith("<<<", j):
        close = _angle_end(code, j)
        if close is not None:
            targs = " ".join(code[j + 1 : close - 1].replace("\\\n", " ").split())
            j = close
            while j < len(code) and code[j] in " \t\r\n":
                j += 1
    if code.startswith("<<<", j):
        stop = code.find(">>>", j)
        config = " ".join(code[j + 3 : stop].split()) if stop > 0 else ""
        return "chevron", targs, config
    line_start = code.rfind("\n", 0, pos) + 1
    if _DIRECTIVE_LINE.match(code[line_start:pos]) or _in_continued_define(code, line_start):
        return "macro", targs, ""
    stmt_start = max(code.rfind(c, 0, pos) for c in ";{}") + 1
    if _LAUNCH_API.search(code[stmt_start:pos]):
        return "launch_api", targs, ""
    if _ADDRESS.search(code[max(0, pos - 80) : pos]):
        return "address", targs, ""
    return "reference", targs, ""


def _in_continued_define(code: str, line_start: int) -> bool:
    """True if the line is part of a multi-line #define (previous lines end with a backslash)."""
    pos = line_start
    while pos > 0:
        prev_end = pos - 1
        if prev_end <= 0 or code[prev_end - 1] != "\\":
            return False
        prev_start = code.rfind("\n", 0, prev_end) + 1
        if _DIRECTIVE_LINE.match(code[prev_start:prev_end]):
            return True
        pos = prev_start
    return False


def find_launch_sites(disc: Discovery) -> dict[int, list[LaunchSite]]:
    by_name: dict[str, list] = {}
    for k in disc.kernels:
        by_name.setdefault(k.kdef.name, []).append(k)
    result: dict[int, list[LaunchSite]] = {id(k.kdef): [] for k in disc.kernels}
    if not by_name:
        return result
    resolver = IncludeResolver(list(disc.models))
    graph = include_graph(disc.models, resolver)
    reach_cache: dict[str, set[str]] = {}
    for rel, model in disc.models.items():
        code = model.code
        hits = [m for m in _WORD.finditer(code) if m.group(0) in by_name]
        if not hits:
            continue
        own = [(k.start, k.end, k.name) for k in model.kernels]
        own += [  # a kernel stamped by a macro: its invocation names it, and is no launch
            (k.kdef.start, k.kdef.end, k.kdef.name)
            for k in disc.kernels
            if k.file == rel and k.from_macro
        ]
        own += model.excluded_spans
        functions = sorted(
            (it.start, it.end, it.names[0] if it.names else "")
            for it in model.items
            if it.kind in ("function", "kernel")
        )
        starts = [f[0] for f in functions]
        for m in hits:
            name, pos = m.group(0), m.start()
            if any(s <= pos < e and n == name for s, e, n in own):
                continue
            kind, targs, config = _classify(code, pos, m.end())
            i = bisect.bisect_right(starts, pos) - 1
            inside = i >= 0 and functions[i][1] > pos
            caller = functions[i][2] if inside else ""
            if targs:  # a launch written inside a macro takes the macro's arguments
                targs = _through_macro(model, pos, targs)
            if targs and inside:
                targs = _substitute(targs, _local_aliases(code[functions[i][0] : pos]))
            site = LaunchSite(
                file=rel,
                line=model.lines.line(pos),
                kind=kind,
                caller=caller,
                template_args=targs,
                config=config,
            )
            targets = by_name[name]
            if len(targets) > 1:
                seen = reachable(graph, rel, reach_cache)
                visible = [k for k in targets if k.file in seen]
                targets = visible or targets
            for k in targets:
                result[id(k.kdef)].append(site)
    return result


def _substitute(text: str, mapping: dict[str, str]) -> str:
    return re.sub(r"[A-Za-z_]\w*", lambda w: mapping.get(w.group(0), w.group(0)), text)


def _local_aliases(body: str) -> dict[str, str]:
    """Type aliases the launching function declares before the launch, so that a site's
    `scalar_t` reads as the one type it names there (state-spaces/s4 pins its kernels to
    `using scalar_t = c10::complex<float>;`; a unit instantiating float fails)."""
    found = {m.group(1): " ".join(m.group(2).split()) for m in _LOCAL_USING.finditer(body)}
    for m in _LOCAL_TYPEDEF.finditer(body):
        found[m.group(2)] = " ".join(m.group(1).split())
    return {k: v for k, v in found.items() if k not in _WORD.findall(v)}


def _through_macro(model: FileModel, pos: int, targs: str) -> str:
    """Template arguments written inside a launch macro, with the macro's parameters replaced
    by the arguments of its first invocation in the same file (mmcv filtered_lrelu's CASE)
    while this definition holds: a name defined again, or undefined, is another macro from
    there (SparseConvNet's `FOO` before each function that expands it). A one-parameter macro
    that is only handed to another (`MAP(CASE_LOG_N, 1, 2, ..., 10)`, state-spaces/s4: a
    variadic map applies it to each value) takes the first value after its name."""
    code = model.code
    for m in DEFINE_LINE.finditer(code):
        if not (m.start() <= pos < m.end()) or m.group("params") is None:
            continue
        params = [p.strip() for p in m.group("params")[1:-1].split(",")]
        name, end = m.group("name"), define_scope_end(code, m)
        call = re.compile(rf"\b{re.escape(name)}\s*\(")
        for inv in call.finditer(code, m.end(), end):
            if _in_define(code, inv.start()):
                continue
            args = split_args(code[inv.end() : _closing(code, inv.end() - 1)])
            return " ".join(_substitute(targs, dict(zip(params, args, strict=False))).split())
        handed = re.compile(rf"\b\w+\s*\(\s*{re.escape(name)}\s*,")
        for inv in handed.finditer(code, m.end(), end):
            if len(params) != 1 or _in_define(code, inv.start()):
                continue
            opened = code.index("(", inv.start())
            args = split_args(code[opened + 1 : _closing(code, opened)])
            if len(args) > 1:
                return " ".join(_substitute(targs, {params[0]: args[1]}).split())
        break
    return targs


def _in_define(code: str, pos: int) -> bool:
    return any(d.start() <= pos < d.end() for d in DEFINE_LINE.finditer(code))


def _closing(code: str, opened: int) -> int:
    """The position of the `)` that closes the `(` at `opened` (within 4000 characters)."""
    depth, j = 0, opened
    for j in range(opened, min(len(code), opened + 4000)):
        depth += (code[j] == "(") - (code[j] == ")")
        if depth == 0:
            break
    return j
