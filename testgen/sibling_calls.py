"""Inputs for an op the repository's tests never call, from an op of the same extension that
takes the same parameters.

lietorch's tests call `inv(group_index, X)` and `logm(group_index, X)` on every group, never
`as_matrix(group_index, X)`; its Jacobian `Jinv(group_index, X, a)` takes what `adj` and `adjT`
take. Parameters of the same types under the same names in one extension are, by the authors'
own naming, the same kind of value, so the recorded calls of one are calls the other accepts.
Only for an op that returns what it computes: where an op writes into a tensor its caller
passed, that tensor's size is the op's own contract, which the sibling's calls know nothing of
(mmcv's points_in_boxes_part and _all take the same names, with outputs of different shapes).
The test runs the repository's reference on every case as ever: a call it refuses (a
TORCH_CHECK) is an invalid case, never a mismatch, and the GPU verdict judges the rest.
"""

from __future__ import annotations

import re

from testgen.inputs import RecordedCall

_NOISE = re.compile(r"\bconst\b|&|\b(?:torch|at)::|\s+")


def _plain(type_text: str) -> str:
    """A parameter type without what does not change the value passed (`const at::Tensor&`
    and `torch::Tensor` are one type)."""
    return _NOISE.sub("", type_text)


def _returns_outputs(returns: str) -> bool:
    return "Tensor" in (returns or "")


def _params(refs, name: str):
    item = refs.definition(name)
    sig = refs.signature(item) if item else None
    if sig is None or not sig.params or not all(n for _, n in sig.params):
        return None, None
    return [(_plain(t), n) for t, n in sig.params], sig.returns


def sibling_calls(refs, op: str, recorded: dict) -> list[RecordedCall]:
    """The recorded calls of the op with most of them among those whose binding takes the
    same parameters (types and names, in order) as `op`'s, as calls of `op`; [] when none
    does or `op` writes into a tensor it is passed instead of returning its result."""
    params, returns = _params(refs, op)
    if params is None or not _returns_outputs(returns):
        return []
    best: list = []
    for name in sorted(recorded):
        if name == op or len(recorded[name]) <= len(best):
            continue
        if _params(refs, name)[0] == params:
            best = [
                RecordedCall(
                    op,
                    call.args,
                    call.kwargs,
                    f"{call.test_file} (a call of `{name}`, which takes the same parameters)",
                )
                for call in recorded[name]
            ]
    return best
