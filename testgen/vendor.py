"""One Python function of a repository as a standalone source: the function and what it needs.

A reference that travels in a dataset row cannot import the repository (its package imports
the compiled extension, and the row must run without it). So the function is copied with the
module-level names it reads, transitively: imports of torch, numpy and the standard library as
they were written, helpers and constants of its module, and helpers it imports from the
repository's other modules (copied the same way). Decorators are dropped (`@torch.jit.script`
of a copy is not the point). A name that comes from another third-party package (einops,
triton) makes it unusable: the answer says which, but for einops' `rearrange` and `repeat`,
whose plain-torch stand-in (testgen/einops_lite.py) is copied in with the function, and for a
framework's accelerator probes and version parsing (testgen/framework_lite.py).
"""

from __future__ import annotations

import ast
import builtins
import sys
from dataclasses import dataclass, field
from pathlib import Path

from testgen import einops_lite, framework_lite, pysources

ALLOWED_ROOTS = {"torch", "numpy"} | set(sys.stdlib_module_names)
STAND_INS = {"einops": (Path(einops_lite.__file__), set(einops_lite.EXPORTS))}
FRAMEWORK = (Path(framework_lite.__file__), set(framework_lite.EXPORTS))
_STAND_IN_FILES = {"framework": FRAMEWORK[0]} | {m: f for m, (f, _) in STAND_INS.items()}
TRAVELS = "only torch, numpy and the standard library travel"
MAX_ITEMS = 80  # names followed (mmcv's _filtered_lrelu_ref: 61, through bias_act and upfirdn2d)


