"""The CPU binding a repository's Python code calls where it calls the CUDA one, per device.

Some repositories build two extensions and choose one per call in Python: torch-points-kernels'
`if features.is_cuda: return tpcuda.three_interpolate(features, idx, weight)` / `else: return
tpcpu.knn_interpolate(features, idx, weight)`. No C++ code links the two (no registry, no
`_cuda`/`_cpu` names, no op function calling both), yet the two branches hand the same values
to two bindings: the CPU one is the op's CPU implementation, whatever its name says. Each of its
arguments must be known in terms of the CUDA call: the same expression as one of that call's
arguments, a literal, or a parameter of the enclosing function that the CUDA branch cannot
have changed, at its default (`sorted=sort`, where `def ball_query_dense(..., sort=False)` and
the CUDA branch raises on `sort`). Keyword arguments land where the CPU binding's own names
(`"sorted"_a`, `py::arg("sorted")`) put them. A branch whose CPU call reads anything else
(`tpcpu.fps(xyz, npoint, True)` is fine; `knn(known, unknown, 3)` is a Python function, not a
binding) gives no twin.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from testgen import pysources
from testgen.carry import pybind_arg_names
from testgen.inputs import RecordedCall
from testgen.vendor import ALLOWED_ROOTS

_SKIP_DIRS = {".git", "build", "dist", "node_modules", "__pycache__"}
_CUDA_WORDS = ("cuda", "gpu")
_RANDOM = re.compile(r"random|shuffle|^rand|stochastic", re.IGNORECASE)  # flags for randomness


@dataclass(frozen=True)
class BranchTwin:
    """A CPU binding called in the other branch of a device test, and its arguments: per
    position, ("arg", k) the CUDA call's k-th argument, or ("const", value)."""

    cpu_binding: str
    args: tuple  # the positional ones' sources
    keywords: tuple  # ((name, source), ...)
    where: str  # file:line of the branch
    cuda_arity: int = 0  # how many arguments the CUDA call passes


def _device_test(test: ast.expr) -> bool | None:
    """True when the test is true on the GPU (`x.is_cuda`, `x.device.type == "cuda"`), False
    when it is true on the CPU (`not x.is_cuda`, `... == "cpu"`), None for any other test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _device_test(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.Attribute) and test.attr == "is_cuda":
        return True
    called = isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute)
    if called and test.func.attr == "is_cuda" and not test.args:
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and len(test.comparators) == 1:
        left, right = test.left, test.comparators[0]
        if isinstance(right, ast.Attribute) and isinstance(left, ast.Constant):
            left, right = right, left
        reads_device = isinstance(left, ast.Attribute) and left.attr in ("type", "device")
        if reads_device and isinstance(right, ast.Constant) and isinstance(right.value, str):
            equal = isinstance(test.ops[0], (ast.Eq, ast.Is))
            if right.value in _CUDA_WORDS:
                return equal
            if right.value == "cpu":
                return not equal
    return None


def _extension_modules(tree: ast.Module) -> set[str]:
    """Names the file imports modules under, but torch's, numpy's and the standard library's:
    where a compiled extension is reached from (`import pkg.points_cuda as tpcuda`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            pairs = [(a.asname or a.name.split(".")[0], a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            pairs = [(a.asname or a.name, f"{base}.{a.name}") for a in node.names]
        else:
            continue
        names |= {n for n, full in pairs if full.lstrip(".").split(".")[0] not in ALLOWED_ROOTS}
    return names


def _binding_calls(body: list[ast.stmt], modules: set[str]) -> list[ast.Call]:
    """Calls `module.name(...)` in a branch, `module` an extension's (a binding)."""
    return [
        node
        for stmt in body
        for node in ast.walk(stmt)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in modules
    ]


def _defaults(func: ast.FunctionDef | ast.AsyncFunctionDef | None) -> dict:
    """The enclosing function's parameters that have a literal default."""
    if func is None:
        return {}
    args = func.args
    positional = [*args.posonlyargs, *args.args]
    found = {}
    for a, d in zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True):
        if isinstance(d, ast.Constant):
            found[a.arg] = d.value
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        if isinstance(d, ast.Constant):
            found[a.arg] = d.value
    return found


def _assigned(body: list[ast.stmt]) -> set[str]:
    return {
        t.id
        for stmt in body
        for node in ast.walk(stmt)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr))
        for t in ([node.target] if not isinstance(node, ast.Assign) else node.targets)
        if isinstance(t, ast.Name)
    }


def _source(value: ast.expr, cuda_args: list[str], defaults: dict, changed: set[str]):
    """Where one argument of the CPU call comes from, or None."""
    text = ast.dump(value)
    if text in cuda_args:
        return ("arg", cuda_args.index(text))
    if isinstance(value, ast.Constant) and isinstance(value.value, (bool, int, float)):
        return ("const", value.value)
    if isinstance(value, ast.Name) and value.id in defaults and value.id not in changed:
        default = defaults[value.id]
        if isinstance(default, (bool, int, float)):
            return ("const", default)
    return None


