"""The version of the code behind a stage's results: a hash of everything its module can run.

A stage's stored key says "this result came from this code and these tools"; a rerun redoes the
work only when that changes. A hand-kept list of modules goes stale the day someone adds an
import, so the list is computed: the module's import closure within kminer's own packages
(imports inside functions included), plus the files those modules name by path (templates under
`prompts/`, scripts run as subprocesses, stub header folders), plus the versions of the outside
tools the stage says it depends on.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import re
from pathlib import Path

from miner import toolchain

PACKAGES = ("miner", "wrappers", "testgen", "curation", "prompts")
_PATHLIKE = re.compile(r"^[\w.-]+(/[\w.-]+)*$")


@functools.cache
def _module_file(name: str) -> Path | None:
    if name.split(".")[0] not in PACKAGES:
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _package_of(name: str, file: Path) -> str:
    return name if file.name == "__init__.py" else name.rpartition(".")[0]


def _imports(name: str, file: Path, tree: ast.AST) -> set[str]:
    """Every kminer module `file` imports, wherever the import statement sits."""
    package = _package_of(name, file)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    closed: set[str] = set()
    for module in found:  # importing a.b.c runs a/__init__ and a/b/__init__ too
        parts = module.split(".")
        closed |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {m for m in closed if _module_file(m) is not None}


def _named_files(file: Path, tree: ast.AST) -> set[Path]:
    """Files a module names in a string literal: `x.j2` (a template under prompts/), or a path
    that exists beside the module or under its top package (a script, a stub folder)."""
    top = file.parent
    while (top.parent / "__init__.py").exists():
        top = top.parent
    prompts = top.parent / "prompts"
    found: set[Path] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        text = node.value
        if not _PATHLIKE.match(text) or ("." not in text and "/" not in text):
            continue
        for base in (file.parent, top, prompts):
            path = base / text
            if path.is_file():
                found.add(path)
            elif path.is_dir() and "/" in text:
                found |= {p for p in path.rglob("*") if p.is_file()}
    return found


@functools.cache
def import_closure(module: str) -> tuple[Path, ...]:
    """The files of `module` and of every kminer module it can import, and the files they name."""
    seen: set[str] = set()
    files: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        file = _module_file(name)
        if file is None:
            continue
        tree = ast.parse(file.read_bytes())
        files.add(file)
        files |= _named_files(file, tree)
        todo += sorted(_imports(name, file, tree) - seen)
    return tuple(sorted(files))


@functools.cache
def code_version(module: str, tools: tuple[str, ...] = ()) -> str:
    """Hash of `module`'s import closure and of the versions of `tools` (see toolchain.py)."""
    closure = import_closure(module)
    root = Path(__file__).resolve().parent.parent  # where kminer's packages sit side by side
    h = hashlib.sha256()
    for path in closure:
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    for tool in tools:
        h.update(f"\0{tool}={toolchain.tool_version(tool)}".encode())
    return h.hexdigest()[:16]
