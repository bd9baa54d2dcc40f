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
