"""Hostile code against the execution boundary (miner/sandbox.py), on both ways it can be built
here: bubblewrap's namespaces, and the fallback a machine without them gets (a seccomp socket
filter, a uid of its own as root, the subreaper supervisor). Each case runs code that tries
to take a secret, reach the network, write outside, exhaust processes or memory, or outlive its
time limit, and asserts that it was contained. The `gpu` cases run on the H100 through the
device tool: the same boundary with CUDA inside it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import pytest

from miner import sandbox

HERE = Path(__file__).resolve().parent
HOSTILE = HERE / "fixtures" / "runner" / "hostile"
SECRETS = {
    "HF_TOKEN": "hf_kminerTESTsecret1",
    "OPENAI_API_KEY": "sk-kminerTESTsecret2",
    "AWS_SECRET_ACCESS_KEY": "kminerTESTsecret3",
    "GITHUB_TOKEN": "ghp_kminerTESTsecret4",
    "HTTPS_PROXY": "http://kminerTESTsecret5@proxy:3128",
}
PY = sys.executable


def _reachable_python() -> str:
    """An interpreter another uid can run: without bubblewrap, a run as root takes a uid of its
    own only when what it runs is readable by others (a pyenv under /root is not)."""
    for cand in (sys.executable, "/usr/bin/python3"):
        if Path(cand).exists() and sandbox._others_can_read(Path(cand)):
            return cand
    pytest.fail("no interpreter readable by other users (install Debian's python3)")


@pytest.fixture(params=["bwrap", "fallback"])
def mode(request, monkeypatch):
    """The boundary with bubblewrap (what `make test` installs) or without it (a GPU box)."""
    global PY
    if request.param == "fallback":
        monkeypatch.setenv("KMINER_SANDBOX_BWRAP", "0")
        PY = _reachable_python()
    else:
        monkeypatch.delenv("KMINER_SANDBOX_BWRAP", raising=False)
        PY = sys.executable
    sandbox._bwrap_works.cache_clear()
    if request.param == "bwrap" and not sandbox._bwrap_works():
        pytest.fail("bubblewrap does not work here: `make test` installs it (Debian bubblewrap)")
    yield request.param
    sandbox._bwrap_works.cache_clear()
    PY = sys.executable


@pytest.fixture
def contained(monkeypatch):
    """The mode whose containment the bundle's runner gets here with this interpreter: with
    bubblewrap (a GPU box, without it, runs the `gpu` cases below)."""
    monkeypatch.delenv("KMINER_SANDBOX_BWRAP", raising=False)
    sandbox._bwrap_works.cache_clear()
    if not sandbox._bwrap_works():
        pytest.fail("bubblewrap does not work here: `make test` installs it (Debian bubblewrap)")
    return "bwrap"


@pytest.fixture
def secrets(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return SECRETS


def py(code: str, seconds: float = 20, **kw) -> sandbox.Result:
    return sandbox.run([PY, "-c", code], sandbox.Limits(seconds=seconds, **kw))


def alive(mark: str) -> list[int]:
    """Processes of this machine whose command line holds `mark`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if mark in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


# ---------------------------------------------------------------- secrets


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_no_secret_in_the_environment(mode, secrets, name):
    done = py("import os, json; print(json.dumps(dict(os.environ)))")
    env = json.loads(done.stdout)
    assert done.returncode == 0 and name not in env
    assert secrets[name] not in done.stdout
    assert env["HOME"].endswith("/home") and "kminer-run-" in env["HOME"]


def test_a_secret_passed_on_purpose_is_dropped_too(mode):
    done = sandbox.run(
        [PY, "-c", "import os; print(sorted(os.environ))"],
        sandbox.Limits(10),
        env={"KMINER_IMPL": "x", "MY_API_KEY": "k", "SESSION_COOKIE": "c"},
    )
    assert "KMINER_IMPL" in done.stdout and "MY_API_KEY" not in done.stdout
    assert "SESSION_COOKIE" not in done.stdout


def test_the_callers_environment_is_not_readable_through_proc(mode, secrets):
    code = (
        "import os\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit():\n"
        "        try: print(open(f'/proc/{p}/environ', 'rb').read())\n"
        "        except OSError: pass\n"
    )
    done = py(code)
    assert done.returncode == 0
    assert not any(v in done.stdout for v in secrets.values())


