"""The CPU function an op's CPU twin calls where the CUDA op calls the label's launcher, with
the same arguments.

SparseConvNet's `cuda_InputLayer_updateOutput` calls `InputLayer_fp<T>(iF, oF, nRows,
maxActive, nPlanes, &rules[1][0], rb, mode == 4)`, and its twin `cpu_InputLayer_updateOutput`
calls `InputLayer_ForwardPass<T>(input_features.data_ptr<T>(), output_features.data_ptr<T>(),
nRows, maxActive, nPlanes, &rules[1][0], mode == 4)`. Once the CUDA op's locals are read back
(`auto iF = input_features.data_ptr<T>()`), every argument is the same expression of the same
op's values but the device buffer the launcher stages the rule book in (wrappers.staging), which
the adapter makes itself. The two functions are then the same step of one op on two devices,
whatever their names (`_fp` and `_ForwardPass`), so the CPU one is the launcher's reference,
taking the adapter's arguments in their order.
"""

from __future__ import annotations

import re

from testgen.argmap import call_args
from testgen.op_loop import cpu_twins, definitions

_CALL = re.compile(r"(?<![\w.>:])([A-Za-z_]\w*)\s*(?:<[^<>;{}()]*>)?\s*\(")


def _locals(body: str) -> dict[str, str]:
    """Locals a body defines (`auto iF = input_features.data_ptr<T>();`): name → value."""
    return {name: " ".join(init.split()) for name, (init, *_) in definitions(body).items()}


def _normal(expr: str, local: dict[str, str]) -> str:
    """An argument with the caller's locals replaced by their values, without spaces; the
    address of a container's first number is the container (`&_rules[0][0]`: `_rules`, which
    the CPU twin takes as its `const RuleBook &`)."""
    expr = re.sub(r"\s+", "", expr)
    first = re.fullmatch(r"&([A-Za-z_]\w*)(?:\[0\])+", expr)
    expr = first.group(1) if first else expr
    return re.sub(r"\s+", "", local.get(expr, expr))


def call_site_twin(refs, paths: list, launcher: str, kept: list[int], host_side) -> tuple | None:
    """(the CPU function, its caller) called in a CPU twin of a function calling `launcher`
    with the arguments the launcher gets at positions `kept` (those the adapter binds), or
    None. Each twin found by the repository's CUDA → CPU naming (op_loop.cpu_twins)."""
    for path in paths:
        if len(path) < 2:
            continue
        caller = path[1]
        body = refs.body(caller)
        args = call_args(body, launcher)
        if args is None or len(args) <= max(kept, default=-1):
            continue
        local = _locals(body)
        wanted = [_normal(args[i], local) for i in kept]
        for twin in cpu_twins(refs, caller, host_side):
            found = _matching_call(refs, refs.body(twin), wanted, host_side)
            if found is not None:
                return found, twin
    return None


def _matching_call(refs, body: str, wanted: list[str], host_side):
    brace = body.find("{")
    local = _locals(body)
    for m in _CALL.finditer(body, max(brace, 0)):
        name = m.group(1)
        item = refs.definition(name, host_side=True)
        if item is None or not host_side(item) or len(refs.params_of(name) or []) != len(wanted):
            continue
        args = call_args(body, name)
        if args is not None and [_normal(a, local) for a in args] == wanted:
            return item
    return None
