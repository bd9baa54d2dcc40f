"""Bring the repository to mine onto disk without running anything from it, and record its origin.

A source is a URL, a local git dir (bare or with a work tree) or a plain folder. Git sources are
cloned into ``workdir/src`` (shallow where the transport allows); a rerun reuses that clone. A
clone is made in a staging folder, ``workdir/.src-partial-<pid>-*``, and moved into place only
when complete: a failed or interrupted clone removes its staging folder, and one left by a run
that was killed outright is removed by the next run.
Nothing from the repository ever executes: only the https, ssh, git and file transports are
allowed, the clone gets an empty template and ``core.hooksPath=/dev/null``, and submodules are
fetched only on request.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from git import Git, GitCommandError, GitCommandNotFound, Repo
from git.exc import UnsafeOptionError, UnsafeProtocolError

from miner.errors import BadInput, SetupError
from miner.gitsafe import (
    SCHEME,
    git_env,
    git_reason,
    is_scp,
    one_line,
    redact,
    run_git,
    unreachable,
    validate_source,
)
from miner.license import detect_license

log = logging.getLogger(__name__)

MAX_HASHED_BYTES = 8 * 1024 * 1024
_FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_HEXISH = re.compile(r"[0-9a-fA-F]{4,64}")
_BAD_REF = re.compile(r"^[-/]|\.\.|@\{|//|[\x00-\x20\x7f~^:?*\[\\]|[/.]$|\.lock$")
STAGING = ".src-partial-"  # + the pid of the run cloning into it


@dataclass(frozen=True)
class RepoSource:
    url: str  # as given, normalized: local paths made absolute; URLs as-is (password dropped)
    kind: str  # "url" | "git_dir" | "folder"
    commit: str  # full SHA of HEAD; for a plain folder "folder-" + sha1 of its contents
    ref: str  # the --ref asked for, or ""
    root: Path  # the tree to mine
    license: str  # SPDX id, or "unknown"
    license_file: str  # relative path of the file the license came from, or ""


def fetch_repo(
    source: str,
    workdir: Path,
    ref: str | None = None,
    submodules: bool = False,
    timeout: float = 600,
) -> RepoSource:
    """Put `source` at `ref` on disk (or reuse the clone already there) and say what it is.

    Why: every later stage mines ``root`` and stamps rows with ``url``/``commit``/``license``, so
    this is the one place that decides what exactly is mined; it never deletes data it did not
    create and never runs code from the repository.
    """
    validate_source(source)
    ref = ref or None
    check_ref(ref)
    kind, url, path = _classify(source)
    workdir = Path(workdir).expanduser().absolute()
    if workdir.exists() and not workdir.is_dir():
        raise BadInput(f"workdir {workdir} is not a directory")
    remove_stale_staging(workdir)
    dest = workdir / "src"
    held = _held_source(dest)
    if held is not None and not _same_source(held, url):
        raise BadInput(f"workdir {workdir} already holds a clone of {held}; pick another --workdir")

    if kind == "folder":
        assert path is not None
        if ref is not None:
            raise BadInput(f"--ref {ref} needs a git repository, but {path} is a plain folder")
        commit = folder_commit(path, exclude=workdir)
        return RepoSource(url, kind, commit, "", path, *detect_license(path))

    local = kind == "git_dir" or url.lower().startswith("file://")
    start = time.monotonic()
    deadline = start + timeout
    with tempfile.TemporaryDirectory(prefix="kminer-template-") as template:
        env = git_env(template, local)
        step = "clone" if held is None else "update the clone of"
        try:
            target = source if kind == "url" else url  # credentials stay out of the record
            if held is None:
                _fresh_clone(kind, target, ref, dest, env, deadline)
            with Repo(dest) as repo:
                repo.git.update_environment(**env)
                if held is not None:
                    _update(repo, kind, target, ref, deadline)
                if submodules:
                    step = "fetch the submodules of"
                    _update_submodules(repo, env, local, deadline)
                commit = repo.head.commit.hexsha
        except GitCommandNotFound as exc:
            raise SetupError("git is not installed or not on PATH") from exc
        except (UnsafeProtocolError, UnsafeOptionError) as exc:
            raise BadInput(f"refusing {url!r}: {one_line(str(exc))}") from exc
        except GitCommandError as exc:
            raise BadInput(f"cannot {step} {url}: {git_reason(exc, timeout)}") from exc
        except OSError as exc:  # workdir not writable, disk full, another run filled dest
            raise BadInput(f"cannot {step} {url} into {dest}: {exc.strerror or exc}") from exc
    log.info("%s at %s in %s (%.1f s)", url, commit[:12], dest, time.monotonic() - start)
    return RepoSource(url, kind, commit, ref or "", dest, *detect_license(dest))


def check_ref(ref: str | None) -> None:
    """Refuse a --ref git would read as an option or a revision expression, not a name."""
    if ref and _BAD_REF.search(ref):
        raise BadInput(f"invalid ref {ref!r}: give a branch, tag or commit SHA")


def folder_commit(root: Path, exclude: Path | None = None) -> str:
    """A stable id for a plain folder: "folder-" + sha1 over sorted (path, bytes) of its files.

    Why: a folder has no commit, yet rows need a version that changes exactly when the mined
    files change. `.git` entries, files over 8 MB, non-regular files and `exclude` (the workdir,
    which may sit inside the folder and changes every run) are left out.
    """
    root = Path(root).resolve()
    skip = Path(exclude).resolve() if exclude is not None else None
    files: list[tuple[str, Path, int]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if d != ".git" and here / d != skip]
        for name in filenames:
            p = here / name
            try:
                st = p.lstat()
            except OSError:
                continue
            if name != ".git" and stat.S_ISREG(st.st_mode) and st.st_size <= MAX_HASHED_BYTES:
                files.append((p.relative_to(root).as_posix(), p, st.st_size))
    digest = hashlib.sha1()
    for rel, p, size in sorted(files):
        digest.update(rel.encode("utf-8", "surrogateescape") + b"\0" + str(size).encode() + b"\0")
        try:
            with p.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
        except OSError as exc:
            log.warning("cannot read %s: %s", p, exc)
    return "folder-" + digest.hexdigest()


def _classify(source: str) -> tuple[str, str, Path | None]:
    if SCHEME.match(source):
        return "url", redact(source), None
    path = Path(source).expanduser()
    if path.exists():
        path = path.resolve()
        if path.is_dir():
            bare = all((path / n).exists() for n in ("HEAD", "objects", "refs"))
            kind = "git_dir" if (path / ".git").exists() or bare else "folder"
            return kind, str(path), path
        what = "a regular file" if path.is_file() else "not a directory"
        raise BadInput(f"{path} is {what}, not a git repository or a folder")
    if is_scp(source):
        return "url", source, None
    raise BadInput(f"path {path.absolute()} does not exist")


def _same_source(a: str, b: str) -> bool:
    """Same repository spelled differently: trailing "/", a ".git" suffix on URLs, file://."""

    def norm(u: str) -> str:
        u = u.strip().rstrip("/")
        if u.lower().startswith("file://"):
            return u[len("file://") :]
        return u if u.startswith("/") else u.removesuffix(".git").rstrip("/")

    return norm(a) == norm(b)