def test_a_token_file_in_the_home_folder_is_out_of_reach(mode, tmp_path):
    home = Path.home()
    secret = home / ".kminer-hostile-token"
    secret.write_text("hf_kminerTESTfile")
    secret.chmod(0o600)
    try:
        done = py(f"print(open({str(secret)!r}).read())")
    finally:
        secret.unlink()
    assert done.returncode != 0 and "hf_kminerTESTfile" not in done.stdout + done.stderr


def test_a_checker_answer_that_points_at_a_secret_is_not_read(mode, tmp_path):
    from testgen.sandbox import run_checker

    secret = tmp_path / "secret.txt"
    secret.write_text("kminerTESTsecret6")
    script = tmp_path / "evil_check.py"
    script.write_text(
        f"import os, sys\nos.symlink({str(secret)!r}, sys.argv[-1])\n"  # out.json -> the secret
    )
    problem = run_checker(script, {"x.py": "pass"}, "the check", 20)
    assert isinstance(problem, str) and "kminerTESTsecret6" not in problem
    assert "crashed" in problem


# ---------------------------------------------------------------- network


@pytest.fixture
def listener():
    """A TCP server on 127.0.0.1 that counts the connections it gets."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    got: list[int] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                got.append(1)
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], got
    stop.set()
    thread.join()
    server.close()


def test_no_tcp_to_this_machine(mode, listener):
    port, got = listener
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('IN')"
    done = py(code)
    assert done.returncode != 0 and "IN" not in done.stdout and got == []


def test_no_udp_to_this_machine(mode):
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(1.0)
    port = server.getsockname()[1]
    code = (
        "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"for _ in range(20): s.sendto(b'kminer-out', ('127.0.0.1', {port}))\n"
    )
    py(code)
    with pytest.raises(TimeoutError):
        server.recvfrom(64)
    server.close()


@pytest.mark.parametrize(
    "code",
    [
        "import socket; socket.getaddrinfo('example.com', 443); print('SENT')",
        "import socket; socket.socket(socket.AF_INET6).connect(('::1', 22)); print('SENT')",
        "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print('SENT')",
    ],
    ids=["dns", "ipv6", "raw"],
)
def test_no_other_way_out(mode, code):
    done = py(code)
    assert done.returncode != 0 and "SENT" not in done.stdout


def test_unix_sockets_still_work(mode):
    code = "import socket; a, b = socket.socketpair(); a.send(b'ok'); print(b.recv(2).decode())"
    done = py(code)
    assert done.returncode == 0 and done.stdout.strip() == "ok"


# ---------------------------------------------------------------- files


def test_writes_outside_the_private_dir_fail(mode, tmp_path):
    """Without namespaces a world-writable folder (/tmp) stays writable: only bubblewrap's
    read-only root closes it; the caller's files and the system's are closed either way."""
    target = tmp_path / "store.db"
    target.write_text("the store")
    spot = f"/tmp/kminer-hostile-{os.getpid()}"
    places = [str(target), "/etc/kminer-hostile", *([spot] if mode == "bwrap" else [])]
    code = (
        "import os, pathlib\n"
        f"for p in {places!r}:\n"
        "    try: pathlib.Path(p).write_text('x'); print('WROTE', p)\n"
        "    except OSError as e: print('NO', p)\n"
        "open(os.path.join(os.environ['HOME'], 'mine'), 'w').write('x'); print('HOME ok')\n"
    )
    done = py(code)
    assert "WROTE" not in done.stdout and "HOME ok" in done.stdout
    assert target.read_text() == "the store"
    assert not Path(spot).exists()


def test_the_writable_folder_is_writable_and_nothing_else(mode, tmp_path):
    base = Path(tempfile.mkdtemp())  # under /tmp: other uids can reach it (pytest's is private)
    out, other = base / "out", base / "other"
    out.mkdir()
    other.mkdir()
    base.chmod(0o755)
    code = (
        f"open({str(out / 'a')!r}, 'w').write('x')\n"
        f"try: open({str(other / 'b')!r}, 'w').write('x'); print('OTHER')\n"
        f"except OSError: print('REFUSED')\n"
    )
    done = sandbox.run([PY, "-c", code], sandbox.Limits(10), writable=[out])
    assert (out / "a").read_text() == "x" and "REFUSED" in done.stdout
    assert not (other / "b").exists()
    shutil.rmtree(base)


# ---------------------------------------------------------------- processes and memory


def test_a_fork_bomb_is_bounded_and_leaves_nothing(mode):
    mark = f"kminer-forkbomb-{os.getpid()}"
    code = f"""
