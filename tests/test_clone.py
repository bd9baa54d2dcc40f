"""fetch_repo: every way a repository reaches the disk, and every way that must be refused."""

import os
import shutil
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from git import GitCommandError, Repo

from miner import clone, gitsafe
from miner.clone import fetch_repo, folder_commit, validate_source
from miner.errors import BadInput

MIT = (
    "MIT License\n\nPermission is hereby granted, free of charge, to any person obtaining a copy\n"
)


@pytest.fixture(autouse=True)
def isolated_git(tmp_path_factory, monkeypatch):
    """No user or system git config, no inherited template: each test states what it wants."""
    base = tmp_path_factory.mktemp("gitcfg")
    (base / "no-template").mkdir()  # repos made by tests get no sample hooks: fewer files
    cfg = base / "gitconfig"
    cfg.write_text(
        f"[user]\n\tname = T\n\temail = t@example.com\n[init]\n\tdefaultBranch = main\n"
        f"\ttemplateDir = {base / 'no-template'}\n"
        '[protocol "file"]\n\tallow = always\n'
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(cfg))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for var in ("GIT_TEMPLATE_DIR", "GIT_DIR", "GIT_WORK_TREE", "GIT_ALLOW_PROTOCOL"):
        monkeypatch.delenv(var, raising=False)
    return cfg


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def commit(repo: Path, files: dict[str, str], msg: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", msg)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def up_template(tmp_path_factory) -> SimpleNamespace:
    """main: c1 (tag v1, annotated) -> c2; feature: c1 -> c3. Built once, copied per test."""
    base = tmp_path_factory.mktemp("template")
    (base / "empty").mkdir()
    path = base / "up"
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TEMPLATE_DIR": str(base / "empty"),
    }

    def run(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=T", "-c", "user.email=t@example.com", *args],
            cwd=path,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def commit_(files: dict[str, str], msg: str) -> str:
        for name, text in files.items():
            (path / name).write_text(text)
        run("add", "-A")
        run("commit", "-q", "-m", msg)
        return run("rev-parse", "HEAD")

    path.mkdir()
    run("init", "-q", "-b", "main")
    c1 = commit_({"LICENSE": MIT, "a.cu": "one"}, "c1")
    run("tag", "-a", "v1", "-m", "v1")
    c2 = commit_({"a.cu": "two"}, "c2")
    run("checkout", "-q", "-b", "feature", c1)
    c3 = commit_({"b.cu": "three"}, "c3")
    run("checkout", "-q", "main")
    run("gc", "-q")  # packed: every copy and clone of it is a handful of files
    return SimpleNamespace(path=path, c1=c1, c2=c2, c3=c3)


@pytest.fixture
def up(up_template, tmp_path) -> SimpleNamespace:
    path = tmp_path / "up"
    shutil.copytree(up_template.path, path, symlinks=True)
    return SimpleNamespace(**{**vars(up_template), "path": path, "url": f"file://{path}"})


def one_line_error(excinfo) -> str:
    msg = str(excinfo.value)
    assert msg and "\n" not in msg
    return msg


def test_clone_of_work_tree_repo(up, tmp_path):
    src = fetch_repo(str(up.path), tmp_path / "w")
    assert (src.kind, src.commit, src.ref) == ("git_dir", up.c2, "")
    assert src.url == str(up.path.resolve())
    assert src.root == tmp_path / "w" / "src"
    assert (src.root / "a.cu").read_text() == "two"
    assert (src.license, src.license_file) == ("MIT", "LICENSE")
    assert git(src.root, "config", "core.hooksPath") == "/dev/null"
    hooks = src.root / ".git" / "hooks"
    assert not hooks.exists() or not any(hooks.iterdir())  # empty template: no sample hooks
    assert not any(p.name.startswith(".src-partial") for p in (tmp_path / "w").iterdir())


def test_clone_of_bare_repo_and_relative_path(up, tmp_path, monkeypatch):
    git(tmp_path, "clone", "-q", "--bare", str(up.path), "bare.git")
    monkeypatch.chdir(tmp_path)
    src = fetch_repo("bare.git", tmp_path / "w")
    assert (src.kind, src.commit, src.url) == ("git_dir", up.c2, str(tmp_path / "bare.git"))
    assert (src.root / "a.cu").read_text() == "two"


def test_file_url_is_shallow(up, tmp_path):
    src = fetch_repo(up.url, tmp_path / "w")
    assert (src.kind, src.commit, src.url) == ("url", up.c2, up.url)
    assert (src.root / ".git" / "shallow").exists()
    assert git(src.root, "rev-list", "--count", "HEAD") == "1"


@pytest.mark.parametrize("how", ["path", "file"])
@pytest.mark.parametrize(
    "ref, want, present",
    [
        ("feature", "c3", "b.cu"),
        ("v1", "c1", "a.cu"),
        ("c1", "c1", "a.cu"),
        ("c3-short", "c3", "b.cu"),
    ],
)
def test_ref_kinds(up, tmp_path, how, ref, want, present):
    name = {"c1": up.c1, "c3-short": up.c3[:8]}.get(ref, ref)
    src = fetch_repo(str(up.path) if how == "path" else up.url, tmp_path / "w", ref=name)
    assert src.commit == getattr(up, want)
    assert git(src.root, "rev-parse", "HEAD") == getattr(up, want)
    assert src.ref == name
    assert (src.root / present).exists()
    assert (src.root / "a.cu").read_text() == "one"


def test_full_sha_over_url_is_fetched_shallow(up, tmp_path):
    src = fetch_repo(up.url, tmp_path / "w", ref=up.c1)
    assert src.commit == up.c1
    assert git(src.root, "rev-list", "--count", "HEAD") == "1"


def test_full_sha_refused_by_server_falls_back_to_full_clone(up, tmp_path, isolated_git):
    # protocol v0 servers refuse unadvertised SHAs, as many hosts do
    with isolated_git.open("a") as fh:
        fh.write("[protocol]\n\tversion = 0\n")
    src = fetch_repo(up.url, tmp_path / "w", ref=up.c1)
    assert src.commit == up.c1
    assert not (src.root / ".git" / "shallow").exists()


def test_plain_folder_inside_a_git_tree(tmp_path):
    outer = tmp_path / "outer"
    Repo.init(outer).close()
    folder = outer / "examples" / "sample"
    (folder / "csrc").mkdir(parents=True)
    (folder / "csrc" / "k.cu").write_text("__global__ void k() {}\n")
    (folder / "LICENSE").write_text(MIT)
    commit(outer, {"README": "outer"}, "outer")
    src = fetch_repo(str(folder), tmp_path / "w")
    assert (src.kind, src.root, src.url) == ("folder", folder, str(folder))
    assert src.commit.startswith("folder-") and len(src.commit) == len("folder-") + 40
    assert src.license == "MIT"
    assert not (tmp_path / "w" / "src").exists()  # never copied
    assert fetch_repo(str(folder), tmp_path / "w").commit == src.commit
    (folder / "csrc" / "k.cu").write_text("__global__ void k(int) {}\n")
    changed = fetch_repo(str(folder), tmp_path / "w").commit
    assert changed != src.commit
    (folder / "csrc" / "k.cu").rename(folder / "csrc" / "k2.cu")  # same bytes, new name
    assert folder_commit(folder) != changed


def test_folder_commit_skips_git_big_files_and_workdir(tmp_path, monkeypatch):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "k.cu").write_text("x")
    before = folder_commit(folder, exclude=folder / "work")
    (folder / "work").mkdir()
    (folder / "work" / "db").write_text("run 1")
    (folder / "vendor" / ".git").mkdir(parents=True)
    (folder / "vendor" / ".git" / "HEAD").write_text("ref")
    monkeypatch.setattr(clone, "MAX_HASHED_BYTES", 10)
    (folder / "big.bin").write_text("more than ten bytes")
    (folder / "link.cu").symlink_to("k.cu")  # not a regular file
    assert folder_commit(folder, exclude=folder / "work") == before
    (folder / "small.cu").write_text("y")
    assert folder_commit(folder, exclude=folder / "work") != before


