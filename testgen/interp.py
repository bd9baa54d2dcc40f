"""A small interpreter for the host C++ between a Python binding and a kernel launcher.

Op functions compute a launcher's arguments from their own: `int channels = input.size(1);`,
`columns = at::zeros({channels * kh * kw, hw}, input.options());`, `input[b]` inside a loop
over the batch. Reading those (over recorded CPU tensors) gives the launcher real arguments.
Repository text is never run: it is parsed as a Python expression tree (C++ operators and
brace lists translated first) and only these nodes are evaluated: literals, names, + - * /
(integer division truncating as in C++), comparisons, ! && ||, `t.size(k)`, `t.numel()`,
`t.dim()`/`ndimension()`, `t.view({..})`/`reshape`, `t[i]`, `t.contiguous()`, `t.zero_()`,
`t.unsqueeze(d)`, `t.options()`, `at::zeros/ones/empty({..}, options)` and `at::cat({..}, d)`.
Anything else is `Unmappable`.

A floating buffer the op allocates itself (at::zeros/empty) gets seeded random values: the
launcher treats it as any other argument, and a buffer the op would have filled by a GEMM we do
not follow (the columns a col2im launcher reads) then still carries data a wrong kernel shows.
"""

from __future__ import annotations

import ast
import re

from testgen.argmap import plain_name, split_top

_LITERAL = re.compile(r"^(?:-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?[fFlLuU]*|true|false)$")
_NUMBER_SUFFIX = re.compile(r"(?<=[\d.])[fFlLuU]+\b")
_FACTORY = re.compile(r"\b(?:at|torch)::(zeros|ones|empty|cat)\b")
_TENSOR_METHODS = ("size", "numel", "dim", "ndimension", "view", "reshape", "contiguous")
_TENSOR_METHODS += ("zero_", "options", "clone", "unsqueeze")
_STATEMENT = re.compile(
    r"(?<=[;{}])\s*(?:(?:const\s+)?(?:int|int64_t|int32_t|long|float|double|bool|auto|size_t"
    r"|Tensor|at::Tensor|torch::Tensor|(?:std|c10|at|torch)::optional\s*<[\w:\s]+>)\s+)?"
    r"([A-Za-z_]\w*)\s*=(?!=)\s*([^;]+);"
)
_GUARDED = re.compile(r"\s*([A-Za-z_]\w*)\s*=(?!=)\s*([^;]+);")  # if (c) x = e;
_LOOP = re.compile(r"\bfor\s*\(\s*(?:int|long|int64_t|auto|size_t)\s+([A-Za-z_]\w*)\s*=\s*([^;]+);")


_VECTOR = re.compile(  # std::vector<float> v(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
    r"\bstd::vector\s*<[\w:\s]+>\s+([A-Za-z_]\w*)\s*\(\s*([A-Za-z_]\w*)\s*\.\s*data_ptr\s*<[\w:\s]+>"
    r"\s*\(\s*\)\s*,\s*\2\s*\.\s*data_ptr\s*<[\w:\s]+>\s*\(\s*\)\s*\+\s*\2\s*\.\s*numel\s*\(\s*\)\s*\)\s*;"
)


class Unmappable(Exception):
    """A value the interpreter cannot compute from the recorded call."""


def _number(x) -> bool:
    return isinstance(x, int | float)


def _ints(node: ast.AST, env: dict) -> list[int]:
    if isinstance(node, ast.Set | ast.List | ast.Tuple):  # C++ `{a, b}` parses as a set
        return [int(_value(e, env)) for e in node.elts]
    raise Unmappable("a shape that is not a brace list")


def _factory(kind: str, node: ast.Call, env: dict):
    import torch

    shape = _ints(node.args[0], env) if node.args else _raise("no shape")
    dtype = torch.float32
    if len(node.args) > 1:
        opts = _value(node.args[1], env)
        dtype = opts.get("dtype", dtype) if isinstance(opts, dict) else _raise("options")
    if kind == "ones":
        return torch.ones(shape, dtype=dtype)
    if dtype.is_floating_point:
        gen = torch.Generator().manual_seed(sum(shape) + len(shape))
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.zeros(shape, dtype=dtype)


def _cat(node: ast.Call, env: dict):
    """`at::cat({a, b.unsqueeze(1)}, 1)`: the tensors of a brace list, joined along a dim."""
    import torch

    parts = node.args[0] if node.args else None
    if not isinstance(parts, ast.Set | ast.List | ast.Tuple) or len(node.args) > 2:
        raise Unmappable("cat of what is not a brace list")
    tensors = [_value(e, env) for e in parts.elts]
    dim = _value(node.args[1], env) if len(node.args) > 1 else 0
    if not all(hasattr(t, "shape") for t in tensors) or not isinstance(dim, int):
        raise Unmappable("cat")
    return torch.cat(tensors, dim)


