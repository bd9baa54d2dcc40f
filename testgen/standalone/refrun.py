"""Run a reference function kminer assembled from repository code on calls, keeping its outputs.

The gradients of a repository's forward PyTorch function are what its backward kernel must
produce; they are computed here, in the sandbox (the function is the repository's code), and
what comes back is data. Usage: python refrun.py CODE.py CALLS.pt RESULTS.pt OUT.json, where
CODE.py defines `kminer_run(*args)` returning a list of tensors (None where there is none).
This file needs only python and torch.
"""

from __future__ import annotations

import json
import sys
import traceback

import torch


def run(code: str, calls: list) -> tuple[list, str]:
    namespace = {"__name__": "kminer_reference"}
    try:
        exec(compile(code, "reference.py", "exec"), namespace)
    except Exception:
        return [], "the code does not load: " + traceback.format_exc(limit=-3)
    fn = namespace.get("kminer_run")
    if not callable(fn):
        return [], "the code defines no function `kminer_run`"
    results = []
    for k, args in enumerate(calls):
        try:
            out = fn(*args)
        except Exception:
            return [], f"call {k} raised: " + traceback.format_exc(limit=-3)
        results.append([t.detach() if isinstance(t, torch.Tensor) else t for t in out])
    return results, ""


def main() -> int:
    code_path, calls_path, results_path, out_path = sys.argv[1:5]
    with open(code_path, encoding="utf-8") as f:
        code = f.read()
    results, problem = run(code, torch.load(calls_path, weights_only=True))
    torch.save(results, results_path)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"problem": problem}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
