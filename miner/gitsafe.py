"""What keeps git from running anything a repository or its URL asks for, or outliving kminer.

Only https, ssh, git and file transports; never `ext::`/`fd::` helpers (GitPython
CVE-2022-24439) or a leading `-`; every git call gets an environment with no prompts, no hooks and
no submodule recursion; a long git call is killed at its deadline and when kminer is interrupted;
and git's errors and every URL kminer records or logs come back without credentials.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from git import Git, GitCommandError
from git.exc import GitCommandNotFound, UnsafeProtocolError

from miner.errors import BadInput

ALLOWED_SCHEMES = ("https", "ssh", "git", "file")
SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_HELPER = re.compile(r"([A-Za-z0-9][A-Za-z0-9+.-]*|)::")  # git's <transport>::<address> form
USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_SSH_PASSWORD = re.compile(r"(?<=://)([^/:@\s]*):[^/@\s]*@")  # ssh://user:password@host
# stderr lines that only say "it failed"; the line before them names the cause.
_GENERIC = (
    "could not read from remote repository",
    "the remote end hung up",
    "early eof",
    "index-pack failed",
    "invalid index-pack output",
    "make sure you have the correct",
    "and the repository exists",
    "cloning into",
    "you appear to have cloned",
)
_UNREACHABLE = (
    "could not resolve host",
    "does not appear to be a git repository",
    "could not read from remote repository",
    "connection refused",
    "timed out",
    "did not complete in",
    "authentication failed",
    "permission denied",
    "unable to access",
    "no route to host",
    "network is unreachable",
)


def validate_source(source: str) -> None:
    """Refuse a repository argument that could make git run a command or talk in the clear.

    Why: ``ext::`` makes git run any shell command (GitPython CVE-2022-24439), other
    ``transport::`` helpers and ``fd::`` are just as open, a leading ``-`` is read by git as an
    option (``--upload-pack=...``), and plain http can be tampered with on the way.
    """
    allowed = "use https://, ssh://, git://, file:// or a local path"
    shown = redact(source)  # refusals are printed: no password in them
    if not source.strip():
        raise BadInput("empty repository argument")
    if any(ord(c) < 32 or ord(c) == 127 for c in source):
        raise BadInput(f"refusing {shown!r}: control characters in the repository argument")
    if source.startswith("-"):
        raise BadInput(f"refusing {shown!r}: a leading '-' would be read by git as an option")
    if m := _HELPER.match(source):
        raise BadInput(
            f"refusing {shown!r}: the '{m.group(0)}' transport runs a git remote "
            f"helper that can execute commands (CVE-2022-24439); {allowed}"
        )
    if m := SCHEME.match(source):
        scheme = m.group(1).lower()
        if scheme == "http":
            raise BadInput(f"refusing {shown!r}: plain http:// is not encrypted; use https://")
        if scheme not in ALLOWED_SCHEMES:
            raise BadInput(f"refusing {shown!r}: transport {scheme}:// is not allowed; {allowed}")
        host = USERINFO.sub("", source[m.end() :]).split("/", 1)[0]
    else:
        host = source.split(":", 1)[0].rsplit("@", 1)[-1] if is_scp(source) else ""
    if host.startswith("-"):
        raise BadInput(
            f"refusing {shown!r}: a host name starting with '-' would be read as an ssh option"
        )
    try:
        Git.check_unsafe_protocols(source)
    except UnsafeProtocolError as exc:
        raise BadInput(f"refusing {shown!r}: {exc}") from exc


def is_scp(source: str) -> bool:
    """git's rule: `host:path` with a colon before any slash is ssh (scp-like syntax)."""
    colon, slash = source.find(":"), source.find("/")
    return colon > 0 and (slash < 0 or colon < slash)


