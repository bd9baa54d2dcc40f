"""Whether the repository's own Python sorts what a binding returns: then the order of the
binding's last dimension is no part of its contract, and a test compares it sorted.

pytorch3d's `knn_points` calls `_C.knn_points_idx`, whose CPU build keeps each point's K
neighbours in heap order and whose CUDA kernels keep them in insertion order; `knn_points`
sorts them (`p1_dists.sort(dim=2)`) before anyone sees them. Compared element by element the
two builds differ on every case where the orders do, for a correct kernel. Only what the
repository itself shows counts: a function that assigns the binding's result and then sorts
one of those names (`x.sort(`, `torch.sort(x`, `x.argsort(`), outside its tests; or a test
that compares what a function returning the binding's result gives only as a set (pytorch_cluster's
`to_set(radius(x, y, 2))`: its CPU build lists each query's neighbours nearest first, its CUDA
kernel in index order; torch-points-kernels' `set(res[i][j])` row by row, where `res =
ball_query(...)[0].detach().numpy()`).
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
    """binding name -> the reason, for every binding some function sorts the result of, or
    returns as it is to a test that compares it as a set (one walk over the sources)."""
    root = Path(repo)
    found: dict[str, str] = {}
    returns: dict[str, set[str]] = {}  # function -> the callees whose results it returns
    tests = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = Path(rel).parts
        tree = None if any(p.startswith(".") for p in parts) else pysources.tree(path)
        if tree is None:
            continue
        if any(p.startswith("test") for p in parts):
            tests.append((rel, tree))
            continue
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for binding, line in _sorted_results(fn):
                found.setdefault(
                    binding,
                    f"the repository's `{fn.name}` ({rel}:{line}) sorts what `{binding}` returns",
                )
            for node in ast.walk(fn):
                if isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
                    callee = _callee(node.value.func)
                    if callee:  # (the binding may share the function's name)
                        returns.setdefault(fn.name, set()).add(callee)
    for binding, why in _tested_as_sets(tests, returns).items():
        found.setdefault(binding, why)
    return found


def _tested_as_sets(tests: list, returns: dict[str, set[str]]) -> dict[str, str]:
    """binding -> the reason, for every binding whose result a function returns as it is
    (`return torch.ops.ns.radius(...)`, `returns`) and one of `tests` (rel, tree) compares
    as a set."""
    found: dict[str, str] = {}
    for rel, tree in tests:
        as_set = {"set", "frozenset"} | {
            fn.name
            for fn in tree.body
            if isinstance(fn, ast.FunctionDef)
            and any(isinstance(n, ast.Call) and _callee(n.func) == "set" for n in ast.walk(fn))
        }
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for callee, line in _set_compared(fn, as_set):
                for binding in sorted(returns.get(callee, ())):
                    found.setdefault(
                        binding,
                        f"the repository's test `{fn.name}` ({rel}:{line}) compares what "
                        f"`{callee}` returns as a set",
                    )
    return found


def _set_compared(fn: ast.AST, as_set: set[str]) -> list[tuple[str, int]]:
    """(callee, line) for each call whose assigned result the test passes to `set(...)` or to
    one of its helpers that makes a set (`to_set(edge_index)`)."""
    assigned: dict[str, list[tuple[int, str]]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Call, ast.Subscript)):
            for target in node.targets:
                for name in _names(target):
                    assigned.setdefault(name, []).append((node.lineno, _producer(node.value)))
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and _callee(node.func) in as_set and node.args:
            used = {n.id for n in ast.walk(node.args[0]) if isinstance(n, ast.Name)}
            for name in used:
                before = [a for a in assigned.get(name, []) if a[0] <= node.lineno]
                if before:
                    line, callee = max(before)
                    out.append((callee, line))
    return out


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


_PASS_THROUGH = {"detach", "numpy", "cpu", "cuda", "contiguous", "clone", "to", "tolist"}


def _producer(value: ast.AST) -> str:
    """The function whose result an assigned value is, through what keeps its values
    (`ball_query(1, 500, a, b)[0].detach().numpy()` is `ball_query`'s)."""
    node = value
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            inner = node.func.value
            if node.func.attr in _PASS_THROUGH and isinstance(inner, (ast.Call, ast.Subscript)):
                node = inner
            else:
                return node.func.attr
        elif isinstance(node, ast.Call):
            return _callee(node.func)
        else:
            return ""


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
