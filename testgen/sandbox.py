"""Checkers: kminer's own scripts run on a model's code inside the execution boundary.

A checker (`testgen/standalone/callcheck.py`, `refcheck.py`) runs in a temp dir holding the
model's code and the inputs, through `miner.sandbox` like every other run of code kminer did not
write, and answers in `out.json`. What it wrote is read back safely (never through a symlink, a
size cap) and tensors with `weights_only`, so the model's code can neither reach a secret nor
smuggle one out through its answer.
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
from pathlib import Path

from miner import sandbox

CHECK_LIMITS = dict(memory_mb=16 << 10, processes=64, file_mb=512)


def run_checker(
    script: Path, files: dict[str, object], what: str, timeout: float, outputs: tuple = ()
) -> dict | str:
    """Run a checker (`python SCRIPT FILE... OUTPUT... out.json`) in the sandbox, in a temp dir
    holding `files` (a name's text, or a value it `torch.save`s). Returns the problem out.json
    reports, or the checker's crash or timeout ("`what` took over..."); else {output name: what
    the checker wrote there, loaded with `weights_only`}."""
    import torch

    with tempfile.TemporaryDirectory(prefix="kminer-check-") as tmp:
        folder = Path(tmp)
        for name, value in files.items():
            if isinstance(value, str):
                (folder / name).write_text(value, encoding="utf-8")
            else:
                torch.save(value, folder / name)
        argv = [sys.executable, str(script), *files, *outputs, "out.json"]
        done = sandbox.run(argv, sandbox.Limits(seconds=timeout, **CHECK_LIMITS), cwd=folder)
        if done.timed_out:
            return f"{what} took over {timeout:.0f}s"
        raw = sandbox.read_output(folder / "out.json", 1 << 20)
        if raw is None:
            tail = "\n".join(done.stderr.strip().splitlines()[-6:])
            return f"{what} crashed (exit {done.returncode}): {tail}"
        try:
            problem = json.loads(raw)["problem"]
        except (ValueError, KeyError, TypeError):
            return f"{what} wrote an unreadable answer"
        if problem:
            return str(problem)[:2000]
        found = {}
        for name in outputs:
            data = sandbox.read_output(folder / name)
            if data is None:
                return f"{what} wrote no {name}"
            found[name] = torch.load(io.BytesIO(data), weights_only=True)
        return found