class _Module:
    def __init__(self, path: Path) -> None:
        self.path = path
        text, tree = pysources.text(path), pysources.tree(path)
        if text is None or tree is None:
            raise ValueError("not readable Python")
        self.text, self.tree = text, tree
        self.defs: dict[str, ast.stmt] = {}
        self.imports: dict[str, tuple[ast.stmt, ast.alias]] = {}
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                self.defs[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        self.defs.setdefault(t.id, node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    bound = (alias.asname or alias.name).split(".")[0]
                    self.imports[bound] = (node, alias)
        for fn in pysources.lifted(path):  # a test's expected value, computed in line
            self.defs.setdefault(fn.name, fn)


def _free_names(node: ast.AST) -> set[str]:
    """Names a definition reads that it does not bind itself (approximately: any name loaded
    and never stored or declared a parameter anywhere inside it)."""
    loaded, bound = set(), set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            (loaded if isinstance(sub.ctx, ast.Load) else bound).add(sub.id)
        elif isinstance(sub, ast.arg):
            bound.add(sub.arg)
        elif (
            isinstance(sub, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and sub is not node
        ):
            bound.add(sub.name)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in sub.names}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for deco in node.decorator_list:  # dropped: what they read is not needed
            loaded -= {n.id for n in ast.walk(deco) if isinstance(n, ast.Name)}
    return loaded - bound - set(dir(builtins))


def _module_file(repo: Path, here: Path, node: ast.ImportFrom) -> Path | None:
    """The repository file an import names (`from .x import f`, `from pkg.x import f`)."""
    parts = (node.module or "").split(".") if node.module else []
    if node.level:
        base = here.parent
        for _ in range(node.level - 1):
            base = base.parent
    else:
        base = repo
    target = base.joinpath(*parts) if parts else base
    for cand in (target.with_suffix(".py"), target / "__init__.py"):
        if cand.is_file() and repo in cand.resolve().parents:
            return cand
    return None


def _stand_in(module: str) -> str:
    """The stand-in's code without its docstring, under a line that says what it is."""
    if module == "unavailable":
        return _UNAVAILABLE
    text = _STAND_IN_FILES[module].read_text("utf-8")
    first = ast.parse(text).body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        text = "\n".join(text.splitlines()[first.end_lineno :])
    return f"# {module}'s functions in plain torch (kminer's stand-in)\n" + text.strip() + "\n"


def vendor_function(repo: Path, file: str, name: str, given: tuple[str, ...] = ()) -> str:
    """The function's source with its needs; '!why' when it cannot stand alone. `given`: names
    of the function's module the caller defines after it (testgen.driver_twin's extension
    module), neither vendored nor followed."""
    walk = _Walk(repo.resolve())
    unavailable: dict[str, str] = {}  # names that stand in as _Unavailable, and why
    seen: set[tuple[Path, str]] = set()
    walk.todo.append((walk.repo / file, name, 0))  # 0: the reference, 1: what it reads, 2: deeper
    while walk.todo:
        path, wanted, depth = walk.todo.pop()
        if (path, wanted) in seen or (wanted in given and path == walk.repo / file):
            continue
        seen.add((path, wanted))
        if len(seen) > MAX_ITEMS:
            return f"!needs more than {MAX_ITEMS} definitions"
        why = walk.resolve(path, wanted, depth)
        if why is None:
            continue
        if depth <= 1:
            return "!" + why
        unavailable.setdefault(wanted, why)  # read on a helper's path the CPU may not take
    order = {p: i for i, p in enumerate(reversed(list(walk.modules)))}  # helpers' files first
    walk.chunks.sort(key=lambda c: (order[c[0]], c[1]))
    body = [_guarded(src, set(unavailable)) for _, _, src in walk.chunks]
    if unavailable:
        walk.stand_ins.add("unavailable")
        body.insert(0, "\n".join(f"{n} = _Unavailable({w!r})" for n, w in unavailable.items()))
    body = [_stand_in(m) for m in sorted(walk.stand_ins)] + body
    imports = walk.imports
    aliases = [i for i in imports if " = " in i]
    head = sorted({i for i in imports if " = " not in i}, key=lambda i: (i.startswith("from"), i))
    return "\n".join(head) + "\n\n\n" + "\n\n\n".join(body) + "\n" + "\n".join(aliases) + "\n"


_UNAVAILABLE = '''class _Unavailable:
    """A name a helper of the reference reads that cannot travel (the compiled extension, a
    framework): using it in any way raises, so a path that needs it fails its check."""

    def __init__(self, why):
        self.__dict__["_why"] = why

    def __getattr__(self, name):
        raise RuntimeError(self._why)

    def __call__(self, *args, **kwargs):
        raise RuntimeError(self._why)

    def __bool__(self):
        raise RuntimeError(self._why)
'''


def _guarded(source: str, unavailable: set[str]) -> str:
    """A module-level statement that reads a stood-in name (`ext_module =
    ext_loader.load_ext(...)`) made at import time: when it fails, what it binds stands in too."""
    try:
        node = ast.parse(source).body[0]
    except (SyntaxError, IndexError):
        return source
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or not _free_names(node) & unavailable:
        return source
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names = [t.id for t in targets if isinstance(t, ast.Name)]
    fallback = "\n".join(f"    {n} = _Unavailable({source.splitlines()[0]!r})" for n in names)
    body = "\n".join("    " + line for line in source.splitlines())
    return f"try:\n{body}\nexcept Exception:\n{fallback or '    pass'}"


@dataclass
class _Walk:
    """What vendoring has gathered so far: the files read, the definitions to copy, the imports
    and stand-ins to write, and the names still to follow ((file, name, depth))."""

    repo: Path
    modules: dict[Path, _Module] = field(default_factory=dict)
    chunks: list[tuple[Path, int, str]] = field(default_factory=list)  # (file, line, source)
    imports: list[str] = field(default_factory=list)
    stand_ins: set[str] = field(default_factory=set)
    todo: list[tuple[Path, str, int]] = field(default_factory=list)

    def resolve(self, path: Path, wanted: str, depth: int) -> str | None:
        """Takes in what `wanted` needs in `path` (its definition, or the import that binds it,
        and what those read); says why it cannot travel, else None."""
        try:
            mod = self.modules.get(path) or self.modules.setdefault(path, _Module(path))
        except (OSError, SyntaxError, ValueError) as exc:
            return f"cannot read {path.name}: {exc}"
        node = mod.defs.get(wanted)
        if node is not None:
            self.chunks.append((path, node.lineno, _source(mod, node)))
            function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            deeper = depth + 1 if function or depth == 0 else depth  # a constant: its reader's
            self.todo += [(path, n, deeper) for n in _free_names(node)]
            return None
        found = mod.imports.get(wanted)
        if found is None:
            return f"`{wanted}` is not defined in {path.relative_to(self.repo)}"
        stmt, alias = found
        if not isinstance(stmt, ast.ImportFrom):
            if alias.name.split(".")[0] not in ALLOWED_ROOTS:
                return f"needs `{alias.name}` ({TRAVELS})"
            self.imports.append(
                f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
            )
            return None
        source_file = _module_file(self.repo, path, stmt)
        bound = alias.asname or alias.name
        if source_file is not None:
            self.todo.append((source_file, alias.name, depth))  # the same name, elsewhere
        elif not stmt.level and stmt.module in STAND_INS:
            if alias.name not in STAND_INS[stmt.module][1]:
                return f"needs `{stmt.module}.{alias.name}` ({TRAVELS})"
            self.stand_ins.add(stmt.module)
        elif stmt.level or (stmt.module or "").split(".")[0] not in ALLOWED_ROOTS:
            if stmt.level or not (
                alias.name in FRAMEWORK[1] or framework_lite.PROBE.match(alias.name)
            ):
                return f"needs `{stmt.module or '.'}` ({TRAVELS})"
            self.stand_ins.add("framework")  # digit_version, is_musa_available: framework_lite
            if alias.name not in FRAMEWORK[1]:
                self.imports.append(f"{bound} = _no_accelerator")
                return None
        else:
            self.imports.append(
                f"from {stmt.module} import {alias.name}"
                + (f" as {alias.asname}" if alias.asname else "")
            )
            return None
        if bound != alias.name:
            self.imports.append(f"{bound} = {alias.name}")
        return None


def _source(mod: _Module, node: ast.stmt) -> str:
    """A definition's source as written, without its decorators."""
    if getattr(node, "kminer_lifted", False):  # made from a test's statements: no text of its own
        return ast.unparse(node)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return ast.get_source_segment(mod.text, node) or ""
    source = ast.get_source_segment(mod.text, node, padded=False) or ""
    if node.decorator_list and source.startswith("@"):
        source = source.split("\n", len(node.decorator_list))[-1]
    return source