def _held_source(dest: Path) -> str | None:
    """The source whose clone is in `dest`, None when dest is free; refuses anything else there."""
    if not dest.exists() and not dest.is_symlink():
        return None
    if dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir()):
        return None
    if (dest / ".git").is_dir():
        try:
            with Repo(dest) as repo:
                reader = repo.config_reader("repository")
                held = reader.get_value("kminer", "source", default="") or (
                    repo.remotes.origin.url if "origin" in repo.remotes else ""
                )
        except Exception as exc:  # any unreadable repo means "not ours"
            log.debug("cannot read %s: %s", dest, exc)
            held = ""
        if held:
            return str(held)
    raise BadInput(f"{dest} exists and is not a kminer clone; pick another --workdir")


def remove_stale_staging(workdir: Path) -> None:
    """Remove the staging folders of clones whose run is gone (killed before it could clean up).

    A folder whose run is still alive (another kminer cloning into this workdir) is left alone.
    """
    if not workdir.is_dir():
        return
    for path in workdir.glob(STAGING + "*"):
        owner = path.name.removeprefix(STAGING).split("-", 1)[0]
        if path.is_symlink() or not path.is_dir() or (owner.isdigit() and _alive(int(owner))):
            continue
        log.info("removing %s, left by an interrupted clone", path)
        shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _left(deadline: float) -> float:
    return max(1.0, deadline - time.monotonic())