def _twins_in(tree: ast.Module, rel: str) -> list[tuple[str, BranchTwin]]:
    found = []
    modules = _extension_modules(tree)
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        on_gpu = _device_test(node.test)
        if on_gpu is None or not node.orelse:
            continue
        gpu, cpu = (node.body, node.orelse) if on_gpu else (node.orelse, node.body)
        gpu_calls, cpu_calls = _binding_calls(gpu, modules), _binding_calls(cpu, modules)
        if len(gpu_calls) != 1 or len(cpu_calls) != 1:
            continue  # one binding each side: which CPU call mirrors which is plain
        g, c = gpu_calls[0], cpu_calls[0]
        if g.func.value.id == c.func.value.id and g.func.attr == c.func.attr:
            continue
        if any(isinstance(a, ast.Starred) for a in [*g.args, *c.args]) or g.keywords:
            continue
        func = node
        while func is not None and not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = parents.get(func)
        defaults = _defaults(func)
        changed = _assigned(gpu) | _assigned(cpu)
        cuda_args = [ast.dump(a) for a in g.args]
        positional = [_source(a, cuda_args, defaults, changed) for a in c.args]
        keywords = [(k.arg, _source(k.value, cuda_args, defaults, changed)) for k in c.keywords]
        if None in positional or any(s is None or k is None for k, s in keywords):
            continue
        where = f"{rel}:{node.lineno}"
        twin = BranchTwin(c.func.attr, tuple(positional), tuple(keywords), where, len(g.args))
        found.append((g.func.attr, twin))
    return found


@functools.lru_cache(maxsize=8)
def _all_twins(root: str) -> dict[str, list[BranchTwin]]:
    base = Path(root)
    twins: dict[str, list[BranchTwin]] = {}
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base)
        if _SKIP_DIRS & set(rel.parts) or not path.is_file():
            continue
        text = pysources.text(path)
        if not text or "cuda" not in text:
            continue
        tree = pysources.tree(path)
        for cuda_binding, twin in _twins_in(tree, str(rel)) if tree else []:
            twins.setdefault(cuda_binding, []).append(twin)
    return twins


def branch_twins(root: Path, cuda_binding: str) -> list[BranchTwin]:
    """The CPU bindings the repository's Python calls instead of `cuda_binding` on CPU
    tensors, each with where its arguments come from."""
    return _all_twins(str(root.resolve())).get(cuda_binding, [])


def cpp_literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def cpu_call_args(
    twin: BranchTwin, cuda_params: list[str], cpu_params: list[str], cpu_names: list[str] | None
) -> list[str] | str:
    """The CPU function's arguments as C++ expressions of the CUDA function's parameters (the
    CUDA call passes the bound C++ function's parameters in order), or why they cannot be. A
    flag the branch sets to switch randomness on (`tpcpu.fps(xyz, npoint, True)`, the CPU
    side's `bool random`: a random first point) is passed false: the CUDA call takes no such
    flag and runs the deterministic way, and a reference that draws its own random numbers
    can agree with no kernel."""
    exprs: list[str | None] = [None] * len(cpu_params)
    names = cpu_names or cpu_params

    def expr(source, at: int) -> str | None:
        if source[0] == "const":
            randomizes = source[1] is True and _RANDOM.search(names[at] if at < len(names) else "")
            return cpp_literal(False if randomizes else source[1])
        k = source[1]
        return cuda_params[k] if k < len(cuda_params) else None

    if len(twin.args) > len(cpu_params):
        return f"{twin.cpu_binding} is called with more arguments than it takes"
    for k, source in enumerate(twin.args):
        exprs[k] = expr(source, k)
    for name, source in twin.keywords:
        if name not in names:
            return f"{twin.cpu_binding} takes no argument named {name}"
        exprs[names.index(name)] = expr(source, names.index(name))
    if None in exprs:
        missing = [p for p, e in zip(cpu_params, exprs, strict=True) if e is None]
        return f"{twin.cpu_binding}'s {', '.join(missing)} is not given by its call ({twin.where})"
    return exprs


def cuda_calls(refs, cuda_binding: str, recorded: dict) -> list[RecordedCall]:
    """The recorded calls of each CPU twin of `cuda_binding`, as calls of `cuda_binding`: the
    repository's tests run on the CPU, so its Python takes the CPU branch and the recorder sees
    only the CPU binding (`batch_ball_query`), never the CUDA one. Each argument of the CUDA call
    is the CPU call's argument at the position the branch passes it to; a call whose constant
    arguments differ from the branch's (`sorted=True`: a mode the CUDA branch never takes) is
    no call of the CUDA binding."""
    made = []
    for twin in branch_twins(refs.disc.root, cuda_binding):
        names = pybind_arg_names(refs, twin.cpu_binding) or []
        positional = list(enumerate(twin.args))
        keyed = [(names.index(k), s) for k, s in twin.keywords if k in names]
        if len(keyed) < len(twin.keywords):
            continue
        wanted = [k for _, (kind, k) in positional + keyed if kind == "arg"]
        if sorted(wanted) != list(range(twin.cuda_arity)):
            continue  # an argument of the CUDA call the CPU call never receives
        for call in recorded.get(twin.cpu_binding, []):
            bound = dict(enumerate(call.args))
            bound.update({names.index(k): v for k, v in call.kwargs.items() if k in names})
            args: dict[int, object] = {}
            for at, (kind, value) in positional + keyed:
                if kind == "arg" and at in bound:
                    args[value] = bound[at]
                elif kind == "const" and at in bound and not _same(bound[at], value):
                    break  # the recorded call took a mode the CUDA branch never takes
            else:
                if len(args) == len(wanted):
                    ordered = [args[k] for k in range(len(wanted))]
                    made.append(RecordedCall(cuda_binding, ordered, {}, call.test_file))
    return made


def _same(recorded, constant) -> bool:
    return type(recorded) in (bool, int, float) and recorded == constant
