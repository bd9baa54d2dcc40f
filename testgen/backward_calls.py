"""Calls of a backward binding that the repository's tests never make, from its forward's calls.

A test checks gradients through the op's autograd Function, and the recorder cannot run that:
the extension is absent, so the forward returns nothing and backward is never called. Yet the
tests do call the forward, and a backward binding takes the forward's arguments by name
(`input`, `weight`, `kernel_h`), the gradient of its output (`grad_output`, `out_grad`), the
forward's saved outputs by the name the forward returns them under (`top_count`), and buffers
for the gradients it writes (`grad_input`). The forward's output shape comes from its C++ host
function, read by the interpreter the cases already use (`auto output = at::empty({batch,
channels_out, height_out, width_out}, input.options()); ... return output;`), following
`return dcn_v2_cuda_forward(...)` into the function it calls. The gradient of the output is
seeded random; the backward's reference (its CPU twin) gets the same arguments as the label, so
the case checks the kernel whatever the forward would have computed. A forward that returns
nothing and writes into tensors it is passed (SparseConvNet's batch norm: `output_features`,
`saveMean`, `saveInvStd`) hands the backward those tensors as the CPU build left them when the
recorder ran it (`RecordedCall.after`), else of the shape its host code gives them
(`output_features.resize_as_(input_features)`), with seeded values.
"""

from __future__ import annotations

import re

from testgen.argmap import call_args
from testgen.carry import Unmappable, bind_call
from testgen.grad_reference import _role
from testgen.inputs import RecordedCall
from testgen.interp import evaluate, run_statements
from wrappers.through_forward import forward_of

MAX_CALLS = 16
DEPTH = 3  # `return f(...)` followed this many functions down
_RETURN = re.compile(r"\breturn\b([^;]*);")
_CPU = re.compile(r"cpu", re.IGNORECASE)
_TUPLE = re.compile(r"^(?:std::(?:make_tuple|tie|vector<[^>]*>)\s*)?[({]\s*(.*?)\s*[)}]$", re.S)


def _returned(body: str, env: dict, refs, depth: int) -> list | None:
    """The tensors a host function returns for the arguments in `env`, by returned name (the
    last part of `name`: `output`), or None when no `return` can be read."""
    for m in _RETURN.finditer(body, max(body.find("{"), 0)):
        expr = " ".join(m.group(1).split())
        call = re.match(r"^(?:[\w]+::)*(\w+)\s*\(", expr)
        if call and not _TUPLE.match(expr) and depth > 0:
            callee = call.group(1)
            item = refs.definition(callee, host_side=True)
            params = refs.params_of(callee) if item is not None else None
            args = call_args(body, callee) if params else None
            if _CPU.search(callee) or not args or len(args) != len(params):
                continue
            here = run_statements(body, env, m.start())
            try:
                inner = {p: evaluate(a, here) for p, a in zip(params, args, strict=True)}
            except Unmappable:
                continue
            found = _returned(refs.body(item), inner, refs, depth - 1)
            if found:
                return found
            continue
        tup = _TUPLE.match(expr)
        names = [n.strip() for n in (tup.group(1) if tup else expr).split(",")]
        if not all(re.fullmatch(r"[A-Za-z_]\w*", n) for n in names):
            continue
        if any(n in env for n in names):  # `return a;` after the device branches: a fallback
            continue  # that hands back an argument, not what the op computes
        here = run_statements(body, env, m.start())
        found = [(n, here.get(n)) for n in names]
        if all(hasattr(v, "shape") for _, v in found):
            return found
    return None


def _forward_host(fwd: str, refs):
    item = refs.definition(fwd, host_side=True)
    return refs.body(item) if item is not None else None


def backward_calls(binding: str, recorded: dict, refs) -> list[RecordedCall] | str:
    """Calls of `binding` (a backward) made from the recorded calls of its forward, or why
    there are none."""
    fwd = forward_of(binding, [n for n, calls in recorded.items() if calls])
    if fwd is None:
        return f"no forward of {binding} is called by the tests"
    bwd_params, fwd_params = refs.params_of(binding), refs.params_of(fwd)
    body = _forward_host(fwd, refs)
    if not bwd_params or not fwd_params or body is None:
        return f"{fwd} or {binding} has no definition to read"
    made, why = [], f"{fwd}'s output cannot be read from its host code"
    for n, call in enumerate(recorded[fwd]):
        if len(made) >= MAX_CALLS:
            break
        try:
            params, bound = bind_call(call, refs)
        except Unmappable as e:
            why = str(e)
            continue
        outs = _returned(body, bound, refs, DEPTH) or _as_recorded(call.returned)
        # what the forward wrote into the tensors it was passed: as the CPU build left them
        # when the recorder ran it, else shaped by its host code's `resize_as_`
        written = [(params[k], v) for k, v in sorted(call.after.items()) if k < len(params)]
        written = written or ([] if outs else _resized(body, bound, refs, seed=n))
        args = _backward_args(bwd_params, fwd_params, bound, outs + written, n, written)
        if isinstance(args, str):
            why = args
            continue
        made.append(RecordedCall(binding, args, {}, call.test_file))
    return made or f"{binding} from {fwd}'s calls: {why}"


