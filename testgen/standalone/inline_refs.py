"""The expected values a repository's tests compute in line, lifted into functions.

Many tests build their reference in the test body itself instead of a helper:

    idx = knn(5, xyz, new_xyz)
    dist = ((new_xyz_ - xyz_) ** 2).sum(-1)      # (after two lines that expand the inputs)
    expected_idx = dist.topk(k=5, dim=2, largest=False)[1].transpose(2, 1)
    assert torch.all(idx == expected_idx)

A comparison (`assert_close(a, b)`, `allclose`, `torch.equal`, `(a == b).all()`, `assertTrue`,
`np.testing.assert_*`...) has two sides; each is sliced back through the statements before it.
The side whose slice calls nothing but torch, numpy, the standard library and the test file's
own helpers is the expected value, when the other side's slice calls something else (the op).
Its statements that the op's side does not share become a function of the names they read from
the rest of the test (`xyz`, `new_xyz`: what the op was given too), returning the expected side
(`expected_idx_of_test_knn(new_xyz, xyz)`). kminer then treats it as any reference the tests
call (testgen/python_reference.py pairs it with the extension call by value): the recorder
keeps the names it reads before its statements run and its value after (`apply`), as one
call of it, and the vendoring reads the same function from this module, which both sides run
on the same source.

Standard library only: it runs inside the recorder's sandbox too.
"""

from __future__ import annotations

import ast
import builtins
import copy
import os

COMPARERS = {
    "allclose", "isclose", "equal", "assert_close", "assert_allclose", "assert_equal",
    "assert_array_equal", "assert_array_almost_equal", "assert_almost_equal", "assertEqual",
    "assertAlmostEqual", "assertTrue", "all", "array_equal", "assert_tensor_equal",
}  # fmt: skip
TRUSTED_ROOTS = {"torch", "numpy", "np", "math", "F", "functools", "itertools", "operator"}
MUTATORS = {"append", "extend", "insert", "add_", "copy_", "fill_", "zero_", "update", "add"}
_BUILTINS = set(dir(builtins))
META = {"shape", "dtype", "device", "size", "ndim", "numel", "dim", "len", "is_contiguous"}


def is_test_file(path: str) -> bool:
    """Whether the file is one of the repository's tests (test_x.py, x_test.py, x_tests.py):
    only a test's checks hold expected values to lift."""
    name = os.path.basename(path)
    return name.startswith("test") or name.endswith(("_test.py", "_tests.py"))


def lifted_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """The lifted reference functions of a test module (new nodes; the tree is not changed)."""
    return [fn for fn, *_ in _lifts(tree)]


def apply(tree: ast.Module, rel: str = "") -> ast.Module:
    """The module with each lifted function's call recorded where the test computes it, at no
    cost of its own (a test's reference may loop over 8000 voxels): the names it reads are
    handed to `__kminer_inline_args__(rel, name, [...])` before its first statement, and its
    value to `__kminer_inline_result__(rel, name, value)` after its last; the statements that
    call the op it is compared with run inside `with __kminer_inline_op__(rel, [names])`. The
    functions are not defined in the module: the recorder keeps the pair as a call of them."""
    marks, ops = [], {}
    for fn, body, first, at, op_side in _lifts(tree):
        for j in op_side:  # the statements that call the op this value is compared with
            ops.setdefault((id(body), j), (body, j, []))[2].append(fn.name)
        args = ast.List([ast.Name(a.arg, ast.Load()) for a in fn.args.args], ast.Load())
        value = copy.deepcopy(fn.body[-1].value)
        marks.append((body, at + 1, _hook("__kminer_inline_result__", rel, fn.name, value)))
        marks.append((body, first, _hook("__kminer_inline_args__", rel, fn.name, args)))
    for body, j, names in ops.values():  # in place: no position moves
        body[j] = _within_op(body[j], rel, names)
    # later positions first within a body (the earlier ones hold); at one position the result
    # of a check's expected value before the arguments of the next (it was appended first)
    for body, at, stmt in sorted(marks, key=lambda m: (id(m[0]), -m[1])):
        body.insert(at, stmt)
    return ast.fix_missing_locations(tree)