def _clone(url: str, dest: Path, opts: list[str], env: dict[str, str], deadline: float) -> Repo:
    """`git clone`, through GitPython's own protocol/option guards, killed at the deadline or
    when kminer is interrupted.

    Repo.clone_from ignores kill_after_timeout, so the guards it runs are called here directly;
    template and hooksPath come through the environment because GitPython rightly refuses
    --template and -c as clone options.
    """
    Git.check_unsafe_protocols(url)
    Git.check_unsafe_options(options=opts, unsafe_options=Repo.unsafe_git_clone_options)
    run_git(["clone", *opts, "--", url, str(dest)], dest.parent, env, _left(deadline))
    repo = Repo(dest)
    repo.git.update_environment(**env)
    return repo


def _fresh_clone(
    kind: str, url: str, ref: str | None, dest: Path, env: dict[str, str], deadline: float
) -> None:
    """Clone into a staging dir next to dest and move it in only when complete."""
    made_workdir = not dest.parent.exists()
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING}{os.getpid()}-", dir=dest.parent))
    tmp = staging / "src"
    try:
        if kind == "git_dir":
            repo = _full_clone(url, tmp, ref, env, deadline)
        else:
            repo = _clone_url(url, tmp, ref, env, deadline)
        with repo:
            _record(repo, redact(url), ref)
        if dest.is_dir():
            dest.rmdir()  # _held_source let it through only when empty
        tmp.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if made_workdir and not dest.exists():
            with contextlib.suppress(OSError):
                dest.parent.rmdir()


def _full_clone(url: str, tmp: Path, ref: str | None, env: dict[str, str], deadline: float) -> Repo:
    repo = _clone(url, tmp, ["--no-checkout"] if ref else [], env, deadline)
    _require_commits(repo, url, need_head=ref is None)
    if ref:
        _checkout(repo, _resolve(repo, ref) or _no_ref(ref, url))
    return repo


def _clone_url(url: str, tmp: Path, ref: str | None, env: dict[str, str], deadline: float) -> Repo:
    """Shallow clone of a URL at ref; full clone when the server cannot give that ref shallowly."""
    if ref is None:
        repo = _clone(url, tmp, ["--depth=1"], env, deadline)
        _require_commits(repo, url, need_head=True)
        return repo
    if _FULL_SHA.fullmatch(ref.lower()):
        try:
            tmp.mkdir()
            init = Git(str(tmp))
            init.update_environment(**env)
            init.init()
            repo = Repo(tmp)
            repo.git.update_environment(**env)
            repo.create_remote("origin", url)
            run_git(["fetch", "--depth=1", "origin", ref.lower()], tmp, env, _left(deadline))
            _checkout(repo, ref.lower())
            return repo
        except GitCommandError as exc:
            if unreachable(exc):
                raise
            log.info("shallow fetch of %s refused (%s); cloning in full", ref, git_reason(exc))
            shutil.rmtree(tmp, ignore_errors=True)
            return _full_clone(url, tmp, ref, env, deadline)
    try:
        return _clone(url, tmp, ["--depth=1", f"--branch={ref}"], env, deadline)
    except GitCommandError as exc:
        if "not found in upstream" not in str(exc.stderr):
            raise
        if not _HEXISH.fullmatch(ref):
            _no_ref(ref, url)
    shutil.rmtree(tmp, ignore_errors=True)  # maybe a short SHA: only a full clone can resolve it
    return _full_clone(url, tmp, ref, env, deadline)


def _update(repo: Repo, kind: str, url: str, ref: str | None, deadline: float) -> None:
    """Reuse the clone when it already has ref checked out; otherwise fetch ref and check it out."""
    head = _head(repo)
    if head is None:
        raise BadInput(
            f"{repo.working_tree_dir} holds a clone without a commit; pick another --workdir"
        )
    if ref is None or (
        _config(repo, "kminer.ref") == ref and _config(repo, "kminer.commit") == head
    ):
        log.info("reusing %s at %s", repo.working_tree_dir, head[:12])
        return
    sha = _resolve(repo, ref)
    if sha == head:
        log.info("reusing %s at %s (%s)", repo.working_tree_dir, head[:12], ref)
    elif sha and sha.startswith(ref.lower()):  # a commit already here: no need to ask the remote
        _checkout(repo, sha)
    else:
        origin = repo.remotes.origin
        shallow = Path(repo.git_dir, "shallow").exists()
        if kind == "git_dir":
            origin.fetch(tags=True, kill_after_timeout=_left(deadline))
            sha = _resolve(repo, ref)
        else:
            try:
                origin.fetch(ref, depth=1 if shallow else None, kill_after_timeout=_left(deadline))
                sha = repo.git.rev_parse("--verify", "FETCH_HEAD^{commit}")
            except GitCommandError as exc:
                if unreachable(exc):
                    raise
                if sha is None and _HEXISH.fullmatch(ref):  # a short SHA needs all history
                    origin.fetch(
                        "+refs/heads/*:refs/remotes/origin/*",
                        tags=True,
                        unshallow=shallow,
                        kill_after_timeout=_left(deadline),
                    )
                    sha = _resolve(repo, ref)
        _checkout(repo, sha or _no_ref(ref, url))
    _record(repo, redact(url), ref)


