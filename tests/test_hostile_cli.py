"""Hostile command lines: each is refused before any work with one `error:` line on stderr and
nothing else, exit 2 for a bad option value and 1 for a bad situation, no traceback, and the
workdir it was aimed at exactly as it was. Credentials never reach the store or the log, and a
clone that fails or is interrupted leaves no staging folder behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLE, git_repo
from typer.testing import CliRunner

from miner.cli.app import app

runner = CliRunner()
KERNEL = "__global__ void ok_kernel(float* x) { x[0] = 1.f; }\n"
SECRET = "s3cret"


@pytest.fixture(scope="module")
def mined(tmp_path_factory) -> Path:
    """A workdir with a store: what every refused command must leave untouched."""
    wd = tmp_path_factory.mktemp("hostile") / "wd"
    res = invoke("mine", str(SAMPLE), "-w", str(wd), "--stages", "discover", "--llm", "none")
    assert res.exit_code == 0, res.output
    return wd


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("not a workdir")
    return path


def invoke(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, list(args), env=env)


def one_error_line(res, code: int) -> str:
    """The refusal's only output: one `error: ` line on stderr, the exit code, no traceback."""
    assert res.exit_code == code, res.output
    assert isinstance(res.exception, SystemExit), res.exception  # not an escaped exception
    assert "Traceback" not in res.output
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def snapshot(wd: Path) -> tuple[dict, list]:
    """Every row of the store, and every other file of the workdir with its size."""
    with closing(sqlite3.connect(wd / "kminer.db")) as db:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        rows = {t: sorted(map(repr, db.execute(f'SELECT * FROM "{t}"'))) for t in tables}
    files = sorted(
        (str(p.relative_to(wd)), p.stat().st_size)
        for p in wd.rglob("*")
        if p.is_file() and not p.name.startswith("kminer.db")
    )
    return rows, files


def store_rows(wd: Path, sql: str) -> list[tuple]:
    with closing(sqlite3.connect(wd / "kminer.db")) as db:
        return db.execute(sql).fetchall()


def everything_recorded(wd: Path) -> str:
    """The store's rows and the log, as text: where a leaked credential would show."""
    return repr(snapshot(wd)[0]) + (wd / "logs" / "kminer.log").read_text()


# --workdir naming a file (or a path under one), for every command that takes it ------------
WORKDIR_USERS = [
    ["mine", str(SAMPLE), "--llm", "none"],
    ["wrap"],
    ["build"],
    ["testgen"],
    ["candidates"],
    ["stats"],
    ["bundle", "--out", "{tmp}/b.tar.gz"],
    ["ingest", "{file}"],
    ["verify"],
    ["serve", "--port", "8765"],
    ["curator", "add", "bob"],
    ["curator", "list"],
    ["curator", "revoke", "bob"],
]


@pytest.mark.parametrize("under", [False, True], ids=["file", "under-file"])
@pytest.mark.parametrize("argv", WORKDIR_USERS, ids=lambda a: "-".join(a[:2]).split("/")[0])
def test_workdir_that_is_a_file(tmp_path, a_file, argv, under):
    workdir = a_file / "sub" if under else a_file
    args = [a.format(tmp=tmp_path, file=a_file) for a in argv]
    line = one_error_line(invoke(*args, "--workdir", str(workdir)), 2)
    assert "--workdir" in line and f"{a_file} " in line and "not a directory" in line
    assert a_file.read_text() == "not a workdir"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