def _method(node: ast.Call, env: dict):
    attr = node.func.attr
    target = _value(node.func.value, env)
    if not hasattr(target, "shape"):
        raise Unmappable(attr)
    if attr == "size" and len(node.args) == 1:
        return int(target.shape[_value(node.args[0], env)])
    if attr == "numel" and not node.args:
        return int(target.numel())
    if attr in ("dim", "ndimension") and not node.args:
        return int(target.dim())
    if attr in ("view", "reshape") and len(node.args) == 1:
        return target.reshape(_ints(node.args[0], env))
    if attr in ("contiguous", "clone") and not node.args:
        return target.contiguous()
    if attr == "zero_" and not node.args:
        return target.new_zeros(target.shape)
    if attr == "unsqueeze" and len(node.args) == 1:
        return target.unsqueeze(int(_value(node.args[0], env)))
    if attr == "options" and not node.args:
        return {"dtype": target.dtype}
    raise Unmappable(attr)


def _value(node: ast.AST, env: dict):
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float | str):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in ("true", "false"):
            return node.id == "true"
        if node.id not in env:
            raise Unmappable(node.id)
        return env[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand, env)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _value(node.operand, env)
    if isinstance(node, ast.BoolOp):  # both sides are evaluated: no short-circuit on unknowns
        values = [bool(_value(v, env)) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        a, b = _value(node.left, env), _value(node.comparators[0], env)
        if not (_number(a) and _number(b)):
            raise Unmappable(ast.dump(node)[:80])
        table = {ast.Eq: a == b, ast.NotEq: a != b, ast.Lt: a < b, ast.LtE: a <= b}
        table.update({ast.Gt: a > b, ast.GtE: a >= b})
        if type(node.ops[0]) in table:
            return table[type(node.ops[0])]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
        a, b = _value(node.left, env), _value(node.right, env)
        if not (_number(a) and _number(b)) or isinstance(a, bool) or isinstance(b, bool):
            raise Unmappable(ast.dump(node)[:80])
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(a, int) and isinstance(b, int):  # C++ integer division truncates
            return int(a / b) if b else _raise("division by zero")
        return a / b
    if isinstance(node, ast.Subscript):
        target, index = _value(node.value, env), _value(node.slice, env)
        if hasattr(target, "shape") and isinstance(index, int) and not isinstance(index, bool):
            return target[index]
        raise Unmappable("subscript")
    call = isinstance(node, ast.Call) and not node.keywords
    optional = call and isinstance(node.func, ast.Attribute) and not node.args
    if optional and node.func.attr in ("has_value", "value"):  # std::optional<Tensor>
        target = _value(node.func.value, env)
        if node.func.attr == "has_value":
            return target is not None
        return target if target is not None else _raise("the value of an empty optional")
    if call and isinstance(node.func, ast.Attribute) and node.func.attr in _TENSOR_METHODS:
        return _method(node, env)
    if call and isinstance(node.func, ast.Name) and node.func.id == "__kminer_cat":
        return _cat(node, env)
    if call and isinstance(node.func, ast.Name) and node.func.id.startswith("__kminer_"):
        return _factory(node.func.id.removeprefix("__kminer_"), node, env)
    raise Unmappable(ast.dump(node)[:80])


def _raise(what: str):
    raise Unmappable(what)


def _to_python(expr: str) -> str:
    py = _FACTORY.sub(lambda m: f"__kminer_{m.group(1)}", expr)
    py = _NUMBER_SUFFIX.sub("", py)
    py = py.replace("&&", " and ").replace("||", " or ")
    return re.sub(r"!(?!=)", " not ", py)


def _ternary(expr: str) -> tuple[str, str, str] | None:
    """`c ? a : b` split at its top level (`::` is not a colon), else None."""
    depth, q = 0, -1
    for i, ch in enumerate(expr):
        depth += (ch in "([{") - (ch in ")]}")
        if depth:
            continue
        if ch == "?" and q < 0:
            q = i
        elif ch == ":" and q >= 0 and expr[i - 1 : i + 1] != "::" and expr[i : i + 2] != "::":
            return expr[:q], expr[q + 1 : i], expr[i + 1 :]
    return None


def evaluate(expr: str, env: dict):
    """The value of a C++ expression over `env` (name → value)."""
    expr = " ".join(expr.split())
    parts = _ternary(expr)
    if parts is not None:
        return evaluate(parts[1] if evaluate(parts[0], env) else parts[2], env)
    if expr in ("std::nullopt", "c10::nullopt", "at::nullopt", "nullptr", "{}"):
        return None
    name = plain_name(expr)
    if name is not None:
        if name in ("true", "false"):
            return name == "true"
        if name not in env:
            raise Unmappable(name)
        return env[name]
    if _LITERAL.match(expr):
        text = expr.rstrip("fFlLuU")
        if text in ("true", "false"):
            return text == "true"
        return float(text) if any(ch in text for ch in ".eE") else int(text)
    try:
        tree = ast.parse(_to_python(expr), mode="eval")
    except SyntaxError:
        raise Unmappable(expr) from None
    try:
        return _value(tree.body, env)
    except (IndexError, RuntimeError, TypeError, ValueError, OverflowError) as e:
        raise Unmappable(f"{expr}: {type(e).__name__}") from None


def _match(text: str, at: int, open_: str, close: str) -> int:
    """The offset after the bracket closing the one at `at` (len(text) when unclosed)."""
    depth = 0
    for j in range(at, len(text)):
        depth += (text[j] == open_) - (text[j] == close)
        if depth == 0:
            return j + 1
    return len(text)


def _branches(text: str) -> tuple[list[tuple[int, int, int, str, bool]], list[tuple]]:
    """(start, end, cond_at, condition, is_else) of every braced if / else block and of every
    unbraced `if (c) x = e;`, and the (offset, match) of each such unbraced assignment."""
    out, guarded = [], []
    for m in re.finditer(r"\bif\s*\(", text):
        close = _match(text, m.end() - 1, "(", ")")
        brace = re.match(r"\s*\{", text[close:])
        if brace is None:
            one = _GUARDED.match(text, close)
            if one is not None:
                out.append((close - 1, one.end(), m.start(), text[m.end() : close - 1], False))
                guarded.append((close, one))
            continue
        start = close + brace.end() - 1
        end = _match(text, start, "{", "}")
        cond = text[m.end() : close - 1]
        out.append((start, end, m.start(), cond, False))
        other = re.match(r"\s*else\s*\{", text[end:])
        if other is not None:
            e_start = end + other.end() - 1
            out.append((e_start, _match(text, e_start, "{", "}"), m.start(), cond, True))
    return out, guarded


def run_statements(body: str, env: dict, until: int | None = None) -> dict:
    """`env` after the function's assignments before offset `until`, in order: declarations,
    reassignments of known names, loop variables at their first value. Inside `if`/`else`
    blocks only the branch the condition takes (evaluated when reached) runs; in a branch that
    cannot be decided, a statement that fails keeps the old value. Elsewhere a statement the
    interpreter cannot compute makes its name unknown (no stale value survives it)."""
    brace = body.find("{")
    text = body[: until if until is not None else len(body)]
    out = dict(env)
    events = [(m.start(), m) for m in _STATEMENT.finditer(text, max(brace, 0))]
    events += [(m.start(), m) for m in _LOOP.finditer(text, max(brace, 0))]
    events += [(m.start(), m) for m in _VECTOR.finditer(text, max(brace, 0))]
    branches, guarded = _branches(text)
    events += guarded
    decided: dict[int, bool | None] = {}
    for at, m in sorted(events, key=lambda e: e[0]):
        taken, unsure = True, False
        for start, end, cond_at, cond, is_else in branches:
            if not start < at < end:
                continue
            if cond_at not in decided:
                try:
                    decided[cond_at] = bool(evaluate(cond, out))
                except Unmappable:
                    decided[cond_at] = None
            value = decided[cond_at]
            if value is None:
                unsure = True
            elif value == is_else:
                taken = False
        if not taken:
            continue
        name, expr = m.group(1), m.group(2)
        try:
            if m.re is _VECTOR:  # a vector copied out of a tensor: its values, as a list
                out[name] = out[expr].reshape(-1).tolist() if expr in out else _raise(expr)
                continue
            out[name] = evaluate(expr, out)
        except Unmappable:
            if not unsure and not _normalizes(name, expr, out):
                out.pop(name, None)
    return out


def _normalizes(name: str, expr: str, env: dict) -> bool:
    """`x = f(x, ...)` through a function we cannot read (pytorch_scatter's
    `index = broadcast(index, src, dim)`): x keeps its value where f can only have left it as
    it is, that is when every other tensor f is given has x's shape. An `index` of [4, 1, 8, 8]
    beside a `src` of [4, 3, 8, 8] is expanded by f: kept as it was, it made a case that read
    past the index on the GPU (a correct kernel blamed), so x becomes unknown instead."""
    m = re.fullmatch(r"\s*([A-Za-z_][\w:]*)\s*\((.*)\)\s*", expr, re.DOTALL)
    if not m or name not in env:
        return False
    args = [a.strip() for a in split_top(m.group(2))]
    if not args or args[0] != name:
        return False
    shape = getattr(env[name], "shape", None)
    for other in args[1:]:
        other_shape = getattr(env.get(other), "shape", None)
        if other_shape is not None and (shape is None or tuple(other_shape) != tuple(shape)):
            return False
    return True