def _as_recorded(returned: list) -> list:
    """(name, tensor) for what the forward returned when the recorder ran it on the CPU build,
    zeros of its shapes (a C++ autograd Function's `apply` hides them from the host code)."""
    import torch

    out = []
    for k, (shape, dtype) in enumerate(returned):
        kind = getattr(torch, dtype, None)
        if isinstance(kind, torch.dtype):
            out.append((f"returned{k}", torch.zeros(shape, dtype=kind)))
    return out


_RESIZE_AS = re.compile(r"\b(\w+)\s*\.\s*resize_as_\s*\(\s*(\w+)\s*\)")


_CALLED = re.compile(r"(?<![\w.>])(\w+)\s*(?:<[^<>;{}]*>)?\s*\(")


def _resize_targets(body: str, refs, depth: int) -> dict[str, str]:
    """{tensor parameter: parameter whose shape it takes} for each `out.resize_as_(input)` in
    a host function or, passed on by name, in the functions it calls (SparseConvNet's binding
    calls `cpu_BatchNormalization_updateOutput<float>(...)`, which resizes)."""
    found = {m.group(1): m.group(2) for m in _RESIZE_AS.finditer(body, max(body.find("{"), 0))}
    if found or depth <= 0:
        return found
    for callee in dict.fromkeys(_CALLED.findall(body[max(body.find("{"), 0) :])):
        item = refs.definition(callee, host_side=True)
        params = refs.params_of(callee) if item is not None else None
        args = call_args(body, callee) if params else None
        if not args or len(args) != len(params):
            continue
        rename = {p: a for p, a in zip(params, args, strict=True) if re.fullmatch(r"\w+", a)}
        inner = _resize_targets(refs.body(item), refs, depth - 1)
        found.update({rename[t]: rename[w] for t, w in inner.items() if {t, w} <= set(rename)})
        if found:
            return found
    return found


def _resized(body: str, bound: dict, refs, seed: int) -> list:
    """(name, tensor) for each tensor argument a forward that returns nothing writes as its
    output, sized by `out.resize_as_(input)` (SparseConvNet's `output_features`): seeded values
    of the shape it has after the call."""
    import torch

    gen = torch.Generator().manual_seed(seed + 7919)
    out = []
    for name, like_name in _resize_targets(body, refs, DEPTH).items():
        target, like = bound.get(name), bound.get(like_name)
        if hasattr(target, "shape") and hasattr(like, "shape") and target.is_floating_point():
            made = torch.randn(like.shape, generator=gen, dtype=torch.float64).to(target.dtype)
            out.append((name, made))
    return out


def _backward_args(bwd: list[str], fwd: list[str], bound: dict, outs: list, seed: int, written=()):
    """The backward's arguments for one forward call whose outputs are `outs` (returned, or
    `written` into the tensors of those names)."""
    import torch

    if not outs:
        return "the forward's output cannot be read from its host code"
    by_name = {name.split(".")[-1]: t for name, t in outs}
    written = {name for name, _ in written}
    floating = [t for _, t in outs if t.is_floating_point()]
    gen = torch.Generator().manual_seed(seed)
    args, used = [], 0
    for name in bwd:
        role = _role(name, fwd, set())
        if name in by_name and (role is None or role[0] != "input" or name in written):
            args.append(by_name[name])  # an output the forward saved for the backward
        elif role is None:
            return f"the backward's `{name}` is none of the forward's arguments or outputs"
        elif role[0] == "input":
            args.append(bound[role[1]])
        elif role[0] == "grad" and role[1] in written:  # the gradient of a written output
            o = by_name[role[1]]
            args.append(torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype))
        elif role[0] == "grad":
            if not hasattr(bound[role[1]], "shape"):
                return f"`{name}` is the gradient of a number"
            args.append(torch.zeros_like(bound[role[1]]))
        else:
            if used >= len(floating):
                return "more output gradients than the forward has floating outputs"
            o = floating[used]
            used += 1
            args.append(torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype))
    return args