def test_folder_with_ref_is_refused(tmp_path):
    (tmp_path / "f").mkdir()
    with pytest.raises(BadInput, match="plain folder") as exc:
        fetch_repo(str(tmp_path / "f"), tmp_path / "w", ref="main")
    one_line_error(exc)


def test_rerun_reuses_clone_without_fetching(up, tmp_path, monkeypatch):
    first = fetch_repo(str(up.path), tmp_path / "w", ref="v1")
    inode = (first.root / ".git").stat().st_ino

    def no_network(*a, **k):
        raise AssertionError("rerun must not clone or fetch")

    monkeypatch.setattr(clone, "_clone", no_network)
    monkeypatch.setattr("git.remote.Remote.fetch", no_network)
    for ref in ("v1", up.c1, up.c1[:7], None):
        again = fetch_repo(str(up.path), tmp_path / "w", ref=ref)
        assert again.commit == up.c1 and again.root == first.root
    assert (first.root / ".git").stat().st_ino == inode
    # a commit the clone already has is checked out without asking the remote
    assert fetch_repo(str(up.path), tmp_path / "w", ref=up.c3).commit == up.c3
    assert (first.root / "b.cu").exists()


def test_rerun_of_url_works_with_source_gone_and_switches_ref(up, tmp_path):
    first = fetch_repo(up.url, tmp_path / "w")
    inode = (first.root / ".git").stat().st_ino
    moved = up.path.rename(tmp_path / "moved")
    assert fetch_repo(up.url, tmp_path / "w").commit == up.c2  # no network: source is gone
    moved.rename(up.path)
    assert fetch_repo(up.url, tmp_path / "w", ref="v1").commit == up.c1
    assert fetch_repo(up.url, tmp_path / "w", ref=up.c3[:10]).commit == up.c3  # short SHA
    assert (first.root / "b.cu").exists()
    assert (first.root / ".git").stat().st_ino == inode  # switched in place, never re-cloned


