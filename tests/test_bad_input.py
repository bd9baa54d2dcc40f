"""Bad input: one clear line, a non-zero exit where the run cannot go on, and nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import SAMPLE, git_repo
from typer.testing import CliRunner

from miner.cli.app import app

runner = CliRunner()
KERNEL = "__global__ void ok_kernel(float* x) { x[0] = 1.f; }\n"


def one_line_error(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code != 0
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error:")
    return lines[0]


def mine(*args: str):
    return runner.invoke(app, ["mine", *args])


def found(workdir) -> dict[str, dict]:
    res = runner.invoke(app, ["candidates", "--workdir", str(workdir), "--json"])
    return {json.loads(x)["kernel"]: json.loads(x) for x in res.stdout.splitlines() if x.strip()}


def funnel(workdir) -> dict:
    return json.loads(runner.invoke(app, ["stats", "--workdir", str(workdir), "--json"]).stdout)


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("file:///nonexistent/kminer/repo.git", "cannot clone"),
        ("ext::sh -c touch% /tmp/kminer-pwned", "ext::"),
        ("fd::17", "transport"),
        ("http://example.com/x.git", "http"),
        ("--upload-pack=touch /tmp/kminer-pwned", "option"),
    ],
)
def test_unusable_sources(tmp_path, source, words):
    line = one_line_error(mine("--workdir", str(tmp_path / "wd"), "--", source))
    assert words.lower() in line.lower()
    assert not (tmp_path / "wd" / "src").exists()
    assert not __import__("pathlib").Path("/tmp/kminer-pwned").exists()


def test_path_that_is_not_a_repository_or_folder(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    assert "notes.txt" in one_line_error(mine(str(f), "--workdir", str(tmp_path / "wd")))
    assert "does not exist" in one_line_error(
        mine(str(tmp_path / "nope"), "--workdir", str(tmp_path / "wd"))
    )


def test_empty_repository(tmp_path):
    import git

    git.Repo.init(tmp_path / "empty")
    assert "no commits" in one_line_error(
        mine(str(tmp_path / "empty"), "--workdir", str(tmp_path / "wd"))
    )


def test_repository_without_cuda(tmp_path):
    repo = git_repo(tmp_path / "py", {"main.py": "print('hi')\n", "util.cpp": "int f();\n"})
    res = mine(str(repo), "--workdir", str(tmp_path / "wd"), "--llm", "none")
    assert res.exit_code == 0, res.output
    assert "0 kernels" in res.stdout
    assert funnel(tmp_path / "wd")["found"] == 0


def test_bad_files_are_skipped_or_read_tolerantly(tmp_path):
    outside = tmp_path / "outside.cu"
    outside.write_text("__global__ void secret_kernel(int* x) {}\n")
    repo = git_repo(
        tmp_path / "r",
        {
            "ok.cu": KERNEL,
            "blob.cu": b"\x7fELF\x00\x01\x02__global__ void bin_kernel() {}",
            "big.cu": "// padding\n" * 400 + "__global__ void big_kernel(int* x) {}\n",
            "latin.cu": b"// r\xe9sum\xe9 \xff\n"
            b"__global__ void latin_kernel(float* x) { x[0] = 2.f; }\n",
            "broken.cu": "__global__ void split_kernel(float* x)\n#ifdef FAST\n{ x[0] = 0; }\n"
            "#else\n{ x[0] = 1; }\n#endif\n",
        },
    )
    (repo / "link.cu").symlink_to(outside)
    import git

    git.Repo(repo).git.add("link.cu")
    git.Repo(repo).index.commit("a symlink that leaves the tree")
    wd = tmp_path / "wd"
    res = mine(
        str(repo), "--workdir", str(wd), "--stages", "discover,closure", "--max-file-kb", "2"
    )
    assert res.exit_code == 0, res.output
    kernels = found(wd)
    assert set(kernels) == {"ok_kernel", "latin_kernel", "split_kernel"}
    stats = funnel(wd)
    assert stats["files_skipped"] == {"binary": 1, "symlink_outside": 1, "too_large": 1}
    assert stats["invalid_utf8_files"] == 1
    assert stats["parse_fallback"] == 1
    assert kernels["split_kernel"]["stages"]["discover"]["reason"] == "parse_fallback"
    unit = (wd / kernels["latin_kernel"]["unit"]).read_bytes()
    assert b"latin_kernel" in unit


def test_failure_after_success_loses_nothing(tmp_path):
    wd = tmp_path / "wd"
    assert mine(str(SAMPLE), "--workdir", str(wd), "--stages", "discover,closure").exit_code == 0
    before = found(wd)
    line = one_line_error(mine(str(tmp_path / "missing-repo"), "--workdir", str(wd)))
    assert "does not exist" in line
    assert found(wd) == before


def test_unknown_stage_option_and_missing_store(tmp_path):
    assert "unknown stage" in one_line_error(mine(str(SAMPLE), "--stages", "discover,bogus"))
    assert "--bogus" in one_line_error(mine(str(SAMPLE), "--bogus"))
    res = runner.invoke(app, ["stats", "--workdir", str(tmp_path)])
    assert "no kminer store" in one_line_error(res)


def test_console_script_exit_code(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "miner.cli", "mine", "ext::sh", "--workdir", str(tmp_path / "wd")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) == 1