# bad option values on a real workdir: refused at parse time, the store untouched -------------
BAD_VALUES = [
    (["mine", "{sample}", "--jobs", "-1"], "--jobs"),
    (["mine", "{sample}", "-j", "-3"], "--jobs"),
    (["mine", "{sample}", "--build-jobs", "0"], "--build-jobs"),
    (["mine", "{sample}", "--batch-size", "0"], "--batch-size"),
    (["mine", "{sample}", "--max-attempts", "0"], "--max-attempts"),
    (["mine", "{sample}", "--max-file-kb", "-1"], "--max-file-kb"),
    (["mine", "{sample}", "--max-file-kb", "0"], "--max-file-kb"),
    (["mine", "{sample}", "--compile-timeout", "0"], "--compile-timeout"),
    (["mine", "{sample}", "--compile-timeout", "-5"], "--compile-timeout"),
    (["mine", "{sample}", "--stages", ","], "names no stage"),
    (["mine", "{sample}", "--stages", " , "], "names no stage"),
    (["mine", "{sample}", "--stages", "discover,closure,discover"], "discover more than once"),
    (["mine", "{sample}", "--stages", "discover,bogus"], "unknown stage 'bogus'"),
    (["mine", "{sample}", "--filter", ""], "--filter"),
    (["mine", "{sample}", "--db", "not a url"], "--db"),
    (["mine", "{sample}", "--llm", "bogus"], "--llm"),
    (["wrap", "--max-attempts", "0"], "--max-attempts"),
    (["wrap", "--filter", ""], "--filter"),
    (["build", "--build-jobs", "0"], "--build-jobs"),
    (["build", "--batch-size", "-2"], "--batch-size"),
    (["build", "--filter", " "], "--filter"),
    (["testgen", "--max-attempts", "0"], "--max-attempts"),
    (["testgen", "--filter", ""], "--filter"),
    (["candidates", "--filter", ""], "--filter"),
    (["stats", "--db", "nosuchdialect://x"], "nosuchdialect"),
    (["bundle", "--out", "{wd}"], "is a directory"),
    (["bundle", "--out", "{tmp}/b.tgz", "--filter", ""], "--filter"),
    (["verify", "--jobs", "-1"], "--jobs"),
    (["verify", "--gpu-jobs", "-1"], "--gpu-jobs"),
    (["verify", "--build-timeout", "0"], "--build-timeout"),
    (["verify", "--run-timeout", "-1"], "--run-timeout"),
    (["verify", "--filter", ""], "--filter"),
    (["verify", "--only", "nope1,nope2"], "nope1, nope2"),
    (["verify", "--only", ","], "--only names no candidate"),
    (["serve", "--port", "0"], "between 1 and 65535"),
    (["serve", "--port", "99999"], "between 1 and 65535"),
    (["serve", "--port", "-1"], "between 1 and 65535"),
    (["serve", "--port", "80x"], "--port"),
    (["serve", "--host", "192.0.2.1", "--port", "8765"], "192.0.2.1"),
    (["curator", "add", "bob", "--db", "::"], "--db"),
]


@pytest.mark.parametrize(
    ("argv", "words"), BAD_VALUES, ids=lambda v: " ".join(v) if isinstance(v, list) else None
)
def test_bad_option_value(mined, tmp_path, argv, words):
    before = snapshot(mined)
    args = [a.format(sample=SAMPLE, wd=mined, tmp=tmp_path) for a in argv]
    line = one_error_line(invoke(*args, "--workdir", str(mined)), 2)
    assert words in line
    assert snapshot(mined) == before
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["mine", "{tmp}/[/x]", "-w", "{tmp}/wd"], 1),
        (["mine", str(SAMPLE), "--stages", "[/x],[bold]", "-w", "{tmp}/wd"], 2),
        (["stats", "-w", "{tmp}/[/x]"], 1),
        (["verify", "-w", "{wd}", "--only", "[/x]"], 2),
        (["stats", "--bogus[/x]"], 2),
    ],
    ids=["repo", "stages", "workdir", "only", "option"],
)
def test_brackets_are_quoted_not_read_as_markup(mined, tmp_path, argv, code):
    args = [a.format(tmp=tmp_path, wd=mined) for a in argv]
    line = one_error_line(invoke(*args), code)
    assert "[/x]" in line


def test_secret_db_url_is_not_echoed():
    res = invoke("stats", "--db", f"nosuchdialect://user:{SECRET}@host/db")
    assert SECRET not in one_error_line(res, 2)


def test_taken_port_is_a_bad_situation(mined):
    before = snapshot(mined)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        res = invoke("serve", "--workdir", str(mined), "--host", "127.0.0.1", "--port", port)
        line = one_error_line(res, 1)
    assert f"127.0.0.1:{port}" in line and "in use" in line
    assert snapshot(mined) == before