def _update_submodules(repo: Repo, env: dict[str, str], local: bool, deadline: float) -> None:
    """Fetch submodules (shallow, recursively) under the same restrictions as the clone.

    For a remote source the file transport is dropped, so a hostile .gitmodules cannot pull
    repositories from this machine into the clone.
    """
    if not Path(repo.working_tree_dir, ".gitmodules").is_file():
        return
    env = {**env, "GIT_ALLOW_PROTOCOL": "https:ssh:git:file" if local else "https:ssh:git"}
    update = ["submodule", "update", "--init", "--recursive"]
    try:
        run_git([*update, "--depth", "1"], repo.working_tree_dir, env, _left(deadline))
    except GitCommandError as exc:
        if unreachable(exc):
            raise
        log.info("shallow submodule update failed (%s); retrying in full", git_reason(exc))
        run_git(update, repo.working_tree_dir, env, _left(deadline))


_SUBMODULE_PATH = re.compile(r"^\s*path\s*=\s*(.+?)\s*$", re.MULTILINE)


def unfetched_submodules(root: Path) -> list[str]:
    """The paths `.gitmodules` names whose folder is missing or empty: code that includes them
    (a header-only library a CPU reference needs: pytorch_sparse's parallel-hashmap) does not
    build until they are fetched (`kminer mine --submodules`)."""
    try:
        text = (root / ".gitmodules").read_text("utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for rel in _SUBMODULE_PATH.findall(text):
        folder = root / rel
        try:
            empty = not folder.is_dir() or next(folder.iterdir(), None) is None
        except OSError:
            empty = True
        if empty and ".." not in Path(rel).parts:
            out.append(rel)
    return out


def _require_commits(repo: Repo, url: str, need_head: bool) -> None:
    has_refs = bool(repo.git.for_each_ref("--count=1"))
    if _head(repo) is not None or (has_refs and not need_head):
        return
    if has_refs:
        raise BadInput(f"{redact(url)} has no default branch to check out; pass --ref")
    raise BadInput(f"{redact(url)} is an empty repository (no commits)")


def _head(repo: Repo) -> str | None:
    try:
        return repo.git.rev_parse("--verify", "--quiet", "HEAD^{commit}") or None
    except GitCommandError:
        return None


def _resolve(repo: Repo, ref: str) -> str | None:
    """The commit ref names in the clone, without network: branch, tag, then SHA or any rev."""
    for cand in (f"refs/remotes/origin/{ref}", f"refs/tags/{ref}", ref):
        try:
            return repo.git.rev_parse("--verify", "--quiet", f"{cand}^{{commit}}")
        except GitCommandError:
            continue
    return None


def _no_ref(ref: str, url: str) -> NoReturn:
    raise BadInput(f"ref {ref!r} not found in {redact(url)}")


def _checkout(repo: Repo, sha: str) -> None:
    """Detached checkout; local changes in the clone make it fail rather than be overwritten."""
    repo.git.checkout("--detach", sha, "--")


def _record(repo: Repo, url: str, ref: str | None) -> None:
    """Note in the clone's own config what it is, and keep hooks off for any later git use."""
    head = _head(repo) or ""
    with repo.config_writer("repository") as cw:
        cw.set_value("core", "hooksPath", "/dev/null")
        for key, value in (("source", url), ("ref", ref or ""), ("commit", head)):
            cw.set_value("kminer", key, value)


def _config(repo: Repo, key: str) -> str | None:
    try:
        return repo.git.config("--get", key)
    except GitCommandError:
        return None
