"""A backward host function that takes what only its forward computes, run behind its forward.

mmcv's `DynamicPointToVoxelBackwardCUDAKernelLauncher` takes the voxel map and counts that
`DynamicPointToVoxelForwardCUDAKernelLauncher` returns, and the repository has no CPU function
for either: the only reference is autograd through the PyTorch forward its tests check against,
which knows nothing of the map. No case can be drafted for the backward alone (a map that
does not match the features is not an input the op ever sees), so its label also exposes a
function kminer writes from the repository's own autograd Function (wrappers.autograd_flow):
it runs the forward host function, then the backward one on the forward's results, and returns
the gradients, exactly as the Function does. Its arguments are the forward's and the gradients
of the forward's outputs; what it returns is what autograd of the forward gives.

Only where the backward takes a forward result and no CPU function stands beside it. Where
every such result is optional, the backward's own test stays the fallback
(testgen.generate): the glue is tried first because only it reaches the path the result feeds.
"""

from __future__ import annotations

import re
from pathlib import Path

from wrappers.autograd_flow import Flow, find_flow
from wrappers.opmap import binding_names, op_map
from wrappers.signature import Signature

GLUE_SUFFIX = "_through_forward"
MAX_KERNELS_SEARCHED = 400
# Lua torch's names live on in older extensions (SparseConvNet: `X_updateOutput`, `X_backward`,
# `X_updateGradInput`, `X_accGradParameters`)
_BACKWARD = {"backward", "bwd", "bw", "grad", "updategradinput", "accgradparameters"}
_DIRECTION = _BACKWARD | {"forward", "fwd", "fw", "updateoutput"}
_OPTIONAL = re.compile(r"\boptional\b")


def _stem(name: str) -> tuple[str, bool]:
    """The op's name without its direction, and whether the name says backward."""
    words = name.lower().split("_")
    back = any(w in _BACKWARD for w in words)
    return "_".join(w for w in words if w not in _DIRECTION), back


def is_backward(binding: str) -> bool:
    return bool(binding) and _stem(binding)[1]


def forward_of(binding: str, names) -> str | None:
    """The forward binding of a backward one among `names` (`x_backward` → `x_forward`, `x`)."""
    stem, back = _stem(binding)
    if not back:
        return None
    found = [n for n in sorted(set(names)) if n != binding and _stem(n) == (stem, False)]
    if not found:  # `spline_weighting_bw_x`: the gradient for the forward's `x`
        words = binding.lower().split("_")
        before = "_".join(words[: next(i for i, w in enumerate(words) if w in _BACKWARD)])
        found = [n for n in sorted(set(names)) if n != binding and _stem(n) == (before, False)]
    return found[0] if found else None


def forward_host(binding: str, file: str, found: dict, disc, index):
    """(exposed item, chain, op map) of the host function the forward `binding` reaches, from
    the kernels it launches (nearest `file` first); None when no kernel's chain reaches it."""
    from wrappers.mined import exposed_for, launcher_candidates, nearest_first

    for fk in nearest_first(list(found.values()), file)[:MAX_KERNELS_SEARCHED]:
        for launcher in launcher_candidates(fk, disc, index):
            got = exposed_for(launcher, index)
            if got is None:
                continue
            item, chain = got
            om = op_map(disc, chain, index.callers)
            if binding in (om.get("python_name"), *om.get("python_names", [])):
                return item, chain, om
    return None


def _result(j: int, returns: str) -> str | None:
    """The C++ expression of the forward's j-th result (-1: all it returns)."""
    core = returns.replace("const", "").replace("&", "").strip()
    if j == -1:
        return "kminer_fwd"
    if re.search(r"\bvector\s*<", core):
        return f"kminer_fwd.at({j})"  # a result a mode leaves out: an error, not a crash
    if re.search(r"\btuple\s*<", core):
        return f"std::get<{j}>(kminer_fwd)"
    if re.fullmatch(r"(?:\w+::)*Tensor", core) and j == 0:
        return "kminer_fwd"
    return None


def _literal(value, type_text: str) -> str | None:
    if value is None:
        return "c10::nullopt" if _OPTIONAL.search(type_text) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return None