@pytest.mark.parametrize(
    ("db", "shown"),
    [
        ("sqlite:////nonexistent-kminer/dir/x.db", "unable to open"),
        (f"postgresql+psycopg://user:{SECRET}@127.0.0.1:1/db", "user:***@127.0.0.1:1"),
    ],
    ids=["sqlite-nowhere", "postgres-closed-port"],
)
@pytest.mark.parametrize("command", ["stats", "candidates", "curator list"])
def test_unreachable_database_is_a_bad_situation(db, shown, command):
    if db.startswith("postgresql"):
        pytest.importorskip("psycopg")
    line = one_error_line(invoke(*command.split(), "--db", db), 1)
    assert line.startswith("error: cannot open the store ") and shown in line
    assert SECRET not in line


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--port", "99999", "--workdir", "{wd}"],
        ["mine", str(SAMPLE), "--workdir", "{file}"],
        ["stats", "--workdir", "{file}/sub"],
    ],
    ids=["serve-port", "mine-workdir", "stats-workdir"],
)
def test_real_process_refuses_in_one_line(mined, a_file, argv):
    args = [a.format(wd=mined, file=a_file) for a in argv]
    before = snapshot(mined)
    proc = subprocess.run(
        [sys.executable, "-m", "miner.cli", *args], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert snapshot(mined) == before


# credentials --------------------------------------------------------------------------------
@pytest.mark.parametrize("userinfo", [f"user:{SECRET}@", f"{SECRET}@"], ids=["password", "token"])
def test_credentials_stay_out_of_store_and_log(tmp_path, userinfo):
    up = git_repo(tmp_path / "up", {"k.cu": KERNEL})
    wd = tmp_path / "wd"
    res = invoke("mine", f"file://{userinfo}localhost{up}", "-w", str(wd), "--stages", "discover")
    assert res.exit_code == 0, res.output
    assert SECRET not in res.output
    assert store_rows(wd, "SELECT command, status FROM runs") == [
        (f"mine file://localhost{up}", "ok")
    ]
    assert store_rows(wd, "SELECT url FROM repos") == [(f"file://localhost{up}",)]
    assert SECRET not in everything_recorded(wd)
    assert "ok_kernel" in invoke("candidates", "-w", str(wd), "--json").stdout


@pytest.fixture
def failing_ssh(tmp_path) -> dict[str, str]:
    """An ssh that refuses at once, as a closed port does: no network is ever touched."""
    ssh = tmp_path / "ssh"
    ssh.write_text(
        '#!/bin/sh\n[ "$1" = -G ] && exit 0\n'
        'echo "ssh: connect to host nohost port 22: Connection refused" >&2\nexit 255\n'
    )
    ssh.chmod(0o755)
    return {"GIT_SSH": str(ssh), "GIT_SSH_COMMAND": None}  # None: unset


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"https://user:{SECRET}@127.0.0.1:1/x.git", "https://127.0.0.1:1/x.git"),
        (f"https://{SECRET}@127.0.0.1:1/x.git", "https://127.0.0.1:1/x.git"),
        (f"ssh://git:{SECRET}@nohost/x.git", "ssh://git@nohost/x.git"),
    ],
    ids=["https-password", "https-token", "ssh-password"],
)
def test_credentials_of_a_failed_clone(tmp_path, failing_ssh, url, shown):
    wd = tmp_path / "wd"
    line = one_error_line(invoke("mine", url, "-w", str(wd), env=failing_ssh), 1)
    assert line.startswith(f"error: cannot clone {shown}: ") and SECRET not in line
    assert store_rows(wd, "SELECT command, status FROM runs") == [(f"mine {shown}", "failed")]
    assert SECRET not in everything_recorded(wd)
    assert not list(wd.glob(".src-partial-*")) and not (wd / "src").exists()


def test_refused_url_with_credentials(tmp_path):
    wd = tmp_path / "wd"
    line = one_error_line(
        invoke("mine", f"http://user:{SECRET}@example.com/x.git", "-w", str(wd)), 1
    )
    assert "http://example.com/x.git" in line and SECRET not in line
    assert not wd.exists()  # refused before the workdir was touched