def _within_op(stmt: ast.stmt, rel: str, names: list[str]) -> ast.stmt:
    """`with __kminer_inline_op__(rel, [names]): stmt`: the extension calls it makes are the
    ones the lifted values are paired with (not a test's other ops: its `max` beside `mean`)."""
    names_list = ast.List([ast.Constant(n) for n in names], ast.Load())
    call = ast.Call(ast.Name("__kminer_inline_op__", ast.Load()), [ast.Constant(rel)], [])
    call.args.append(names_list)
    return ast.copy_location(ast.With(items=[ast.withitem(call)], body=[stmt]), stmt)


def _hook(name: str, rel: str, function: str, value: ast.expr) -> ast.stmt:
    call = ast.Call(ast.Name(name, ast.Load()), [ast.Constant(rel), ast.Constant(function)], [])
    call.args.append(value)
    return ast.Expr(call)


def _lifts(tree: ast.Module) -> list[tuple[ast.FunctionDef, list, int, int]]:
    """(function, the statement list it comes from, its first statement's position there, the
    position after which its value is known)."""
    module = _ModuleNames(tree)
    found: list = []
    names: set[str] = set()
    seen: set[str] = set()
    for fn in _test_functions(tree):
        for body in _statement_lists(fn.body):
            for i, stmt in enumerate(body):
                sides = _compared(stmt)
                if sides is None:
                    continue
                lift = _lift(body, i, sides, module, fn, names)
                if lift is not None and _same_as(lift[0]) not in seen:
                    seen.add(_same_as(lift[0]))
                    names.add(lift[0].name)
                    found.append((lift[0], body, *lift[1:]))
    return found


def _same_as(fn: ast.FunctionDef) -> str:
    """A lifted function's identity apart from its name (a test's second check of the same
    expected value lifts it again)."""
    return ast.dump(fn.args) + "".join(ast.dump(s) for s in fn.body)


def _test_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            out.append(node)
        elif isinstance(node, ast.ClassDef):
            out += [
                sub
                for sub in node.body
                if isinstance(sub, ast.FunctionDef) and sub.name.startswith("test")
            ]
    return out


def _statement_lists(body: list) -> list[list]:
    """The function's body and the bodies of its loops, branches and `with` blocks."""
    lists = [body]
    for stmt in body:
        if isinstance(stmt, (ast.For, ast.While, ast.If, ast.With)):
            lists += _statement_lists(stmt.body)
            if getattr(stmt, "orelse", None):
                lists += _statement_lists(stmt.orelse)
    return lists


def _compared(stmt: ast.stmt) -> tuple[ast.expr, ast.expr] | None:
    """The two sides a checking statement compares, or None."""
    if isinstance(stmt, ast.Assert):
        expr = stmt.test
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        expr = stmt.value
    else:
        return None
    for node in ast.walk(expr):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
            return node.left, node.comparators[0]
        if isinstance(node, ast.Call) and _called(node) in COMPARERS:
            args = list(node.args)
            if len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2]):
                return args[0], args[1]
    return None


def _not_data(side: ast.expr) -> bool:
    """A side that is no tensor's values: a constant, a shape, a dtype, a length."""
    if isinstance(side, ast.Constant):
        return True
    if isinstance(side, ast.Attribute) and side.attr in META:
        return True
    return isinstance(side, ast.Call) and _called(side) in META


def _called(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _root(expr: ast.expr) -> str:
    while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Call)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else ""


