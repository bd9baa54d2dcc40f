"""Run a model's `make_calls` in the sandbox and keep its calls only if they can be test inputs.

Inputs a model writes for a kernel whose repository never calls it are code we did not write: they
run here, in a subprocess with a timeout, and what comes back is data (`torch.save` of tensors,
numbers and lists, loaded with `weights_only`). A call set is refused, with a reason the model
hears, unless it is what a test needs: at least MIN_CALLS calls over MIN_SHAPES shapes, each with
one value per parameter of the host function and of the parameter's kind, CPU tensors of at most
MAX_ELEMENTS elements in all, and the same values when made twice (fixed seeds).
Usage: python callcheck.py CODE.py SPEC.json OUT.pt OUT.json (SPEC: [{"name", "kind"}]).
This file needs only python and torch.
"""

from __future__ import annotations

import json
import sys
import traceback

import torch

MIN_CALLS, MIN_SHAPES, MAX_CALLS = 3, 3, 6
MAX_ELEMENTS = 1 << 20
_NUMBER = (int, float)


def _fits(value, kind: str) -> bool:
    if kind == "tensor":
        return isinstance(value, torch.Tensor)
    if kind == "tensor?":
        return value is None or isinstance(value, torch.Tensor)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, _NUMBER) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "ints":
        return isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value)
    if kind == "intlists":
        return isinstance(value, (list, tuple)) and all(_fits(v, "ints") for v in value)
    if kind == "floats":
        return isinstance(value, (list, tuple)) and all(isinstance(v, _NUMBER) for v in value)
    if kind == "str":
        return isinstance(value, str)
    return True


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point():  # NaN where NaN was (a tensor holding NaN never equals itself)
            return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _shape(call: list) -> tuple:
    return tuple(tuple(v.shape) if isinstance(v, torch.Tensor) else None for v in call)


def check(calls, again, spec: list[dict]) -> str:
    """'' when the calls can be a test's inputs; else what is wrong with them."""
    if not isinstance(calls, (list, tuple)) or len(calls) < MIN_CALLS:
        return f"`make_calls` must return a list of at least {MIN_CALLS} calls"
    names = ", ".join(p["name"] for p in spec)
    for k, call in enumerate(calls):
        if not isinstance(call, (list, tuple)) or len(call) != len(spec):
            return f"call {k} must be a list of {len(spec)} arguments ({names})"
        for value, p in zip(call, spec, strict=True):
            if not _fits(value, p["kind"]):
                return (
                    f"call {k}: `{p['name']}` must be a {p['kind']}, it is {type(value).__name__}"
                )
            if isinstance(value, torch.Tensor):
                if value.device.type != "cpu" or value.requires_grad or value.is_complex():
                    return f"call {k}: `{p['name']}` must be a real CPU tensor without grad"
                if not value.is_contiguous():
                    return f"call {k}: `{p['name']}` must be contiguous"
        size = sum(v.numel() for v in call if isinstance(v, torch.Tensor))
        if size > MAX_ELEMENTS:
            return f"call {k} holds {size} tensor elements: at most {MAX_ELEMENTS} in all"
        if size == 0:
            return f"call {k} has no tensor data"
    if len({_shape(c) for c in calls}) < MIN_SHAPES:
        return f"the calls need at least {MIN_SHAPES} different shapes"
    if not _same(list(calls), list(again)):
        return "`make_calls` returned other values the second time: seed every random draw"
    return ""


def main() -> int:
    code_path, spec_path, calls_path, out_path = sys.argv[1:5]
    with open(code_path, encoding="utf-8") as f:
        code = f.read()
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    problem = ""
    try:
        namespace = {"__name__": "kminer_calls"}
        exec(compile(code, "calls.py", "exec"), namespace)
        calls, again = namespace["make_calls"](), namespace["make_calls"]()
    except Exception:
        problem = "`make_calls` raised: " + traceback.format_exc(limit=-3)
    else:
        problem = check(calls, again, spec)
        if not problem:
            torch.save([list(c) for c in calls[:MAX_CALLS]], calls_path)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"problem": problem}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