# clones that fail or are interrupted ---------------------------------------------------------
@pytest.mark.parametrize("how", ["bad-ref", "missing-repo"])
def test_failed_clone_leaves_no_staging(tmp_path, how):
    up = git_repo(tmp_path / "up", {"k.cu": KERNEL})
    wd = tmp_path / "wd"
    argv = {
        "bad-ref": [str(up), "--ref", "no-such-branch"],
        "missing-repo": [f"file://{tmp_path}/missing.git"],
    }[how]
    line = one_error_line(invoke("mine", *argv, "-w", str(wd)), 1)
    assert "not found" in line or "cannot clone" in line
    left = {p.name for p in wd.iterdir() if not p.name.startswith("kminer.db")}
    assert left == {"logs"}  # no src, no .src-partial-*


GATED_SSH = """#!/bin/sh
# ssh stand-in: serves the repository from this machine, once {gate} is gone
[ "$1" = -G ] && exit 0
touch {started}
while [ -e {gate} ]; do sleep 0.05; done
for last; do :; done
exec sh -c "$last"
"""


def _interruptible() -> None:
    """kminer as a terminal starts it: SIGINT delivered and handled. A test worker may have
    it ignored or blocked by code that ran in it before (both are inherited across exec), and
    the Ctrl-C this test sends would then never reach kminer."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize("to", ["group", "process"], ids=["ctrl-c", "sigint-to-kminer"])
def test_interrupted_clone_leaves_nothing_and_rerun_resumes(tmp_path, to):
    up = git_repo(tmp_path / "up", {"k.cu": KERNEL})
    gate, started, ssh = tmp_path / "gate", tmp_path / "started", tmp_path / "ssh"
    gate.touch()
    ssh.write_text(GATED_SSH.format(gate=gate, started=started))
    ssh.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "GIT_SSH_COMMAND"} | {"GIT_SSH": str(ssh)}
    wd = tmp_path / "wd"
    url = f"ssh://git:{SECRET}@fakehost{up}"
    argv = [sys.executable, "-m", "miner.cli", "mine", url, "-w", str(wd), "--stages", "discover"]
    proc = subprocess.Popen(
        [*argv, "--llm", "none"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_interruptible,
    )
    deadline = time.monotonic() + 60
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), proc.communicate()
    assert list(wd.glob(".src-partial-*")), "the clone is under way"
    if to == "group":  # what Ctrl-C in a terminal does
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    gate.unlink()
    assert proc.returncode == 130, stderr
    assert SECRET not in stdout + stderr
    assert [ln for ln in stderr.splitlines() if ln.strip()] == [
        "error: interrupted; finished work is saved, rerun the same command to resume"
    ]
    assert not list(wd.glob(".src-partial-*")) and not (wd / "src").exists()
    shown = f"mine ssh://git@fakehost{up}"
    assert store_rows(wd, "SELECT command, status FROM runs") == [(shown, "interrupted")]

    rerun = subprocess.run([*argv, "--llm", "none"], cwd=ROOT, env=env, capture_output=True)
    assert rerun.returncode == 0, rerun.stderr
    rows = store_rows(wd, "SELECT command, status FROM runs ORDER BY id")
    assert rows == [(shown, "interrupted"), (shown, "ok")]
    found = invoke("candidates", "-w", str(wd), "--json").stdout.splitlines()
    assert [json.loads(x)["kernel"] for x in found] == ["ok_kernel"]
    assert not list(wd.glob(".src-partial-*"))
    assert SECRET not in everything_recorded(wd)


def test_staging_left_by_a_killed_run_is_removed(tmp_path):
    up = git_repo(tmp_path / "up", {"k.cu": KERNEL})
    wd = tmp_path / "wd"
    gone = subprocess.Popen(["true"])
    gone.wait()
    busy = f".src-partial-{os.getpid()}-busy"  # a run still alive: another clone under way
    for name in (f".src-partial-{gone.pid}-x1", ".src-partial-old", busy):
        (wd / name / "src" / ".git").mkdir(parents=True)
        (wd / name / "src" / "k.cu").write_text("half")
    res = invoke("mine", str(up), "-w", str(wd), "--stages", "discover", "--llm", "none")
    assert res.exit_code == 0, res.output
    assert [p.name for p in wd.glob(".src-partial-*")] == [busy]
    assert (wd / "src" / "k.cu").read_text() == KERNEL
