"""The one way kminer runs code it did not write (a repository's tests, generated tests).

A subprocess in a fresh temp dir, in its own process group (a timeout kills everything it
started), with an environment that carries no secrets, memory capped, and no network where the
OS lets an unprivileged `unshare -n` work. Nothing here trusts the code's exit path: the result
is what the process printed and its exit status.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

KEEP_ENV = ("PATH", "LANG", "LC_ALL", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "TMPDIR")
MEMORY_LIMIT_BYTES = 16 << 30


@dataclass
class SandboxResult:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


@functools.cache
def _unshare_net() -> list[str]:
    """`unshare -n` when it works here (root or user namespaces), else nothing."""
    tool = shutil.which("unshare")
    if not tool:
        return []
    try:
        probe = subprocess.run([tool, "-n", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [tool, "-n"] if probe.returncode == 0 else []


def _limits() -> None:  # runs in the child before exec
    os.setsid()
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_sandboxed(
    argv: list[str],
    timeout: float,
    extra_env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> SandboxResult:
    """Run `argv` in a temp dir (or `cwd`) with a clean environment; never raises on the code's
    behaviour (crash, hang, garbage output)."""
    import time

    env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
    with tempfile.TemporaryDirectory(prefix="kminer-sandbox-") as home:
        env.update(HOME=home, PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
        env.update(extra_env or {})
        start = time.monotonic()
        proc = subprocess.Popen(
            [*_unshare_net(), *argv],
            cwd=str(cwd or home),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_limits,
            text=True,
            errors="replace",
        )
        try:
            out, err = proc.communicate(timeout=timeout)
            return SandboxResult(proc.returncode, out, err, False, time.monotonic() - start)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return SandboxResult(None, out, err, True, time.monotonic() - start)


def run_checker(
    script: Path, files: dict[str, object], what: str, timeout: float, outputs: tuple = ()
) -> dict | str:
    """Run a checker (`python SCRIPT FILE... OUTPUT... out.json`) in the sandbox, in a temp dir
    holding `files` (a name's text, or a value it `torch.save`s). Returns the problem out.json
    reports, or the checker's crash or timeout ("`what` took over..."); else {output name: what
    the checker wrote there, loaded with `weights_only`}."""
    import json
    import sys

    import torch

    with tempfile.TemporaryDirectory(prefix="kminer-check-") as tmp:
        folder = Path(tmp)
        for name, value in files.items():
            if isinstance(value, str):
                (folder / name).write_text(value, encoding="utf-8")
            else:
                torch.save(value, folder / name)
        argv = [sys.executable, str(script), *files, *outputs, "out.json"]
        done = run_sandboxed(argv, timeout, cwd=folder)
        if done.timed_out:
            return f"{what} took over {timeout:.0f}s"
        out = folder / "out.json"
        if not out.is_file():
            tail = "\n".join(done.stderr.strip().splitlines()[-6:])
            return f"{what} crashed (exit {done.returncode}): {tail}"
        problem = json.loads(out.read_text())["problem"]
        if problem:
            return problem
        return {name: torch.load(folder / name, weights_only=True) for name in outputs}
