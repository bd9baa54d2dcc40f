"""Integer arguments that choose which kernel the host code launches, and the value that
launches this one.

A host function often picks one of several kernels by an argument the caller names
(pytorch3d's `KNearestNeighborIdxCuda(..., int version)`: `if (version == 0) V0<<<>>>; else if
(version == 1) ...`), and a repository's tests may always pass the value that lets the host
choose (`version=-1`). Every recorded call then runs another kernel than the row's: the label
passes, and so does every wrong variant of its kernel, which never runs. The condition that
guards the launch says which value reaches it: `param == 3` or `3 == param` in an `if` whose
branch holds the launch, or `case 3:` of a `switch (param)`, where `param` is an integer
parameter of the function the test calls. The launch may sit in a helper the branch calls
(a functor handed to a dispatch template), so the branch may name the kernel or any function
or struct whose body launches it. The host code keeps the last word: a value it rejects for
the shape at hand (a fallback to another version) gives a case that reaches nothing new, and
one it refuses is an invalid case.
"""

from __future__ import annotations

import re

import tree_sitter as ts

from miner.textprep import blank_comments_and_strings
from miner.treewalk import LANGUAGE


def _text(code: str, node: ts.Node | None) -> str:
    return code[node.start_byte : node.end_byte] if node is not None else ""


def _name_of(node: ts.Node, code: str) -> str:
    """The name a function definition or a struct/class defines ("" for others)."""
    if node.type in ("struct_specifier", "class_specifier"):
        return _text(code, node.child_by_field_name("name"))
    decl = node.child_by_field_name("declarator")
    while decl is not None and decl.type not in ("identifier", "field_identifier"):
        if decl.type in ("qualified_identifier", "template_function"):
            decl = decl.child_by_field_name("name")
        else:
            decl = decl.child_by_field_name("declarator")
    return _text(code, decl).split("::")[-1]


def _definitions(root: ts.Node, code: str) -> list[tuple[str, ts.Node]]:
    """(name, node) of the functions and structs defined; a struct's methods are the struct
    (a functor's `run` launches for the functor a dispatch template is handed)."""
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        if node.type in ("function_definition", "struct_specifier", "class_specifier"):
            name = _name_of(node, code).split("<")[0].strip()
            if name and node.child_by_field_name("body") is not None:
                out.append((name, node))
                continue
        stack.extend(node.children)
    return out


def _leads(defs: list[tuple[str, ts.Node]], code: str, kernel: str) -> set[str]:
    """The kernel and every definition whose body launches it, directly or through another."""
    leads = {kernel}
    launch = re.compile(rf"\b{re.escape(kernel)}\b[^;]*?<<<", re.DOTALL)
    for _ in range(3):
        others = sorted(leads - {kernel})
        call = re.compile(r"\b(?:" + "|".join(map(re.escape, others)) + r")\b") if others else None
        more = set()
        for name, node in defs:
            body = _text(code, node.child_by_field_name("body"))
            if name not in leads and (launch.search(body) or (call and call.search(body))):
                more.add(name)
        if not more:
            break
        leads |= more
    return leads


def _compared(cond: str, names: list[str]) -> list[tuple[int, int]]:
    found = []
    for i, name in enumerate(names):
        if not name:
            continue
        n = re.escape(name)
        for m in re.finditer(rf"(?<![\w.>])\b{n}\s*==\s*(-?\d+)\b|\b(-?\d+)\s*==\s*{n}\b", cond):
            found.append((i, int(m.group(1) or m.group(2))))
    return found


def kernel_selectors(label_text: str, kernel: str, names: list[str], base_args: list[list]) -> list:
    """(argument index, value): an integer argument of the called function whose value guards
    the launch of `kernel` (see the module's docstring), with the value no base call passes."""
    code = blank_comments_and_strings(label_text)
    root = ts.Parser(LANGUAGE).parse(code.encode("latin-1", errors="replace")).root_node
    defs = _definitions(root, code)
    name = kernel.split("::")[-1]
    leads = _leads(defs, code, name)
    lead = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(leads))) + r")\b")
    found: list[tuple[int, int]] = []
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.type == "if_statement":
            then = node.child_by_field_name("consequence")
            if lead.search(_text(code, then)):
                found += _compared(_text(code, node.child_by_field_name("condition")), names)
        elif node.type == "switch_statement":
            cond = _text(code, node.child_by_field_name("condition")).strip("() \t\n")
            if cond not in names:
                continue
            for case in node.child_by_field_name("body").children:
                value = case.child_by_field_name("value")
                if (
                    case.type == "case_statement"
                    and value is not None
                    and lead.search(_text(code, case)[len(_text(code, value)) :])
                ):
                    literal = _text(code, value).strip()
                    if re.fullmatch(r"-?\d+", literal):
                        found.append((names.index(cond), int(literal)))
    out = []
    for i, value in dict.fromkeys(found):
        given = [args[i] for args in base_args if i < len(args)]
        ints = all(isinstance(a, int) and not isinstance(a, bool) for a in given)
        if given and ints and value not in given:
            out.append((i, value))
    return out