import os, time
n = 0
try:
    for _ in range(10000):
        if os.fork() == 0:
            time.sleep(60)  # {mark}
            os._exit(0)
        n += 1
except OSError:
    pass
print('FORKED', n)
"""
    done = sandbox.run([PY, "-c", code], sandbox.Limits(seconds=20, processes=64))
    forked = int(done.stdout.split()[-1])
    assert forked < 64 and done.returncode == 0
    # the sleepers outlived the bomb: the supervisor killed them (bubblewrap's pid namespace
    # takes them with its init before the supervisor looks)
    assert done.left_behind > 0 or mode == "bwrap"
    assert alive(mark) == []


def test_a_tree_whose_processes_come_and_go_while_it_is_watched_still_gets_its_report(mode):
    # the supervisor walks /proc while processes end under it; a child gone between the listing
    # and the read once killed the supervisor (no report, returncode None) about one run in four
    code = """
import os, time
end, live, n = time.monotonic() + 2, 0, 0
while time.monotonic() < end:
    while live < 40:
        if os.fork() == 0:
            time.sleep(0.002 * (n % 10))
            os._exit(0)
        live, n = live + 1, n + 1
    os.wait()
    live -= 1
while live:
    os.wait()
    live -= 1
print('CHURNED', n)
"""
    for _ in range(3):
        done = sandbox.run([PY, "-c", code], sandbox.Limits(seconds=20, watch_rss=True))
        assert done.returncode == 0 and "CHURNED" in done.stdout, (done.notes, done.stderr[-500:])
        assert "no report from the supervisor" not in done.notes


def test_memory_beyond_the_limit_is_refused(mode):
    done = py("x = bytearray(3 << 30); print('GOT')", memory_mb=1024)
    assert "GOT" not in done.stdout and "MemoryError" in done.stderr


def test_gpu_code_is_held_to_its_resident_memory(mode):
    code = "import time; x = bytearray(1 << 30); x[::4096] = b'x' * len(x[::4096]); time.sleep(30)"
    done = sandbox.run([PY, "-c", code], sandbox.Limits(30, memory_mb=256), gpu=True)
    assert done.over_memory and done.returncode is None and done.seconds < 15


def test_file_size_and_cpu_time_are_limited(mode):
    done = sandbox.run(
        ["bash", "-c", 'head -c 50000000 /dev/zero > "$HOME/big"; stat -c %s "$HOME/big"'],
        sandbox.Limits(20, file_mb=10),
    )
    assert done.stdout.strip() == str(10 << 20)
    spin = py("while True: pass", seconds=60, cpu_seconds=2)
    assert spin.returncode in (-24, 152) and spin.seconds < 20  # SIGXCPU


# ---------------------------------------------------------------- time and the process tree


@pytest.mark.parametrize("code", ["while True: pass", "import time; time.sleep(600)"])
def test_the_time_limit_holds_within_two_seconds(mode, code):
    done = py(code, seconds=2)
    assert done.timed_out and done.returncode is None
    assert done.seconds < 2 + sandbox.GRACE_S


def test_a_setsid_grandchild_holding_the_output_does_not_hold_the_caller(mode):
    mark = f"kminer-held-{os.getpid()}"
    script = f"setsid bash -c 'sleep 300; echo {mark}' & echo started"
    start = time.monotonic()
    done = sandbox.run(["bash", "-c", script], sandbox.Limits(30))
    assert done.returncode == 0 and "started" in done.stdout
    assert time.monotonic() - start < 5
    assert alive(mark) == []


def test_a_setsid_grandchild_dies_at_the_time_limit(mode):
    mark = f"kminer-late-{os.getpid()}"
    script = f"setsid bash -c 'sleep 300; echo {mark}' & sleep 300"
    done = sandbox.run(["bash", "-c", script], sandbox.Limits(2))
    assert done.timed_out and done.seconds < 2 + sandbox.GRACE_S
    assert alive(mark) == []


def test_a_double_forked_daemon_is_ended(mode):
    mark = f"kminer-daemon-{os.getpid()}"
    code = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(300)  # {mark}
    os._exit(0)
print('parent done')
"""
    done = py(code)
    assert done.returncode == 0 and alive(mark) == []


