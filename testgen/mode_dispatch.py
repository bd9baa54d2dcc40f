"""One CUDA host function shared by several ops, each with a CPU function of its own.

A repository may write one generic CUDA entry point and reach it from thin per-op wrappers that
fix its modes with constants: pytorch3d's `DistanceForwardCuda(objects, objects_dim, ...,
targets, targets_dim, ...)` is called as `(points, 1, ..., tris, 3, ...)` by the point-face op,
`(tris, 3, ..., points, 1, ...)` by the face-point op, and likewise for points and edges, while
each op's CPU side is a function of its own (`PointFaceDistanceForwardCpu`...). The recorded
calls come from all four ops; a reference made of one op's CPU function refused the other
three's calls (half the cases of the test were invalid).

So each op that reaches the label's function through such a wrapper gives a branch: the
constants its wrapper passes (`objects_dim == 1 && targets_dim == 3`) select its CPU function,
called with the arguments read back from that wrapper as for any direct call. The reference
takes the label's arguments and runs the branch whose constants they hold; a call no branch
holds is refused (a `std::runtime_error`: the test takes the case as invalid).
"""

from __future__ import annotations

import re

from testgen.argmap import Step, declared, substitute

_LITERAL = re.compile(r"^(?:-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?[fFlLuU]*|true|false)$")


def mode_of(steps: list[Step] | None) -> dict[str, str]:
    """The label function's parameters that the call into it fixes with a constant (its first
    step upward), by name: `{"objects_dim": "1", "targets_dim": "3"}`."""
    if not steps:
        return {}
    first = steps[0]
    return {
        param: arg.strip()
        for param, arg in zip(first.callee_params, first.args, strict=False)
        if _LITERAL.match(arg.strip())
    }


def distinct(modes: list[dict[str, str]]) -> bool:
    """Whether every two modes fix some parameter to different constants, so that the
    arguments of a call select at most one of them."""
    for i, a in enumerate(modes):
        for b in modes[i + 1 :]:
            if not any(k in b and _value(a[k]) != _value(b[k]) for k in a):
                return False
    return bool(modes)


def _value(literal: str) -> float | str:
    text = literal.rstrip("fFlLuU")
    if text in ("true", "false"):
        return float(text == "true")
    try:
        return float(text)
    except ValueError:
        return literal


def dispatch_adapter(
    exposed, branches: list[tuple[dict[str, str], str, list[str]]], enums: frozenset[str], note
) -> tuple[str, str]:
    """(C++ code, what `m.def("reference", ...)` binds): `kminer_ref::reference(<the label
    function's parameters>)` running the CPU function of the branch whose constants the
    arguments hold. `branches`: (mode, the CPU function as called, its arguments)."""
    decl, cast = declared(exposed, enums)
    lines = []
    for mode, cpu, args in branches:
        test = " && ".join(f"{k} == {v}" for k, v in sorted(mode.items()))
        call = f"{cpu}({', '.join(substitute(a, cast) for a in args)})"
        run = f"{{ {call}; return; }}" if exposed.returns == "void" else f"return {call};"
        lines.append(f"  if ({test}) {run}\n")
    refused = "kminer: no CPU function of the repository computes this mode"
    code = (
        f"// kminer: {note}\nnamespace kminer_ref {{\nusing at::Tensor;\n"
        f"{exposed.returns} reference({', '.join(decl)}) {{\n"
        + "".join(lines)
        + f'  throw std::runtime_error("{refused}");\n}}\n'
        "}  // namespace kminer_ref\n"
    )
    return code, "&kminer_ref::reference"
