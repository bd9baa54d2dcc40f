"""Run a written Python reference on recorded calls, on the CPU, before any test relies on it.

A reference that raises, hangs, or neither writes nor returns anything is no reference: the
model hears why and tries again. This file runs in the sandbox (the code is a model's); it needs
only python and torch. Usage: python refcheck.py CODE.py CALLS.pt [RAISED.pt] OUT.json; with
RAISED.pt it runs on every call and writes {call index: what it raised} there instead (which
recorded calls a repository's reference cannot take, all in one run).
"""

from __future__ import annotations

import json
import sys
import traceback

import torch

MAX_CALLS = 3


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN was (a tensor holding NaN never equals itself)."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def _load(code: str):
    """The code's `reference`, or why there is none."""
    namespace = {"__name__": "kminer_reference"}
    try:
        exec(compile(code, "reference.py", "exec"), namespace)
    except Exception:
        return "the code does not load: " + traceback.format_exc(limit=-3)
    fn = namespace.get("reference")
    return fn if callable(fn) else "the code defines no function `reference`"


def raised(code: str, calls: list) -> dict[int, str] | str:
    """{index: the last line of what it raised} for each call the reference raises on."""
    fn = _load(code)
    if isinstance(fn, str):
        return fn
    found = {}
    for k, args in enumerate(calls):
        try:
            with torch.no_grad():
                fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        except Exception:
            found[k] = traceback.format_exc(limit=-1).strip().splitlines()[-1][:200]
    return found


def check(code: str, calls: list) -> str:
    """'' when the reference runs on every call and does something; else the problem."""
    fn = _load(code)
    if isinstance(fn, str):
        return fn
    effect = False
    for k, args in enumerate(calls[:MAX_CALLS]):
        mine = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        try:
            with torch.no_grad():
                returned = fn(*mine)
        except Exception:
            return f"call {k} raised: " + traceback.format_exc(limit=-3)
        wrote = any(
            not _same(a, b)
            for a, b in zip(mine, args, strict=False)
            if isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
        )
        effect = effect or wrote or returned is not None
        if any(t.device.type != "cpu" for t in _tensors(returned)):
            return f"call {k}: `reference` returned a tensor that is not on the CPU"
    if not effect:  # an output that happens to hold the answer already is fine once, not always
        return "`reference` wrote no argument and returned nothing on any recorded call"
    return ""


def main() -> int:
    code_path, calls_path, *raised_path, out_path = sys.argv[1:]
    with open(code_path, encoding="utf-8") as f:
        code = f.read()
    calls = torch.load(calls_path, weights_only=True)
    if raised_path:
        found = raised(code, calls)
        problem = found if isinstance(found, str) else ""
        if not problem:
            torch.save(found, raised_path[0])
    else:
        problem = check(code, calls)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"problem": problem}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
