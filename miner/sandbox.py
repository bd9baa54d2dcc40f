"""The one execution boundary: every run of code kminer did not write goes through `run`.

That code is a repository's tests (under the recorder), its kernels and headers (under nvcc), the
tests and references kminer generated from them, and what a model wrote. Users run kminer where
their Hugging Face and OpenAI tokens live, so the boundary gives such code:
- an environment built from an allowlist (no tokens, keys or proxies, whatever the caller had);
- no network: a network namespace (bubblewrap) where it works, else a seccomp filter that refuses
  every socket but AF_UNIX (and io_uring, which could open one);
- a private writable temp dir (HOME and TMPDIR), the named `writable` paths, and the rest
  read-only: bubblewrap's read-only root with the home folders (where tokens and keys live)
  replaced by empty ones, the paths the run needs bound back; as root, a uid of its own that
  owns nothing else;
- limits: address space (or, for GPU code and AddressSanitizer builds, which reserve huge address
  ranges, a watch on their resident memory), processes, file size, CPU time, no core dumps;
- a wall-clock limit that ends the whole process tree — setsid grandchildren and those holding
  its output open included — and returns within 2 s of it.

How: a supervisor (supervisor.py, a process of its own) makes itself the subreaper of everything
the code starts, so nothing escapes it by double-forking or setsid; it waits, watches, and at the
end kills whatever is left (and, with a uid of its own, everything that uid runs). Output goes to
files the code cannot reach, never to pipes a grandchild could hold open. `describe()` says which
of these protections this machine gives. This file and supervisor.py travel in verification
bundles: standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

try:  # in kminer
    from miner import supervisor
except ImportError:  # in a bundle: beside run.py
    import supervisor

KEEP_ENV = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS",
    "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CC", "CXX",
)  # fmt: skip
SECRET = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL|AUTH|PROXY|COOKIE|SESSION", re.I)
HOMES = ("/root", "/home")  # where tokens and keys live: empty in the sandbox
OUTPUT_LIMIT = 4 << 20  # bytes of stdout/stderr kept for the caller
GRACE_S = 2.0  # the tree is dead and the call returned within this of the wall-clock limit
UID_BASE = 200_000  # as root, each run gets a uid of its own from here (owns nothing else)


@dataclass(frozen=True)
class Limits:
    seconds: float  # wall clock, for the whole tree
    memory_mb: int = 16 << 10
    processes: int = 256
    file_mb: int = 2 << 10
    cpu_seconds: int = 0  # 0: four times the wall-clock limit (builds run a few threads)
    # memory watched on the tree's resident set, not capped as address space: for code that
    # reserves far more than it touches (AddressSanitizer maps terabytes of shadow; GPU code too)
    watch_rss: bool = False


@dataclass
class Result:
    returncode: int | None  # None: killed at the wall-clock or memory limit
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    over_memory: bool = False
    stopped: bool = False  # ended by `stop` (the caller was interrupted)
    left_behind: int = 0  # processes still alive when the code's own process ended (killed)
    notes: list[str] = field(default_factory=list)


def run(
    argv: list[str],
    limits: Limits,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    writable: list[Path] = (),
    shared: list[Path] = (),
    readable: list[Path] = (),
    gpu: bool = False,
    on_start=None,
) -> Result:
    """Run `argv` inside the boundary; never raises for what the code does (crash, hang, garbage
    output, a fork bomb): that is in the Result. `env` adds variables (secret-looking names are
    dropped); `cwd` and `writable` paths become the run's own, `shared` ones stay writable by
    every run at once (a build folder the tests of one reference share), `readable` ones readable
    (the rest of the home folders is hidden); `gpu` keeps /dev's GPUs reachable and watches
    resident memory. `on_start(pid)` is told the supervisor's pid: `stop(pid)` ends the run from
    another thread."""
    control = Path(tempfile.mkdtemp(prefix="kminer-run-"))  # the caller's: spec, output, result
    private = control / "home"  # the code's: HOME, TMPDIR
    private.mkdir()
    bwrap = _bwrap_works()
    given = [Path(p).resolve() for p in (*writable, *([cwd] if cwd else []))]  # the run's own
    given += [Path(p).resolve() for p in shared]
    needed = [Path(p).resolve() for p in readable]
    named = [Path(a).resolve() for a in argv if str(a).startswith("/") and Path(a).exists()]
    needed += [p for p in named if not any(p == g or g in p.parents for g in given)]
    hidden = _hidden([*needed, *given, *_interpreter()]) if bwrap else set()
    uid = _run_uid(needed + [p.parent for p in given], hidden if bwrap else None)
    needed += given
    if not bwrap:
        _protect_caller()
    try:
        for path in [private, *writable, *([cwd] if cwd else [])]:
            _give(Path(path), uid)
        for path in shared:
            _share(Path(path), uid)
        control.chmod(0o711)  # the code may enter `home`, never read the caller's files
        spec = {
            "argv": list(argv),
            "env": _environment(env or {}, private),
            "cwd": str(cwd or private),
            "private": str(private),
            "writable": [str(p) for p in given],
            "readable": [str(p) for p in _visible(needed, hidden)],
            "gpu": gpu,
            "uid": uid,
            "limits": dataclasses.asdict(limits),
            "bwrap": bwrap_tool() if bwrap else "",  # the tool's path; "": none
            "homes": sorted(str(h) for h in hidden),
        }
        (control / "spec.json").write_text(json.dumps(spec))
        (control / "spec.json").chmod(0o600)
        return _supervise_from_outside(control, limits, on_start)
    finally:
        shutil.rmtree(control, ignore_errors=True)


def describe() -> dict[str, str]:
    """What the boundary gives on this machine (for the notes and the run log)."""
    bwrap = _bwrap_works()
    hidden = _hidden(_interpreter()) if bwrap else set()
    uid = _run_uid([Path(sys.executable).resolve()], hidden if bwrap else None)
    net = (
        "network namespace (bubblewrap)"
        if bwrap
        else f"socket filter ({supervisor.seccomp_arch()})"
    )
    own = f"a uid of its own ({UID_BASE}+)" if uid is not None else "the caller's uid"
    files = "read-only root, homes hidden (bubblewrap)" if bwrap else f"what {own} may write"
    return {"network": net, "files": files, "processes": own, "tree": "subreaper supervisor"}


def _environment(extra: dict[str, str], private: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ and not SECRET.search(k)}
    env.update({k: v for k, v in extra.items() if not SECRET.search(k)})
    env.update(HOME=str(private), TMPDIR=str(private), USER="kminer", LOGNAME="kminer")
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
    return env


def _interpreter() -> list[Path]:
    """What any run needs readable: the interpreter and its libraries, every import path,
    kminer itself."""
    paths = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)]
    paths += [Path(p) for p in sys.path if p and Path(p).exists()]
    paths += [Path(__file__).parent, Path(sys.executable).parent]
    return [p.resolve() for p in paths]


def _hidden(paths: list[Path]) -> set[Path]:
    """Folders bubblewrap replaces by empty ones: the home folders (where tokens and keys live),
    and the first folder another uid cannot enter on the way to each path the run needs (a
    private temp dir, a home); what the run needs inside is bound back."""
    hidden = {Path(h) for h in HOMES if Path(h).is_dir()}
    for path in paths:
        for parent in reversed(path.parents):
            if not parent.stat().st_mode & 0o001:
                hidden.add(parent)
                break
    return hidden


def _under(path: Path, folders: set[Path]) -> Path | None:
    return next((f for f in folders if f == path or f in path.parents), None)


def _visible(needed: list[Path], hidden: set[Path]) -> list[Path]:
    """What must stay readable under the hidden folders: the interpreter and kminer, and the
    paths the run names."""
    paths = [*_interpreter(), *needed]
    return sorted({p for p in paths if p.exists() and _under(p, hidden)})


def _run_uid(needed: list[Path], hidden: set[Path] | None) -> int | None:
    """A uid no other process uses (as root), so the run's processes can be counted, limited and
    killed as one, and own nothing on this machine. None when kminer is not root, or when a path
    the run needs is not readable by others (then the run keeps the caller's uid). Under
    bubblewrap (`hidden` given) the hidden folders are replaced and the needed paths bound back,
    so only the part of a path below its hidden folder has to be readable by others."""
    if os.geteuid() != 0:
        return None
    bwrap = hidden is not None
    paths = [Path(sys.executable), Path(supervisor.__file__)] if bwrap else []  # the uid drop
    paths += needed
    if not all(_others_can_read(p, hidden or set()) for p in paths):
        return None
    return UID_BASE + (os.getpid() * 7919 + time.monotonic_ns() // 1000) % 60_000


def _others_can_read(path: Path, hidden: set[Path] = frozenset()) -> bool:
    """Whether another uid can reach and read `path`: every parent searchable, or, under a
    hidden folder, where bubblewrap binds the path itself on folders it makes searchable, only
    the path."""
    path = path.resolve()
    parents = [] if _under(path, set(hidden)) else list(path.parents)
    if not all(p.stat().st_mode & 0o001 for p in parents):
        return False
    mode = path.stat().st_mode
    return bool(mode & 0o004) and (not path.is_dir() or bool(mode & 0o001))


def _give(path: Path, uid: int | None) -> None:
    """Make the folder `path` (recursively) the run's own, so its uid can write there and
    nowhere else (a writable file is the caller's to make writable: it may be shared)."""
    if uid is None or not path.is_dir() or path.is_symlink():
        return
    for root, dirs, files in os.walk(path):
        os.lchown(root, uid, uid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)


def _share(path: Path, uid: int | None) -> None:
    """Make `path` writable by the group every run joins (supervisor.SHARED_GID): new files
    inherit the group (setgid folders) and the runs' umask leaves them group-writable, so runs of
    different uids take turns in one build folder. Nothing else on the machine has that group."""
    if uid is None or path.is_symlink() or not path.exists():
        return
    items = [path]
    if path.is_dir():
        items += [Path(root) / name for root, dirs, files in os.walk(path) for name in dirs + files]
    for item in items:
        if not item.is_symlink():
            os.lchown(item, -1, supervisor.SHARED_GID)
            os.chmod(item, item.stat().st_mode & 0o7777 | (0o2070 if item.is_dir() else 0o060))


def bwrap_tool() -> str | None:
    """bubblewrap: the machine's, else the one a verification bundle carries (bin/bwrap, copied
    from the machine that made the bundle; run.py names it in KMINER_BWRAP), for a GPU box that
    has none."""
    carried = os.environ.get("KMINER_BWRAP") or str(Path(__file__).parent / "bin" / "bwrap")
    return shutil.which("bwrap") or (carried if os.access(carried, os.X_OK) else None)


@functools.cache
def _bwrap_works() -> bool:
    """Whether bubblewrap can make its namespaces here (KMINER_SANDBOX_BWRAP=0: never use it)."""
    tool = bwrap_tool()
    if not tool or os.environ.get("KMINER_SANDBOX_BWRAP") == "0":
        return False
    probe = [tool, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--die-with-parent"]
    probe += [*(["--unshare-user"] if os.geteuid() != 0 else []), "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=20, env={}).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.cache
def _protect_caller() -> None:
    """Without namespaces the code could read this process's environment (its tokens) through
    /proc; a non-dumpable process's /proc files belong to root."""
    PR_SET_DUMPABLE = 4
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def read_output(path: Path, limit: int = 64 << 20) -> bytes | None:
    """A file the code wrote, read safely: never through a symlink or from anything but a
    regular file (the code could point one at a secret), at most `limit` bytes; None if not so."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = fh.read(limit + 1)
    return data if len(data) <= limit else None


def stop(pid: int) -> None:
    """End a run from outside (an interrupted caller): the supervisor ends the code's tree."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)


def _supervise_from_outside(control: Path, limits: Limits, on_start=None) -> Result:
    """Start the supervisor and wait for it; it keeps the time limit, this keeps its own."""
    out, err = control / "stdout", control / "stderr"
    start = time.monotonic()
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen(
            [sys.executable, "-S", supervisor.__file__, str(control / "spec.json")],
            stdin=subprocess.DEVNULL,
            stdout=fo,
            stderr=fe,
            start_new_session=True,
            env={"PATH": os.environ.get("PATH", "")},
        )
        if on_start is not None:
            on_start(proc.pid)
        try:
            proc.wait(timeout=limits.seconds + GRACE_S + 5)
        except subprocess.TimeoutExpired:  # the supervisor itself is stuck: end it
            _kill_group(proc.pid)
            proc.wait()
    report = _read_json(control / "result.json")
    return Result(
        returncode=report.get("returncode"),
        stdout=_tail(out),
        stderr=_tail(err),
        timed_out=bool(report.get("timed_out")),
        seconds=round(time.monotonic() - start, 3),
        over_memory=bool(report.get("over_memory")),
        stopped=bool(report.get("stopped")),
        left_behind=int(report.get("left_behind", 0)),
        notes=list(report.get("notes", ["no report from the supervisor"])),
    )


def _tail(path: Path) -> str:
    with path.open("rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - OUTPUT_LIMIT))
        return fh.read().decode("utf-8", errors="replace")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
