"""libclang decides which of several same-named helpers a kernel really calls.

Name lookup by text cannot tell `clampv(float)` from `clampv(int)`, nor which of two
`combine`s a `using namespace` selects; including all of them is safe for nvcc but puts code in
the unit that the kernel never runs. For the few units with such names we parse the rendered
unit itself (small and self-contained, ~0.1-0.3 s) with the PyPI libclang and CUDA stub headers
(never the torch headers: ~13 s per parse) and keep only the definitions the kernel reaches.
Whenever libclang cannot decide, everything stays.
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

_REF_KINDS = (
    "DECL_REF_EXPR",
    "CALL_EXPR",
    "TYPE_REF",
    "TEMPLATE_REF",
    "MEMBER_REF_EXPR",
    "OVERLOADED_DECL_REF",
)


@functools.cache
def _index():
    try:
        import clang.cindex as ci

        return ci, ci.Index.create()
    except Exception as exc:  # libclang missing or broken: disambiguation is optional
        log.warning("libclang unavailable (%s); same-named helpers are all kept", exc)
        return None, None


_ANGLE_INCLUDE = re.compile(r"(?m)^[ \t]*#[ \t]*include[ \t]*<[^>\n]*>.*$")


def _args() -> list[str]:
    stub = Path(__file__).resolve().parent / "stubs/clang_cuda"
    return [
        "-x",
        "cuda",
        "--cuda-host-only",
        "-nocudainc",
        "-nocudalib",
        "-std=c++17",
        "-include",
        str(stub / "kminer_cuda_min.h"),
        f"-I{stub}",
        "-ferror-limit=0",
        "-Wno-everything",
    ]


def _find_kernel(root, name: str, kernel_name: str, lines: tuple[int, int]):
    """The kernel's definition, searching only the unit's own top level (not system headers)."""
    stack = [root]
    while stack:
        for cur in stack.pop().get_children():
            loc = cur.location
            if loc.file is None or loc.file.name != name:
                continue
            if cur.kind.name in ("NAMESPACE", "LINKAGE_SPEC", "UNEXPOSED_DECL"):
                stack.append(cur)
            elif (
                cur.spelling == kernel_name
                and cur.is_definition()
                and lines[0] <= loc.line <= lines[1]
            ):
                return cur
    return None


def used_lines(unit_text: str, kernel_name: str, kernel_lines: tuple[int, int]) -> set[int] | None:
    """Lines of the unit holding declarations the kernel reaches; None if libclang can't tell."""
    ci, index = _index()
    if index is None:
        return None
    name = "kminer_unit.cu"
    # system headers only slow the parse (0.4 s → 0.1 s); the stub declares what units use
    unit_text = _ANGLE_INCLUDE.sub("", unit_text)
    try:
        tu = index.parse(name, args=_args(), unsaved_files=[(name, unit_text)], options=0)
    except ci.TranslationUnitLoadError:
        return None
    if any(d.severity >= ci.Diagnostic.Fatal for d in tu.diagnostics):
        return None
    lib = ci.conf.lib
    kernel = _find_kernel(tu.cursor, name, kernel_name, kernel_lines)
    if kernel is None:
        return None
    used: set[int] = set()
    seen: set[tuple[int, int]] = set()
    queue = [kernel]
    while queue:
        cur = queue.pop()
        for node in cur.walk_preorder():
            if node.kind.name not in _REF_KINDS:
                continue
            targets = []
            if node.kind.name == "OVERLOADED_DECL_REF":
                n = lib.clang_getNumOverloadedDecls(node)
                targets = [lib.clang_getOverloadedDecl(node, i) for i in range(n)]
            elif node.referenced is not None:
                targets = [node.referenced]
            for t in targets:
                loc = t.location
                if loc.file is None or loc.file.name != name:
                    continue
                used.add(loc.line)
                definition = t.get_definition() or t
                key = (definition.extent.start.line, definition.extent.start.column)
                if (
                    definition.location.file
                    and definition.location.file.name == name
                    and key not in seen
                ):
                    seen.add(key)
                    used.add(definition.location.line)
                    queue.append(definition)
    return used