def test_rerun_with_new_ref_switches_local_clone(up, tmp_path):
    first = fetch_repo(str(up.path), tmp_path / "w")
    commit(up.path, {"a.cu": "four"}, "c4 after the first clone")
    new_tip = git(up.path, "rev-parse", "HEAD")
    assert fetch_repo(str(up.path), tmp_path / "w", ref="feature").commit == up.c3
    assert fetch_repo(str(up.path), tmp_path / "w", ref="main").commit == new_tip
    assert (first.root / "a.cu").read_text() == "four"


@pytest.mark.parametrize(
    "bad",
    [
        "ext::sh -c touch% {marker}",
        "fd::17",
        "http://example.com/x.git",
        "--upload-pack=touch {marker}",
        "-u touch {marker}",
        "ext://sh -c touch {marker}",
        "ftp://example.com/x.git",
        "ssh://-oProxyCommand=touch {marker}/x",
        "git@-oProxyCommand=x:y.git",
        "transport::address",
    ],
)
def test_refused_sources_create_nothing(tmp_path, bad):
    marker = tmp_path / "pwned"
    source = bad.format(marker=marker)
    with pytest.raises(BadInput, match="refusing") as exc:
        validate_source(source)
    one_line_error(exc)
    with pytest.raises(BadInput, match="refusing"):
        fetch_repo(source, tmp_path / "w")
    assert not marker.exists()
    assert not (tmp_path / "w").exists()


def test_refusals_say_why():
    with pytest.raises(BadInput, match="CVE-2022-24439"):
        validate_source("ext::sh -c touch% /tmp/pwned")
    with pytest.raises(BadInput, match="plain http:// is not encrypted; use https://"):
        validate_source("HTTP://example.com/x.git")
    with pytest.raises(BadInput, match="read by git as an option"):
        validate_source("--upload-pack=x")


