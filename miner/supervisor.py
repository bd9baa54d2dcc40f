"""The supervisor of one run inside the execution boundary (sandbox.py starts it as a process).

It makes itself the subreaper of everything the code starts, so nothing escapes it by
double-forking or setsid; starts the code (inside bubblewrap, or with a seccomp filter that
refuses sockets, as a uid of its own when root); waits, watching the wall clock, a stop request
(SIGTERM) and, for GPU code, the tree's resident memory; then kills whatever is left and writes
what happened to result.json beside the spec. This file travels in verification bundles:
standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import resource
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 36, 38, 22
SECCOMP_MODE_FILTER = 2
AUDIT_ARCH_X86_64 = 0xC000003E
NR_SOCKET_X86_64, NR_IO_URING_SETUP = 41, 425
AF_UNIX = 1
SHARED_GID = 199_999  # the group of folders runs of different uids share (sandbox.UID_BASE - 1)


def _supervise(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    result_path = spec_path.with_name("result.json")
    limits = spec["limits"]
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    argv = _wrapped(spec) if spec["bwrap"] else spec["argv"]
    report: dict = {"timed_out": False, "over_memory": False, "stopped": False}
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    report["notes"] = ["bwrap" if spec["bwrap"] else f"seccomp ({seccomp_arch()})"]
    report["notes"] += [f"uid {spec['uid']}"] if spec["uid"] is not None else []
    try:
        child = subprocess.Popen(
            argv,
            cwd=spec["cwd"],
            env=spec["env"],
            stdin=subprocess.DEVNULL,
            preexec_fn=_child_setup(spec, limits),
        )
    except OSError as exc:
        report.update(returncode=127, notes=[*report["notes"], f"could not start: {exc}"])
        result_path.write_text(json.dumps(report))
        return 0
    deadline = time.monotonic() + limits["seconds"]
    polls = 0
    while True:
        code = child.poll()
        if code is not None:
            report["returncode"] = _signal_code(code) if spec["bwrap"] else code
            break
        if time.monotonic() >= deadline:
            report["timed_out"] = True
            break
        if stopped:
            report["stopped"] = True
            break
        polls += 1
        watched = spec["gpu"] or limits.get("watch_rss")
        if watched and polls % 5 == 0 and _tree_rss_mb() > limits["memory_mb"]:
            report["over_memory"] = True
            break
        time.sleep(0.05)
    try:  # a count only: an error here must not keep the tree alive or lose the report
        alive = [p for p in _descendants(os.getpid()) if not _zombie(p)]
        report["left_behind"] = len(alive) - (child.poll() is None)  # beyond the code's own
    except Exception as exc:
        report["notes"] += [f"left-behind count failed: {exc!r}"]
    _end_tree(child.pid, spec["uid"])
    result_path.write_text(json.dumps(report))
    return 0


def _signal_code(code: int) -> int:
    """bubblewrap exits 128+N when the code died of signal N: give it back as -N, as Popen
    reports a signal (the caller tells a crash from a failure by it)."""
    return -(code - 128) if 128 < code < 128 + signal.NSIG else code


def _wrapped(spec: dict) -> list[str]:
    """bubblewrap around the code: new network, pid, ipc and uts namespaces, the root read-only,
    the home folders empty with the needed paths bound back, the private dir and the writable
    paths writable, /dev with the GPUs when asked; as root, the code then drops to its uid."""
    cmd = [spec["bwrap"], "--die-with-parent", "--new-session"]
    cmd += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    cmd += ["--unshare-user"] if os.geteuid() != 0 else []  # root needs none and drops its uid
    if os.geteuid() == 0:  # root in the sandbox keeps no capability, but for the uid drop
        cmd += ["--cap-drop", "ALL"]
        if spec["uid"] is not None:  # setuid clears them all; bubblewrap still enters the cwd
            cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            cmd += ["--cap-add", "CAP_DAC_OVERRIDE", "--cap-add", "CAP_DAC_READ_SEARCH"]
    cmd += ["--ro-bind", "/", "/", "--proc", "/proc"]
    cmd += ["--dev-bind", "/dev", "/dev"] if spec["gpu"] else ["--dev", "/dev"]
    for home in spec["homes"]:
        if Path(home).is_dir():
            cmd += ["--perms", "0755", "--tmpfs", home]
    made: set[Path] = set()

    def way_to(path: str) -> list[str]:  # the folders on the way, searchable (bwrap makes 0700)
        out = []
        for parent in reversed(Path(path).parents):
            if parent not in made and any(Path(h) in parent.parents for h in spec["homes"]):
                out += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        return out

    for path in spec["readable"]:
        cmd += [*way_to(path), "--ro-bind", path, path]
    for path in [spec["private"], *spec["writable"]]:
        cmd += [*way_to(path), "--bind", path, path]
    cmd += ["--chdir", spec["cwd"], "--"]
    if spec["uid"] is not None:  # bubblewrap ran as root; the code runs as its own uid
        cmd += [sys.executable, "-S", __file__, "--as", str(spec["uid"])]
    return [*cmd, *spec["argv"]]


def _child_setup(spec: dict, limits: dict):
    """What the code's process does before it execs: its own session, limits, no way back to
    root, the network filter where no namespace does that, death with its supervisor."""
    uid = spec["uid"]
    cpu = limits["cpu_seconds"] or max(10, int(limits["seconds"] * 4))

    def setup() -> None:
        os.setsid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        mb = 1 << 20
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * mb, limits["file_mb"] * mb))
        if not (spec["gpu"] or limits.get("watch_rss")):  # CUDA reserves far more than it uses
            memory = limits["memory_mb"] * mb
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        nproc = limits["processes"] if uid is not None else limits["processes"] + _own_processes()
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if spec["bwrap"]:
            return  # the namespaces are bubblewrap's; as root it drops the uid inside (--as)
        if uid is not None:
            _become(uid)
        _deny_network(libc)

    return setup


def _become(uid: int) -> None:
    """The run's own uid and gid, and the shared folders' group."""
    os.setgroups([SHARED_GID])
    os.setgid(uid)
    os.setuid(uid)
    os.umask(0o002)  # what it makes in a shared folder stays writable by the other runs


def _own_processes() -> int:
    me = os.getuid()
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                count += entry.stat().st_uid == me
    return count


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def seccomp_arch() -> str:
    return "x86_64" if platform.machine() == "x86_64" else f"none for {platform.machine()}"


def _deny_network(libc) -> None:
    """A seccomp filter: socket() only for AF_UNIX, no io_uring; other ABIs refused outright."""
    if platform.machine() != "x86_64":
        return

    def stmt(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET
    deny, allow = 0x00050000 | 13, 0x7FFF0000  # SECCOMP_RET_ERRNO|EACCES, SECCOMP_RET_ALLOW
    prog = b"".join(
        [
            stmt(ld, 4),  # arch
            stmt(jeq, AUDIT_ARCH_X86_64, 0, 6),
            stmt(ld, 0),  # syscall number
            stmt(jeq, NR_IO_URING_SETUP, 4, 0),
            stmt(jeq, NR_SOCKET_X86_64, 0, 2),
            stmt(ld, 16),  # args[0]: the domain
            stmt(jeq, AF_UNIX, 0, 1),
            stmt(ret, allow),
            stmt(ret, deny),
        ]
    )
    buf = ctypes.create_string_buffer(prog)

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Fprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        os.write(2, b"kminer sandbox: the network filter could not be installed\n")
        os._exit(126)


def _children(pid: int) -> list[int]:
    """A process's children; none once it is gone (it may end while it is read)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found = []
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return found