class _ModuleNames:
    """What the module's names are: trusted imports, its own helpers (trusted when they call
    nothing foreign themselves), and everything else it imports (foreign: the op)."""

    def __init__(self, tree: ast.Module) -> None:
        self.trusted: set[str] = set()
        self.foreign: set[str] = set()
        helpers: dict[str, ast.AST] = {}
        for node in tree.body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    root = a.name.split(".")[0]
                    bound = a.asname or root
                    (self.trusted if root in TRUSTED_ROOTS else self.foreign).add(bound)
            elif isinstance(node, ast.ImportFrom):
                root = (node.module or "").split(".")[0]
                for a in node.names:
                    bound = a.asname or a.name
                    trusted = not node.level and root in TRUSTED_ROOTS
                    (self.trusted if trusted else self.foreign).add(bound)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                helpers[node.name] = node
            elif isinstance(node, ast.Assign):
                self.trusted |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for name, node in helpers.items():
            calls = {_root(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
            (self.foreign if calls & self.foreign else self.trusted).add(name)

    def is_global(self, name: str) -> bool:
        return name in self.trusted or name in self.foreign or name in _BUILTINS


def _loaded(node: ast.AST) -> set[str]:
    """Names a statement reads from before it (those bound inside its comprehensions and
    lambdas left out, and, for a loop, branch or `with`, those it binds itself)."""
    loaded, inner = set(), set()
    if isinstance(node, (ast.For, ast.While, ast.If, ast.With)):
        inner = {
            n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            loaded.add(sub.id)
        elif isinstance(sub, ast.comprehension):
            inner |= {n.id for n in ast.walk(sub.target) if isinstance(n, ast.Name)}
        elif isinstance(sub, ast.Lambda):
            inner |= {a.arg for a in sub.args.args}
    return loaded - inner


def _defined(stmt: ast.stmt) -> tuple[set[str], set[str]]:
    """(every name the statement sets or changes, the names it sets anew): `x = ...` sets x
    anew; `x += ...`, `x.append(...)`, `x[i] = ...` and a loop's assignments change it."""
    anew: set[str] = set()
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for t in targets:
            for n in ast.walk(t):
                if (
                    isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Store)
                    and (t is n or isinstance(t, (ast.Tuple, ast.List)))
                ):
                    anew.add(n.id)
    changed = {
        n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    for sub in ast.walk(stmt):
        if isinstance(sub, (ast.Subscript, ast.Attribute)) and isinstance(sub.ctx, ast.Store):
            changed.add(_root(sub))
        elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            attr = sub.func.attr
            if attr in MUTATORS or (attr.endswith("_") and not attr.startswith("_")):
                changed.add(_root(sub.func.value))
    return changed - {""}, anew


def _slice(body: list, i: int, wanted: set[str]) -> tuple[list[int], set[str]]:
    """The statements before `i` the values of `wanted` come from, and the names they read from
    before the list."""
    needed, picked = set(wanted), []
    for j in range(i - 1, -1, -1):
        changed, anew = _defined(body[j])
        if changed & needed:
            picked.append(j)
            needed = (needed - anew) | _loaded(body[j])
    return sorted(picked), needed


def _calls_op(stmt: ast.stmt, module: _ModuleNames) -> bool:
    """Whether the statement calls something foreign or a callable the test made itself
    (`dsmean(feats, coors)`, `dsmean = DynamicScatter(...)` before)."""
    for c in ast.walk(stmt):
        if isinstance(c, ast.Call):
            f = c.func
            if _root(f) in module.foreign:
                return True
            if isinstance(f, ast.Name) and not module.is_global(f.id):
                return True
    return False


def _placing(stmts: list, ret: ast.stmt) -> set[str]:
    """Names read only to say where or as what a tensor is made (`device=device`,
    `.to(dtype)`): a function of those alone computes nothing from the test's data."""
    loads: dict[str, int] = {}
    placed: dict[str, int] = {}

    def count(node: ast.AST, into: dict) -> None:
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                into[n.id] = into.get(n.id, 0) + 1

    for stmt in [*stmts, ret]:
        count(stmt, loads)
        for node in ast.walk(stmt):
            if isinstance(node, ast.keyword) and node.arg in ("device", "dtype"):
                count(node.value, placed)
            elif isinstance(node, ast.Call) and _called(node) in ("to", "cuda", "type"):
                for a in node.args:
                    count(a, placed)
    return {n for n, k in placed.items() if k == loads.get(n)}


def _calls_foreign(stmts: list, module: _ModuleNames) -> bool:
    return any(
        _root(c.func) in module.foreign
        for s in stmts
        for c in ast.walk(s)
        if isinstance(c, ast.Call)
    )


def _local_names(fn: ast.FunctionDef) -> tuple[dict, set[str]]:
    """(the trusted imports made inside the test, by the name they bind; the names its nested
    definitions and other imports bind)."""
    imports, other = {}, set()
    for node in ast.walk(fn):
        if node is fn:
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            root = (getattr(node, "module", None) or node.names[0].name).split(".")[0]
            trusted = root in TRUSTED_ROOTS and not getattr(node, "level", 0)
            for a in node.names:
                bound = a.asname or a.name.split(".")[0]
                if trusted:
                    imports[bound] = node
                else:
                    other.add(bound)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            other.add(node.name)
    return imports, other


def _lift(body: list, i: int, sides, module: _ModuleNames, fn: ast.FunctionDef, taken: set):
    """(the lifted function, the position to call it after) for one comparison, or None."""
    sliced = []
    if any(_not_data(side) for side in sides):
        return None
    for side in sides:
        picked, _ = _slice(body, i, _loaded(side))
        wrapper = ast.Expr(side)
        foreign = _calls_foreign([body[j] for j in picked] + [wrapper], module)
        sliced.append((side, picked, foreign))
    ops = [s for s in sliced if s[2]]
    refs = [s for s in sliced if not s[2]]
    if len(ops) != 1 or len(refs) != 1:
        return None
    side, picked, _ = refs[0]
    own = [j for j in picked if j not in set(ops[0][1])]
    stmts = [copy.deepcopy(body[j]) for j in own]
    ret = ast.Return(copy.deepcopy(side))
    imports, other = _local_names(fn)
    test = fn.name
    params: list[str] = []
    bound: set[str] = set()
    for stmt in [*stmts, ret]:
        for name in sorted(_loaded(stmt)):
            if name not in bound and name not in params and not module.is_global(name):
                params.append(name)
        bound |= _defined(stmt)[0]
    needed = [n for n in params if n in imports]  # `import numpy as np` inside the test
    params = [n for n in params if n not in imports]
    stmts = [copy.deepcopy(imports[n]) for n in dict.fromkeys(needed)] + stmts
    if {"self", "cls"} & set(params) or other & set(params):
        return None  # an object's state, or a function the test defines or imports itself
    if not set(params) - _placing(stmts, ret):
        return None  # no data from the op's side: a literal answer
    if not stmts and isinstance(side, ast.Name):
        return None  # the expected value is a name the op's side made too: nothing to lift
    base = side.id if isinstance(side, ast.Name) else "value"
    if not any(w in base.lower() for w in ("expect", "ref", "gt", "truth", "want")):
        base = f"expected_{base}"
    name, n = f"{base}_of_{test}", 2
    while name in taken:
        name, n = f"{base}_of_{test}_{n}", n + 1
    fn = ast.FunctionDef(
        name=name,
        args=ast.arguments(
            posonlyargs=[], args=[ast.arg(p) for p in params], kwonlyargs=[],
            kw_defaults=[], defaults=[],
        ),
        body=[*stmts, ret],
        decorator_list=[],
        returns=None,
    )  # fmt: skip
    if "type_params" in ast.FunctionDef._fields:  # Python 3.12
        fn.type_params = []
    fn.kminer_lifted = True  # (its source is unparsed, not read from the file)
    at = max(own) if own else i - 1
    op_side = [j for j in ops[0][1] if _calls_op(body[j], module)]
    op_side += [i] if _calls_op(ast.Expr(ops[0][0]), module) else []
    return ast.fix_missing_locations(fn), min(own) if own else i, at, op_side