def test_allowed_sources_pass_validation():
    for ok in (
        "https://github.com/a/b.git",
        "ssh://git@host/a/b",
        "git://host/a/b",
        "file:///srv/a.git",
        "git@github.com:a/b.git",
        "/abs/path",
        "rel/path",
    ):
        validate_source(ok)


@pytest.mark.parametrize(
    "case", ["missing", "file", "empty", "empty-url", "bad-ref", "bad-ref-url", "bad-ref-chars"]
)
def test_errors_are_one_line_and_leave_nothing(up, tmp_path, case):
    empty = tmp_path / "empty"
    Repo.init(empty).close()
    (tmp_path / "plain.txt").write_text("x")
    source, ref, expect = {
        "missing": (str(tmp_path / "nope"), None, "does not exist"),
        "file": (str(tmp_path / "plain.txt"), None, "regular file"),
        "empty": (str(empty), None, "empty repository"),
        "empty-url": (f"file://{empty}", None, "empty repository"),
        "bad-ref": (str(up.path), "no-such-branch", "ref 'no-such-branch' not found"),
        "bad-ref-url": (up.url, "deadbeef99", "ref 'deadbeef99' not found"),
        "bad-ref-chars": (up.url, "--orphan", "invalid ref"),
    }[case]
    work = tmp_path / "w"
    with pytest.raises(BadInput, match=expect) as exc:
        fetch_repo(source, work, ref=ref)
    one_line_error(exc)
    assert not work.exists() or not any(work.iterdir())


def test_bad_ref_keeps_existing_clone(up, tmp_path):
    first = fetch_repo(up.url, tmp_path / "w")
    with pytest.raises(BadInput, match="not found"):
        fetch_repo(up.url, tmp_path / "w", ref="no-such-tag")
    assert git(first.root, "rev-parse", "HEAD") == up.c2
    assert (first.root / "a.cu").read_text() == "two"


def test_local_edits_in_clone_are_not_overwritten(up, tmp_path):
    first = fetch_repo(str(up.path), tmp_path / "w")
    (first.root / "a.cu").write_text("my edit")
    with pytest.raises(BadInput) as exc:
        fetch_repo(str(up.path), tmp_path / "w", ref="v1")
    one_line_error(exc)
    assert (first.root / "a.cu").read_text() == "my edit"


