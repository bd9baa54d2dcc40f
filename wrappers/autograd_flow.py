"""How a repository's autograd Function hands its forward binding's results to its backward one.

A backward binding often takes what only the forward computed: mmcv's dynamic scatter saves
`point2voxel_map` and `voxel_points_count`, two of the four tensors
`dynamic_point_to_voxel_forward` returns, and passes them to `dynamic_point_to_voxel_backward`.
Nothing in C++ says which result is which (the forward returns `coors_map`, the backward takes
`coors_idx`); the Python Function that joins them does:

    results = ext_module.dynamic_point_to_voxel_forward(feats, coors, reduce_type)
    (voxel_feats, voxel_coors, point2voxel_map, voxel_points_count) = results
    ctx.save_for_backward(feats, voxel_feats, point2voxel_map, voxel_points_count)
    ...
    grad_feats = torch.zeros_like(feats)
    ext_module.dynamic_point_to_voxel_backward(grad_feats, grad_voxel_feats.contiguous(),
        feats, voxel_feats, point2voxel_map, voxel_points_count, ctx.reduce_type)
    return grad_feats, None, None

Read statically (never run): each argument of the backward call is traced to a forward
argument, a forward result, the gradient of a returned output, a zero buffer shaped like one of
those, or a literal; and each gradient the Function returns to the buffer or result holding it.

What a Function does around the two calls follows the same few patterns everywhere (mamba's
selective scan has them all): a view that only reshapes a tensor for the binding
(`B = rearrange(B, "b n l -> b 1 n l")` before the forward, `dB = dB.squeeze(1) if
ctx.squeeze_B else dB` after the backward: the binding's own arguments and results are what the
glue passes, so the view on either side is no change there), a result picked from the rest of
an unpacking (`out, x, *rest = fwd(...)`; `out_z = rest[0]`), and an expression that is the
value or None by a mode (`dD if D is not None else None`). Each is followed as that value.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

MAX_FILE_BYTES = 1_000_000
_KEEPS_VALUE = {"contiguous", "detach", "clone"}  # method calls that pass a tensor's values on
# calls that change only a tensor's shape: the binding on the other side takes the same values
_RESHAPES = {"squeeze", "unsqueeze", "view", "reshape", "flatten", "rearrange", "view_as",
             "reshape_as"}  # fmt: skip
_ZEROS = {"zeros_like", "new_zeros", "zeros"}
_SAVED = {"saved_tensors", "saved_variables"}

# a source: ("arg", k) the forward's k-th argument; ("result", j) the forward binding's j-th
# result (-1: the whole of what it returns); ("out_grad", j) the gradient of result j;
# ("zeros", source) a zero buffer like it; ("const", value) a literal
Source = tuple


@dataclass
class Flow:
    forward: str  # the forward binding's name
    backward: str
    file: str  # the Function's file, relative to the repository root
    forward_call: list[Source]  # the forward binding's arguments, as sources
    backward_call: list[Source]  # the backward binding's arguments
    gradients: list[tuple[int, Source]] = field(default_factory=list)
    outputs: list[Source | None] = field(default_factory=list)  # what the Function returns:
    # what its caller (and the PyTorch function the tests compare with) gets, in that order
    # (forward argument k, where its gradient is: ("buffer", i) the backward call's i-th
    # argument after the call, or ("returned", i) the i-th value the backward call returns)

    def needs_results(self) -> list[int]:
        """The backward call's positions fed from the forward's results."""
        return [i for i, s in enumerate(self.backward_call) if s[0] == "result"]


def _callee(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return ""


def _targets(target: ast.AST) -> list[tuple[str, int | tuple | None]]:
    """Names a tuple target binds and their positions (None past a starred one; ("rest", k)
    for the starred one itself, from position k on)."""
    if isinstance(target, ast.Name):
        return [(target.id, -1)]
    out, starred = [], False
    if isinstance(target, (ast.Tuple, ast.List)):
        for k, elt in enumerate(target.elts):
            if isinstance(elt, ast.Starred):
                if not starred and isinstance(elt.value, ast.Name):
                    out.append((elt.value.id, ("rest", k)))
                starred = True
            elif isinstance(elt, ast.Name):
                out.append((elt.id, None if starred else k))
    return out


class _Scope:
    """Names of one method of the Function, by the source of their values."""

    def __init__(self, names: dict, ctx: dict) -> None:
        self.names, self.ctx = names, ctx  # name -> source; ctx attribute -> source

    def source(self, node: ast.AST) -> Source | None:
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Constant):
            return ("const", node.value)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "ctx":
                return self.ctx.get(node.attr)
            return None
        if isinstance(node, ast.IfExp):  # the value or None, by a mode: the value
            body, orelse = self.source(node.body), self.source(node.orelse)
            if body == orelse or orelse == ("const", None):
                return body
            return orelse if body == ("const", None) else None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            whole, at = self.source(node.value), node.slice.value  # `rest[0]`, `results[1]`
            if whole is None or not isinstance(at, int) or isinstance(at, bool) or at < 0:
                return None
            if whole[0] == "rest":
                return (whole[1], whole[2] + at)
            return (whole[0], at) if whole[0] in ("result", "returned") and whole[1] == -1 else None
        if isinstance(node, ast.Call):
            f = node.func
            name = _callee(node)
            if isinstance(f, ast.Attribute) and name in _KEEPS_VALUE and not node.args:
                return self.source(f.value)
            if name in _RESHAPES:  # `x.squeeze(1)`, `rearrange(x, "...")`, `torch.reshape(x, s)`
                method = isinstance(f, ast.Attribute) and not (
                    isinstance(f.value, ast.Name) and f.value.id in ("torch", "einops")
                )
                inner = f.value if method else (node.args[0] if node.args else None)
                return self.source(inner) if inner is not None else None
            if name in _ZEROS:
                like = node.args[0] if name == "zeros_like" and node.args else None
                if name == "new_zeros" and isinstance(f, ast.Attribute):
                    like = f.value
                if name == "zeros" and node.args and isinstance(node.args[0], ast.Call):
                    inner = node.args[0].func  # torch.zeros(x.size(), ...)
                    like = inner.value if isinstance(inner, ast.Attribute) else None
                src = self.source(like) if like is not None else None
                return ("zeros", src) if src is not None else None
        return None

    def assign(self, target: ast.AST, value: ast.AST, call_kind: str | None) -> None:
        """`target = value`; `call_kind`: what the binding's values are ('result', 'returned')
        when `value` is the binding's call."""
        whole = (call_kind, -1) if call_kind else self.source(value)
        if whole is None:
            for name, _ in _targets(target):
                self.names.pop(name, None)
            return
        for name, k in _targets(target):
            if k == -1:
                self.names[name] = whole
            elif whole[0] in ("result", "returned") and whole[1] == -1 and isinstance(k, tuple):
                self.names[name] = ("rest", whole[0], k[1])  # `*rest`: results k[1] on
            elif whole[0] in ("result", "returned") and whole[1] == -1 and k is not None:
                self.names[name] = (whole[0], k)  # unpacking the binding's results
            else:
                self.names.pop(name, None)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.args][1:]  # after ctx