def redact(url: str) -> str:
    """`url` without credentials, for everything kminer stores, logs or prints.

    An http(s), git or file URL loses its whole user part (a lone token is a credential there);
    an ssh URL keeps its user name, which picks the account and is no secret, and loses only the
    password. Anything that is not a URL is returned as it is.
    """
    m = SCHEME.match(url)
    if m is None:
        return url
    if m.group(1).lower() == "ssh":
        return _SSH_PASSWORD.sub(r"\1@", url)
    return USERINFO.sub("", url)


def git_env(template: str, local: bool) -> dict[str, str]:
    """Environment for every git call: allowed transports, no prompts, no hooks, no surprises."""
    config = {
        "core.hooksPath": "/dev/null",  # hooks of the clone and of submodule clones never run
        "core.fsmonitor": "false",
        "submodule.recurse": "false",
        "fetch.recurseSubmodules": "false",
        "clone.defaultRemoteName": "origin",
        "advice.detachedHead": "false",
    }
    if local:  # git >= 2.38.1 refuses local submodules unless asked; only for local sources
        config["protocol.file.allow"] = "always"
    env = {
        "GIT_ALLOW_PROTOCOL": "https:ssh:git:file",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_TEMPLATE_DIR": template,  # empty: no sample or user hooks copied into .git
        "GIT_LFS_SKIP_SMUDGE": "1",
        "GIT_CONFIG_COUNT": str(len(config)),
    }
    for i, (key, value) in enumerate(config.items()):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


def run_git(args: list[str], cwd: Path | str, env: dict[str, str], timeout: float) -> str:
    """`git ARGS` in `cwd` under `env`; its stdout, or GitCommandError as GitPython raises it.

    Why not GitPython's kill_after_timeout: its timer thread is not cancelled when the wait is
    interrupted, so Ctrl-C during a clone left git writing into the workdir and kminer waiting
    for the timer to fire. Here git is killed at `timeout` and whenever the wait stops for any
    other reason (Ctrl-C included), so a clone's staging folder can be removed right after.
    """
    command = [Git.GIT_PYTHON_GIT_EXECUTABLE or "git", *args]
    shown = [redact(a) for a in command]
    full_env = {**os.environ, **env, "LANGUAGE": "C", "LC_ALL": "C"}  # messages we can match
    try:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except FileNotFoundError as exc:
        raise GitCommandNotFound(shown, exc) from exc
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as exc:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        if isinstance(exc, subprocess.TimeoutExpired):
            late = f"Timeout: git {args[0]} did not complete in {timeout:g} secs"
            raise GitCommandError(shown, -9, late) from None
        raise
    if proc.returncode:
        raise GitCommandError(shown, proc.returncode, err.decode("utf-8", "replace"))
    return out.decode("utf-8", "replace").strip()


def git_stderr(exc: GitCommandError) -> str:
    raw = str(exc.stderr or "").strip()
    return raw.removeprefix("stderr: '").removesuffix("'")


def unreachable(exc: GitCommandError) -> bool:
    """The remote itself failed (host, auth, path, timeout): retrying another way cannot help."""
    low = git_stderr(exc).lower()
    return any(s in low for s in _UNREACHABLE) or bool(re.search(r"repository .* not found", low))


def git_reason(exc: GitCommandError, timeout: float | None = None) -> str:
    """git's last meaningful stderr line, as one line without credentials."""
    raw = git_stderr(exc)
    if "did not complete in" in raw or "killed because it timed out" in raw:
        return f"timed out after {timeout:g} s" if timeout else "timed out"
    lines = [ln.strip() for ln in raw.splitlines() if ln.strip()]
    useful = [ln for ln in lines if not any(g in ln.lower() for g in _GENERIC)]
    flagged = [ln for ln in useful if re.match(r"(fatal|error):", ln, re.IGNORECASE)]
    line = (flagged or useful or lines or [f"git exited with status {exc.status}"])[-1]
    while m := re.match(r"(fatal|error|remote|warning):\s*", line, re.IGNORECASE):
        line = line[m.end() :]
    return one_line(USERINFO.sub("", line))[:300]


def one_line(text: str) -> str:
    return " ".join(text.split())
