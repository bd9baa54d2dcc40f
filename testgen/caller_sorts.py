"""Whether the repository's own Python sorts what a binding returns: then the order of the
binding's last dimension is no part of its contract, and a test compares it sorted.

pytorch3d's `knn_points` calls `_C.knn_points_idx`, whose CPU build keeps each point's K
neighbours in heap order and whose CUDA kernels keep them in insertion order; `knn_points`
sorts them (`p1_dists.sort(dim=2)`) before anyone sees them. Compared element by element the
two builds differ on every case where the orders do, for a correct kernel. Only what the
repository itself shows counts: a function that assigns the binding's result and then sorts
one of those names (`x.sort(`, `torch.sort(x`, `x.argsort(`), outside its tests.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from testgen import pysources

_SORTS = ("sort", "argsort", "msort")


def caller_sorts(repo: Path, bindings: list[str]) -> str:
    """Why the last dimension of what one of `bindings` returns is compared sorted ('' when
    nothing in the repository says so)."""
    index = _index(str(repo))
    return next((index[b] for b in bindings if b in index), "")


@functools.cache
def _index(repo: str) -> dict[str, str]:
    """binding name -> the reason, for every binding some function sorts the result of."""
    root = Path(repo)
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(part.startswith(("test", ".")) for part in Path(rel).parts):
            continue
        tree = pysources.tree(path)
        if tree is None:
            continue
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for binding, line in _sorted_results(fn):
                    found.setdefault(
                        binding,
                        f"the repository's `{fn.name}` ({rel}:{line}) sorts what `{binding}` "
                        "returns",
                    )
    return found


def _sorted_results(fn: ast.AST) -> list[tuple[str, int]]:
    """(binding, line) for each call whose assigned result the function later sorts: the last
    assignment of the sorted name before the sort (`dists, i = dists.sort(2)` re-binds it)."""
    assigned: dict[str, list[tuple[int, str]]] = {}  # name -> [(line, callee)]
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            callee = _callee(node.value.func)
            for target in node.targets:
                for name in _names(target):
                    assigned.setdefault(name, []).append((node.lineno, callee))
    out = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        sorted_name = None
        if isinstance(f, ast.Attribute) and f.attr in _SORTS and isinstance(f.value, ast.Name):
            sorted_name = f.value.id  # x.sort(dim=2)
        elif _callee(f) in _SORTS and node.args and isinstance(node.args[0], ast.Name):
            sorted_name = node.args[0].id  # torch.sort(x, dim=2)
        before = [a for a in assigned.get(sorted_name or "", []) if a[0] < node.lineno]
        if before:
            line, callee = max(before)
            if callee and callee not in _SORTS:
                out.append((callee, line))
    return out


def _callee(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _names(e)]
    return []