def test_stop_ends_a_run_from_another_thread(mode):
    pids: list[int] = []
    timer = threading.Timer(1.0, lambda: [sandbox.stop(p) for p in pids])
    timer.start()
    start = time.monotonic()
    done = sandbox.run(
        [PY, "-c", "import time; time.sleep(300)"], sandbox.Limits(300), on_start=pids.append
    )
    assert done.stopped and time.monotonic() - start < 5


# ---------------------------------------------------------------- through the bundle's runner


def _hostile_bundle(root: Path, entries: dict[str, str]) -> Path:
    """A bundle whose tests are hostile (fixtures/runner/hostile): id -> the `// hostile:` line."""
    from test_runner import make_bundle

    labels = root.parent / f"{root.name}-labels"
    labels.mkdir(parents=True)
    spec = []
    for eid, line in entries.items():
        label = labels / f"{eid}.cu"
        label.write_text(f"// kminer label {eid}\n// hostile: {line}\n__global__ void k() {{}}\n")
        spec.append({"id": eid, "label": label})
    ref = HERE / "fixtures" / "runner" / "fake" / "ref.cpp"
    return make_bundle(root, HOSTILE / "hostile_check.py", ref, spec)


def test_hostile_tests_under_the_runner_are_contained(contained, secrets, listener, tmp_path):
    _hostile_runner_run(secrets, listener, tmp_path)


@pytest.mark.gpu
def test_hostile_tests_under_the_runner_on_a_gpu_box(secrets, listener, tmp_path):
    """The same, with whatever this machine gives (a GPU box has no bubblewrap)."""
    base = Path(tempfile.mkdtemp())  # other uids can reach it (pytest's tmp_path is private)
    base.chmod(0o755)
    _hostile_runner_run(secrets, listener, base)
    shutil.rmtree(base, ignore_errors=True)


def _hostile_runner_run(secrets, listener, tmp_path):
    from test_runner import run_py

    port, got = listener
    mark = f"kminer-runner-daemon-{os.getpid()}"
    outside = tmp_path / "outside.txt"
    entries = {
        "secrets": f"secrets files={Path.home() / '.netrc'}",
        "network": f"network port={port}",
        "daemon": f"daemon mark={mark}",
        "fork": "fork",
        "outside": f"outside path={outside}",
    }
    bundle = _hostile_bundle(tmp_path / "b", entries)
    proc = run_py(bundle, "--out", "results.json", "--jobs", "2", "--run-timeout", "60")
    assert proc.returncode == 0, proc.stderr
    text = (bundle / "results.json").read_text()
    results = json.loads(text)["entries"]
    assert not any(v in text for v in secrets.values())
    assert "uid of its own" in json.loads(text)["sandbox"]["processes"]  # as root: not root
    assert os.geteuid() != 0 or "UID 0 " not in results["secrets"]["log_tail"]
    assert "UID " in results["secrets"]["log_tail"]
    assert got == [] and "NETWORK refused" in results["network"]["log_tail"]
    assert alive(mark) == [] and results["daemon"]["phase"] == "run"  # it ran, and ended
    fork = results["fork"]  # bounded by the process limit, or ended by the memory watch
    said = fork["log_tail"].split("FORKED ")
    assert int(said[1].split()[0]) < 600 if len(said) > 1 else "memory limit" in fork["detail"]
    assert not outside.exists() and "OUTSIDE refused" in results["outside"]["log_tail"]


def test_a_hanging_hostile_test_times_out_with_its_tree(contained, tmp_path):
    from test_runner import run_py

    bundle = _hostile_bundle(tmp_path / "b", {"hang": "hang"})
    start = time.monotonic()
    proc = run_py(bundle, "--out", "results.json", "--run-timeout", "3")
    assert proc.returncode == 0, proc.stderr
    entry = json.loads((bundle / "results.json").read_text())["entries"]["hang"]
    assert entry["outcome"] == "timeout" and time.monotonic() - start < 60
    assert alive(str(bundle / "tests" / "hang.py")) == []