class _Writer:
    """The glue's C++ expressions for the sources of a flow."""

    def __init__(self, flow: Flow, fwd: Signature) -> None:
        self.flow, self.fwd = flow, fwd
        self.grads: list[int] = []  # forward results whose gradient the glue takes, in order

    def expr(self, src, type_text: str = "") -> str | None:
        kind = src[0]
        if kind == "arg":  # the Function's k-th argument: where the forward call passes it
            at = [p for p, s in enumerate(self.flow.forward_call) if s == src]
            return self.fwd.params[at[0]][1] if at else None
        if kind == "result":
            return _result(src[1], self.fwd.returns)
        if kind == "out_grad":
            if src[1] not in self.grads:
                self.grads.append(src[1])
            return f"kminer_grad_{src[1]}"
        if kind == "zeros":
            inner = self.expr(src[1])
            return f"at::zeros_like({inner})" if inner else None
        if kind == "const":
            return _literal(src[1], type_text)
        return None


def _target(sig: Signature) -> str:
    return sig.qualified + (f"<{sig.template_args}>" if sig.template_args else "")


def glue(flow: Flow, fwd: Signature, bwd: Signature) -> tuple[Signature, str] | None:
    """The glue's signature and C++ definition; None where the flow does not map onto the two
    host functions (another arity, a literal C++ cannot take, a result it cannot index)."""
    if len(flow.forward_call) != len(fwd.params) or len(flow.backward_call) != len(bwd.params):
        return None
    w = _Writer(flow, fwd)
    names = ", ".join(n for _, n in fwd.params)
    lines, args = [f"  auto kminer_fwd = {_target(fwd)}({names});"], []
    for i, (src, (type_text, _)) in enumerate(zip(flow.backward_call, bwd.params, strict=True)):
        e = w.expr(src, type_text)
        if e is None:
            return None
        if src[0] == "zeros":
            lines.append(f"  at::Tensor kminer_buffer_{i} = {e};")
            e = f"kminer_buffer_{i}"
        elif src[0] == "out_grad":
            e += ".contiguous()"
        elif src[0] == "const" and "&" in type_text and "const" not in type_text.split():
            # a literal for a non-const reference (mamba's `c10::optional<at::Tensor>& dz_`)
            lines.append(f"  {type_text.replace('&', '').strip()} kminer_arg_{i} = {e};")
            e = f"kminer_arg_{i}"
        args.append(e)
    returned = "void" not in bwd.returns.split()
    call = f"{_target(bwd)}({', '.join(args)});"
    lines.append(f"  auto kminer_bwd = {call}" if returned else f"  {call}")
    outs = []
    for _, where in flow.gradients:
        if where[0] == "buffer":
            outs.append(f"kminer_buffer_{where[1]}")
        elif returned and where[1] == -1:
            outs.append("kminer_bwd")
        elif returned and _result(where[1], bwd.returns):
            outs.append(_result(where[1], bwd.returns).replace("kminer_fwd", "kminer_bwd"))
        else:
            return None
    if not outs or not w.grads:
        return None
    lines.append(f"  return {{{', '.join(outs)}}};")
    params = list(fwd.params) + [("const at::Tensor &", f"kminer_grad_{j}") for j in w.grads]
    name = f"{bwd.name}{GLUE_SUFFIX}"
    sig = Signature(name, name, "std::vector<at::Tensor>", params, "", "")
    head = ", ".join(f"{t} {n}" for t, n in params)
    doc = (
        f"// kminer: {flow.backward} behind {flow.forward}, as the autograd Function in "
        f"{flow.file} runs them"
    )
    code = "\n".join([doc, f"std::vector<at::Tensor> {name}({head}) {{", *lines, "}"])
    return sig, code


def needs_forward(flow: Flow, bwd: Signature) -> bool:
    """Whether the backward takes a forward result: as a required tensor (mmcv's voxel map), or
    as an optional one the path the tests can reach alone leaves out (mamba's scan states `x_`,
    read only past the first chunk of a sequence, and `out_`, required once `z` is given)."""
    return any(i < len(bwd.params) for i in flow.needs_results())


def runs_alone(flow: Flow, bwd: Signature) -> bool:
    """Whether the backward takes every forward result it is given as optional: its label can
    still be tested alone where the glue finds no reference."""
    fed = [i for i in flow.needs_results() if i < len(bwd.params)]
    return all(_OPTIONAL.search(bwd.params[i][0]) for i in fed)


def plan(cand, om: dict, bwd: Signature, disc, index, found: dict):
    """(forward exposed item, its chain and op map, the flow) where `cand`'s label needs its
    forward behind it; None otherwise."""
    binding = om.get("python_name", "")
    if not is_backward(binding) or om.get("cpu_fn"):
        return None
    fwd_binding = forward_of(binding, binding_names(disc).values())
    if fwd_binding is None:
        return None
    flow = find_flow(Path(disc.root), fwd_binding, binding)
    if flow is None or not needs_forward(flow, bwd):
        return None
    host = forward_host(fwd_binding, cand.kernel.file, found, disc, index)
    return (*host, flow) if host else None