def _descendants(pid: int) -> set[int]:
    found, todo = set(), _children(pid)
    while todo:
        kid = todo.pop()
        if kid not in found:
            found.add(kid)
            todo += _children(kid)
    return found


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (OSError, IndexError):
        return True


def _tree_rss_mb() -> float:
    """Resident memory of everything under this supervisor, in MiB."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
    return total / (1 << 20)


def _end_tree(pid: int, uid: int | None) -> None:
    """Kill the code's process group, then everything still under this supervisor (orphans come
    here: it is their subreaper), and, with a uid of its own, everything that uid runs."""
    _kill_group(pid)
    for _ in range(500):
        if uid is not None:
            _kill_uid(uid)
        for kid in _children(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(kid, signal.SIGKILL)
        _reap()
        if not _children(os.getpid()):
            break
        time.sleep(0.005)


def _kill_uid(uid: int) -> None:
    """kill(-1) as the run's uid: every process of that uid, wherever it hides."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _drop_and_exec(uid: int, argv: list[str]) -> None:
    """Inside bubblewrap (which ran as root): become the run's uid, then the code."""
    _become(uid)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    if sys.argv[1] == "--as":
        _drop_and_exec(int(sys.argv[2]), sys.argv[3:])
    sys.exit(_supervise(Path(sys.argv[1])))