# ---------------------------------------------------------------- on the GPU (device tool)


@pytest.mark.gpu
def test_gpu_code_runs_inside_the_boundary_without_secrets(secrets):
    code = (
        "import os, torch\n"
        "x = torch.ones(1 << 20, device='cuda')\n"
        "print('SUM', int(x.sum().item()), os.getuid(), sorted(os.environ))\n"
    )
    done = sandbox.run([PY, "-c", code], sandbox.Limits(120), gpu=True)
    assert done.returncode == 0, done.stderr
    assert f"SUM {1 << 20}" in done.stdout
    assert not any(v in done.stdout for v in secrets.values())
    assert "HF_TOKEN" not in done.stdout


@pytest.mark.gpu
def test_gpu_code_over_its_memory_is_ended():
    code = "import torch, time; x = torch.empty(3 << 30, dtype=torch.uint8).fill_(1); time.sleep(9)"
    done = sandbox.run([PY, "-c", code], sandbox.Limits(60, memory_mb=1024), gpu=True)
    assert done.over_memory and done.seconds < 30


@pytest.mark.gpu
def test_gpu_code_cannot_reach_the_network_or_leave_a_daemon(listener):
    port, got = listener
    mark = f"kminer-gpu-daemon-{os.getpid()}"
    code = f"""
import os, socket, subprocess, sys, torch
torch.ones(8, device='cuda').sum().item()
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)  # {mark}'],
                 start_new_session=True)
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=3); print('IN')
except OSError:
    print('OUT')
"""
    done = sandbox.run([PY, "-c", code], sandbox.Limits(120), gpu=True)
    assert "OUT" in done.stdout and got == [] and alive(mark) == []


def test_a_bundle_carries_bubblewrap_to_a_box_without_it(contained, listener, tmp_path):
    """A GPU box without bubblewrap uses the one the bundle carries (bin/bwrap beside run.py)."""
    from test_runner import _candidates

    from testgen.bundle import write_bundle

    info = write_bundle(tmp_path / "work", _candidates(tmp_path / "work"), tmp_path / "v.tar.gz")
    with tarfile.open(info.path) as tar:
        tar.extractall(tmp_path / "box", filter="data")
    bundle = tmp_path / "box" / "v"
    assert os.access(bundle / "bin" / "bwrap", os.X_OK)
    port, got = listener
    code = (
        "import json, socket, sys; sys.path.insert(0, sys.argv[1]); import sandbox\n"
        "print('TOOL', sandbox.bwrap_tool()); print('SAYS', json.dumps(sandbox.describe()))\n"
        f"code = 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=3)'\n"
        "done = sandbox.run([sys.executable, '-c', code], sandbox.Limits(30))\n"
        "print('NET', done.returncode, done.notes)\n"
    )
    nobwrap = {"PATH": str(Path(sys.executable).parent)}  # no bwrap on this PATH
    proc = subprocess.run(
        [sys.executable, "-c", code, str(bundle)], env=nobwrap, capture_output=True, text=True
    )
    assert f"TOOL {bundle / 'bin' / 'bwrap'}" in proc.stdout, proc.stderr
    assert "network namespace (bubblewrap)" in proc.stdout
    assert "NET 1 ['bwrap'" in proc.stdout and got == []
    # run.py names its bubblewrap even where a kminer install shadows the bundle's sandbox.py
    kminer = {**nobwrap, "PYTHONPATH": str(HERE.parent)}
    argv = [sys.executable, "run.py", "--out", "r.json", "--only", "a", "--no-prebuild"]
    done = subprocess.run(argv, cwd=bundle, env=kminer, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    said = json.loads((bundle / "r.json").read_text())
    assert said["sandbox"]["network"] == "network namespace (bubblewrap)"
    assert said["entries"]["a"]["outcome"] == "pass"


def test_describe_says_what_this_machine_gives(mode):
    said = sandbox.describe()
    assert set(said) == {"network", "files", "processes", "tree"}
    if mode == "bwrap":
        assert "namespace" in said["network"] and "read-only" in said["files"]
    else:
        assert "socket filter" in said["network"]
    assert shutil.which("bash")