def _in_order(fn: ast.FunctionDef) -> list[ast.AST]:
    """The method's nodes in source order (ast.walk goes breadth first)."""
    nodes = [n for n in ast.walk(fn) if hasattr(n, "lineno") and n is not fn]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def _calls_to(fn: ast.FunctionDef, binding: str) -> list[ast.Call]:
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call) and _callee(n) == binding]


def _walk_forward(fn: ast.FunctionDef, forward: str):
    """(forward call's argument sources, ctx attributes, saved sources, returned sources)."""
    scope = _Scope({p: ("arg", k) for k, p in enumerate(_params(fn))}, {})
    call_args: list | None = None
    saved: list = []
    returned: list = []
    for stmt in _in_order(fn):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            t, v = stmt.targets[0], stmt.value
            is_call = _callee(v) == forward
            if is_call and call_args is None:
                call_args = [scope.source(a) for a in v.args]
            if isinstance(t, ast.Attribute) and getattr(t.value, "id", "") == "ctx":
                scope.ctx[t.attr] = scope.source(v)
            else:
                scope.assign(t, v, "result" if is_call else None)
        elif isinstance(stmt, ast.Call) and _callee(stmt) == "save_for_backward":
            saved = [scope.source(a) for a in stmt.args]
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            value = stmt.value
            if isinstance(value, ast.IfExp):  # `out if not return_last_state else (out, s)`
                value = value.body  # the mode the Function's defaults take
            vals = value.elts if isinstance(value, ast.Tuple) else [value]
            returned = [scope.source(v) for v in vals]
    return call_args, scope.ctx, saved, returned


