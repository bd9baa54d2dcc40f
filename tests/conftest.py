"""Shared fixtures: the fixture repositories, discovered once per session."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parent.parent
TRAPS = FIXTURES / "traps"
SAMPLE = ROOT / "examples" / "sample-repo"

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def expected(name: str) -> list[dict]:
    with (FIXTURES / f"{name}.expected.csv").open() as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="session")
def refrepo():
    """tests/fixtures/refrepo parsed: (discovery, extractor, launcher index, CPU references)."""
    from miner.discover import discover
    from miner.extract import Extractor
    from testgen.reference import RepoRefs
    from wrappers.mined import LauncherIndex

    disc = discover(FIXTURES / "refrepo")
    index = LauncherIndex(disc)
    return disc, Extractor(disc), index, RepoRefs(disc, index)


@pytest.fixture(scope="session")
def traps():
    from miner.discover import discover

    return discover(TRAPS)


@pytest.fixture(scope="session")
def sample():
    from miner.discover import discover

    return discover(SAMPLE)


@pytest.fixture(scope="session")
def traps_extractor(traps):
    from miner.extract import Extractor

    return Extractor(traps)


def kernel(disc, name: str, spec: str | None = None):
    found = [
        k
        for k in disc.kernels
        if k.kdef.name == name and (spec is None or k.kdef.specialization == spec)
    ]
    assert found, f"kernel {name} not found"
    return found[0]


def label_of(disc, extractor, index, name: str):
    """The mined wrapper of kernel `name` and the label it renders into."""
    from wrappers.label import render_label
    from wrappers.mined import mine_wrapper

    k = kernel(disc, name)
    w = mine_wrapper(k, extractor, index)
    assert w is not None, name
    return w, render_label(
        cand_id="t",
        kernel=name,
        strategy="mined",
        launcher=w.chain[-1],
        repo_url="r",
        commit="c" * 40,
        file=k.file,
        line=k.line,
        license="MIT",
        includes=w.includes,
        device_code=w.code,
        host_code="",
        functions=w.functions(),
    )


def _pg_tool(name: str) -> str | None:
    """A PostgreSQL server program: on PATH, or where Debian's package puts it."""
    found = shutil.which(name)
    if found:
        return found
    return next((str(p) for p in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None)


def _start_postgres(base: Path) -> tuple[str, callable]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (as `nobody` when we are root)."""
    import os
    import socket
    import subprocess

    run_as = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    data = base / "data"
    base.chmod(0o777)
    if run_as:
        shutil.chown(base, "nobody")
    subprocess.run(
        [
            *run_as,
            _pg_tool("initdb"),
            "-D",
            str(data),
            "-U",
            "kminer",
            "--auth=trust",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = f"-k {base} -p {port} -c listen_addresses=127.0.0.1"
    subprocess.run(
        [
            *run_as,
            _pg_tool("pg_ctl"),
            "-D",
            str(data),
            "-o",
            opts,
            "-l",
            str(base / "log"),
            "-w",
            "start",
        ],
        check=True,
        capture_output=True,
    )

    def stop() -> None:
        subprocess.run(
            [*run_as, _pg_tool("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
        )

    return f"postgresql+psycopg://kminer@127.0.0.1:{port}/postgres", stop


@pytest.fixture(scope="session")
def postgres_url():
    import tempfile

    if _pg_tool("initdb") is None or _pg_tool("pg_ctl") is None:
        pytest.skip("PostgreSQL server binaries not installed (make test installs them)")
    pytest.importorskip("psycopg")
    # not under pytest's tmp dirs: those are private to root, and the server runs as nobody
    base = Path(tempfile.mkdtemp(prefix="kminer-pg-"))
    url, stop = _start_postgres(base)
    yield url
    stop()
    shutil.rmtree(base, ignore_errors=True)


def slow_package(root: Path, name: str, seconds: float) -> Path:
    """A package `name` under `root` whose first submodule takes `seconds` to import and whose
    second holds VALUE = 7 (a package cut off between them is left half made)."""
    return write_tree(
        root / name,
        {
            "__init__.py": "from . import first\nfrom . import second\n",
            "first.py": f"import time\ntime.sleep({seconds})\n",
            "second.py": "VALUE = 7\n",
        },
    )


def write_tree(path: Path, files: dict[str, str | bytes]) -> Path:
    """`files` (relative path: content) written under `path`."""
    path.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        target = path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    return path


def git_repo(path: Path, files: dict[str, str | bytes]) -> Path:
    """A one-commit git repository holding `files`."""
    import git

    write_tree(path, files)
    repo = git.Repo.init(path)
    repo.git.add(A=True)
    repo.index.commit("fixture")
    return path


def mined_labels(repo: Path, work: Path) -> dict:
    """The repository mined into `work` up to its labels (no build: nvcc is not needed), its
    candidates by kernel name."""
    import subprocess
    import sys

    from miner.store import Store

    cmd = [sys.executable, "-m", "miner.cli", "mine", str(repo), "-w", str(work), "--llm", "none"]
    subprocess.run([*cmd, "--stages", "discover,closure,wrap"], check=True, cwd=ROOT)
    store = Store.open(work)
    try:
        return {c.kernel.name: c for c in store.iter_candidates()}
    finally:
        store.close()


def pytest_sessionfinish(session, exitstatus):
    """In CI a skipped test is a failure: `make test` installs every tool a test needs, so a
    skip there means a test that silently stopped testing."""
    import os

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if os.environ.get("CI") and skipped and exitstatus == 0:
        reporter.write_line(f"{len(skipped)} skipped in CI: a skip is a failure here", red=True)
        session.exitstatus = 1
