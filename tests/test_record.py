"""Inputs mined from a repository's own tests, recorded in the sandbox."""

import os
import shutil
from pathlib import Path

from testgen.inputs import RecordedCall, record_repo_calls, repo_test_files
from testgen.sandbox import run_sandboxed

FIXTURE = Path(__file__).parent / "fixtures" / "recrepo"


def test_recorder_captures_extension_calls_with_stubs_for_missing_imports(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo)
    os.environ["KMINER_TEST_SECRET"] = "sk-do-not-leak"
    try:
        monkeypatch.chdir(tmp_path)  # relative paths, as a CLI user gives them
        calls = record_repo_calls(Path("repo"), Path("cache"))
    finally:
        del os.environ["KMINER_TEST_SECRET"]
    scale = calls["scale_forward"]
    # both parametrized shapes, and the second call of each test: assertions were disarmed
    assert [tuple(c.args[0].shape) for c in scale] == [(3,), (3,), (2, 5), (2, 5)]
    assert [c.kwargs["factor"] for c in scale] == [2.0, -1.0, 2.0, -1.0]
    assert scale[2].args[0].flatten().tolist() == [float(i) for i in range(10)]
    assert scale[0].test_file == "tests/test_scale.py"
    # the secret of this process never reached the repository's code
    counted = [c.args[0].tolist() for c in calls["count_positive"]]
    assert counted == [[1.0, -1.0, 2.0], [0.0]]
    assert scale[0].bind(["x", "out", "factor"])["factor"] == 2.0
    assert scale[0].bind(["x", "out"]) is None


def test_recording_is_cached_per_test_file(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo)
    cache = tmp_path / "cache"
    record_repo_calls(repo, cache)
    stamps = {p: p.stat().st_mtime_ns for p in cache.iterdir()}
    again = record_repo_calls(repo, cache, wanted={"scale_forward"})
    assert {p: p.stat().st_mtime_ns for p in cache.iterdir()} == stamps
    assert len(again["scale_forward"]) == 4
    assert repo_test_files(repo) == [repo / "tests" / "test_scale.py"]


def test_sandbox_kills_a_hang_and_reports_a_crash(tmp_path):
    import sys

    hang = run_sandboxed([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert hang.timed_out and hang.returncode is None and hang.seconds < 30
    crash = run_sandboxed(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
        timeout=30,
    )
    assert crash.returncode == -11 and not crash.timed_out
    where = run_sandboxed([sys.executable, "-c", "import os; print(os.getcwd())"], timeout=30)
    assert "kminer-sandbox-" in where.stdout


def test_bind_rejects_calls_that_do_not_fit():
    call = RecordedCall("f", [1, 2], {"c": 3})
    assert call.bind(["a", "b", "c"]) == {"a": 1, "b": 2, "c": 3}
    assert call.bind(["a", "b"]) is None
    assert call.bind(["a", "c", "b"]) is None  # c given twice