def _flow(cls: ast.ClassDef, forward: str, backward: str, rel: str) -> Flow | None:
    fwd, bwd = _method(cls, "forward"), _method(cls, "backward")
    if fwd is None or bwd is None or not _calls_to(fwd, forward) or not _calls_to(bwd, backward):
        return None
    call_args, ctx, saved, returned = _walk_forward(fwd, forward)
    if call_args is None:
        return None
    grads = {p: ("out_grad", r[1]) for p, r in zip(_params(bwd), returned, strict=False)
             if r is not None and r[0] == "result"}  # fmt: skip
    scope = _Scope(dict(grads), ctx)
    back_args: list | None = None
    for node in _in_order(bwd):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            t, v = node.targets[0], node.value
            if isinstance(v, ast.Attribute) and v.attr in _SAVED:
                for name, k in _targets(t):
                    if k is not None and 0 <= k < len(saved) and saved[k] is not None:
                        scope.names[name] = saved[k]
                continue
            is_call = _callee(v) == backward
            if is_call and back_args is None:
                back_args = [scope.source(a) for a in v.args]
            scope.assign(t, v, "returned" if is_call else None)
        elif isinstance(node, ast.Expr) and _callee(node.value) == backward and back_args is None:
            back_args = [scope.source(a) for a in node.value.args]
        elif isinstance(node, ast.Return) and back_args is not None and node.value is not None:
            if None in back_args:  # an argument computed in a way not followed: no flow
                return None
            vals = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            flow = Flow(forward, backward, rel, call_args, back_args, outputs=returned)
            for k, v in enumerate(vals):
                where = _gradient_place(v, scope, bwd, backward, back_args)
                if where is not None:
                    flow.gradients.append((k, where))
            return flow if flow.gradients else None
    return None


def _gradient_place(node: ast.AST, scope: _Scope, bwd, backward: str, back_args) -> Source | None:
    """Where a returned gradient is after the backward call: a buffer passed to it (by its name
    at the call), or a value it returned."""
    none = isinstance(node, ast.IfExp) and isinstance(node.orelse, ast.Constant)
    if none and node.orelse.value is None:  # `dD if D is not None else None`
        node = node.body
    if not isinstance(node, ast.Name):
        return None
    src = scope.names.get(node.id)
    if src is not None and src[0] == "returned":
        return src
    call = _calls_to(bwd, backward)[0]
    for i, a in enumerate(call.args):
        if isinstance(a, ast.Name) and a.id == node.id and back_args[i][0] == "zeros":
            return ("buffer", i)
    return None


def find_flow(repo: Path, forward: str, backward: str) -> Flow | None:
    """The first Function of the repository's Python calling `forward` in its forward and
    `backward` in its backward whose flow reads whole."""
    for path in sorted(repo.rglob("*.py")):
        if ".git" in path.parts or not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            continue
        text = path.read_text("utf-8", errors="replace")
        if backward not in text or forward not in text or "backward" not in text:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                flow = _flow(node, forward, backward, str(path.relative_to(repo)))
                if flow is not None:
                    return flow
    return None