def test_workdir_holding_another_source(up, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(up.path, other)
    first = fetch_repo(str(up.path), tmp_path / "w")
    with pytest.raises(BadInput, match=r"already holds a clone of .*up; pick another") as exc:
        fetch_repo(str(other), tmp_path / "w")
    one_line_error(exc)
    assert git(first.root, "rev-parse", "HEAD") == up.c2
    assert fetch_repo(f"{up.url}/", tmp_path / "w").commit == up.c2  # same repo, other spelling


def test_workdir_src_with_user_files_is_refused(up, tmp_path):
    (tmp_path / "w" / "src").mkdir(parents=True)
    (tmp_path / "w" / "src" / "notes.txt").write_text("mine")
    with pytest.raises(BadInput, match="not a kminer clone"):
        fetch_repo(str(up.path), tmp_path / "w")
    assert (tmp_path / "w" / "src" / "notes.txt").read_text() == "mine"


def test_hooks_never_run(up, tmp_path, monkeypatch, isolated_git):
    sub = make_submodule_repo(tmp_path)  # built before the hooks are armed
    marker = tmp_path / "hook-ran"
    template = tmp_path / "template"
    (template / "hooks").mkdir(parents=True)
    hook = template / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\necho ran >> {marker}\n")
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("GIT_TEMPLATE_DIR", str(template))
    with isolated_git.open("a") as fh:  # a user-wide hooks dir must not run either
        fh.write(f"[core]\n\thooksPath = {template / 'hooks'}\n")
    git(tmp_path, "clone", "-q", str(up.path), "control")
    assert marker.exists(), "control: a plain clone runs the hook"
    marker.unlink()
    fetch_repo(str(up.path), tmp_path / "w1")
    fetch_repo(up.url, tmp_path / "w2", ref="v1")
    fetch_repo(up.url, tmp_path / "w3", ref=up.c3)
    fetch_repo(str(up.path), tmp_path / "w1", ref="feature")  # checkout in an existing clone
    fetch_repo(str(sub), tmp_path / "w4", submodules=True)
    assert (tmp_path / "w4" / "src" / "sub" / "s.cu").exists()
    assert not marker.exists()
    assert not (tmp_path / "w1" / "src" / ".git" / "hooks" / "post-checkout").exists()


def make_submodule_repo(tmp_path: Path) -> Path:
    sub = tmp_path / "subrepo"
    Repo.init(sub, initial_branch="main").close()
    commit(sub, {"s.cu": "__global__ void s() {}\n"}, "sub")
    top = tmp_path / "top"
    Repo.init(top, initial_branch="main").close()
    commit(top, {"t.cu": "t"}, "top")
    git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", f"file://{sub}", "sub")
    git(top, "commit", "-q", "-m", "add sub")
    return top


def test_submodules_only_on_request(tmp_path, isolated_git):
    isolated_git.write_text(isolated_git.read_text().replace("allow = always", "allow = user"))
    top = make_submodule_repo(tmp_path)
    plain = fetch_repo(str(top), tmp_path / "w1")
    assert (plain.root / "sub").is_dir() and not (plain.root / "sub" / "s.cu").exists()
    with_subs = fetch_repo(f"file://{top}", tmp_path / "w2", submodules=True)
    assert (with_subs.root / "sub" / "s.cu").exists()
    again = fetch_repo(str(top), tmp_path / "w1", submodules=True)  # rerun adds them
    assert again.commit == plain.commit and (again.root / "sub" / "s.cu").exists()


def test_network_timeout_is_enforced(tmp_path, monkeypatch):
    fake_ssh = tmp_path / "ssh"
    fake_ssh.write_text("#!/bin/sh\nexec sleep 30\n")
    fake_ssh.chmod(0o755)
    monkeypatch.setenv("GIT_SSH", str(fake_ssh))
    monkeypatch.delenv("GIT_SSH_COMMAND", raising=False)
    with pytest.raises(BadInput, match="timed out after 1 s") as exc:
        fetch_repo("git@example.invalid:o/r.git", tmp_path / "w", timeout=1)
    one_line_error(exc)
    assert not (tmp_path / "w").exists()


def test_credentials_never_reach_messages(tmp_path):
    with pytest.raises(BadInput) as exc:
        fetch_repo("https://user:s3cret@127.0.0.1:1/x.git", tmp_path / "w", timeout=20)
    msg = one_line_error(exc)
    assert "s3cret" not in msg and msg.startswith("cannot clone https://127.0.0.1:1/x.git: ")


@pytest.mark.parametrize(
    "stderr, want",
    [
        (
            "Cloning into 'x'...\nremote: Repository not found.\n"
            "fatal: repository 'https://github.com/a/b/' not found\n",
            "repository 'https://github.com/a/b/' not found",
        ),
        (
            "fatal: '/nope' does not appear to be a git repository\n"
            "fatal: Could not read from remote repository.\n\n"
            "Please make sure you have the correct "
            "access rights\nand the repository exists.\n",
            "'/nope' does not appear to be a git repository",
        ),
        (
            "ssh: Could not resolve hostname nohost: Name or service not known\n"
            "fatal: Could not read from remote repository.\n",
            "ssh: Could not resolve hostname nohost: Name or service not known",
        ),
    ],
)
def test_git_reason_picks_the_meaningful_line(stderr, want):
    exc = GitCommandError(["git", "clone"], 128, stderr)
    assert gitsafe.git_reason(exc) == want


def test_symlinked_workdir_parent_is_fine(up, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    src = fetch_repo(str(up.path), tmp_path / "link" / "w")
    assert (real / "w" / "src" / "a.cu").exists() and src.commit == up.c2


@pytest.mark.parametrize(
    "url, want",
    [
        ("https://user:s3cret@host/a/b.git", "https://host/a/b.git"),
        ("https://ghp_s3cret@host/a/b.git", "https://host/a/b.git"),
        ("HTTPS://user:s3cret@host/a", "HTTPS://host/a"),
        ("http://user:s3cret@host:8080/a", "http://host:8080/a"),
        ("ssh://git:s3cret@host:22/a/b.git", "ssh://git@host:22/a/b.git"),
        ("ssh://:s3cret@host/a", "ssh://@host/a"),
        ("ssh://git@host/a/b.git", "ssh://git@host/a/b.git"),  # a user name is no secret
        ("git://s3cret@host/a", "git://host/a"),
        ("file://user:s3cret@localhost/srv/a.git", "file://localhost/srv/a.git"),
        ("git@host:a/b.git", "git@host:a/b.git"),
        ("/srv/user:s3cret@a", "/srv/user:s3cret@a"),  # a path is not a URL: kept as it is
    ],
)
def test_redact_drops_credentials_of_every_url_form(url, want):
    assert gitsafe.redact(url) == want


def test_refusals_never_print_a_password(tmp_path):
    for source in ("http://user:s3cret@host/x.git", "ftp://user:s3cret@host/x.git"):
        with pytest.raises(BadInput, match="refusing") as exc:
            fetch_repo(source, tmp_path / "w")
        assert "s3cret" not in one_line_error(exc)


def test_clone_with_credentials_in_a_file_url(up, tmp_path):
    src = fetch_repo(f"file://user:s3cret@localhost{up.path}", tmp_path / "w")
    assert (src.url, src.commit) == (f"file://localhost{up.path}", up.c2)
    assert git(src.root, "config", "kminer.source") == src.url
    again = fetch_repo(f"file://user:s3cret@localhost{up.path}", tmp_path / "w", ref="v1")
    assert again.commit == up.c1  # the same source: reused, switched in place


def test_stale_staging_is_removed_and_live_staging_kept(up, tmp_path):
    work = tmp_path / "w"
    done = subprocess.Popen(["true"])
    done.wait()
    dead, old, live = (
        work / f"{clone.STAGING}{done.pid}-abc",
        work / f"{clone.STAGING}xyz",  # named before staging folders carried a pid
        work / f"{clone.STAGING}{os.getpid()}-busy",
    )
    for path in (dead, old, live):
        (path / "src").mkdir(parents=True)
        (path / "src" / "a.cu").write_text("half a clone")
    src = fetch_repo(str(up.path), work)
    assert (src.root / "a.cu").read_text() == "two"
    assert sorted(p.name for p in work.glob(f"{clone.STAGING}*")) == [live.name]
    (work / "notes").write_text("mine")
    fetch_repo(str(up.path), work)  # a rerun cleans too, and touches nothing else
    assert (work / "notes").read_text() == "mine" and live.exists()


def test_unfetched_submodules_are_named(tmp_path):
    """A submodule left out of the clone (kminer fetches them only with --submodules) is named,
    so a CPU reference that includes it and does not build says why."""
    from miner.clone import unfetched_submodules

    (tmp_path / ".gitmodules").write_text(
        '[submodule "third_party/parallel-hashmap"]\n'
        "\tpath = third_party/parallel-hashmap\n"
        "\turl = https://github.com/greg7mdp/parallel-hashmap.git\n"
        '[submodule "eigen"]\n\tpath = eigen\n\turl = https://gitlab.com/libeigen/eigen.git\n'
    )
    (tmp_path / "third_party" / "parallel-hashmap").mkdir(parents=True)  # git's empty folder
    (tmp_path / "eigen").mkdir()
    (tmp_path / "eigen" / "Eigen").write_text("fetched\n")
    assert unfetched_submodules(tmp_path) == ["third_party/parallel-hashmap"]
    (tmp_path / "third_party" / "parallel-hashmap" / "phmap.h").write_text("#pragma once\n")
    assert unfetched_submodules(tmp_path) == []
    assert unfetched_submodules(tmp_path / "third_party") == []  # no .gitmodules
