"""Push an exported dataset folder to the Hugging Face Hub, or say exactly what a push would do.

Before anything leaves the machine the folder is checked: exactly the files an export writes
(no symbolic link, nothing in data/ but a complete set of shards: what is not the export's is
never uploaded), a card whose YAML header names a license and the Parquet configs, at least one
row, each saying how it was verified, no row under an unknown license and no row whose
repository is a local path (a dataset must name where its code came from). The push is
one commit: every file of the export added, and Parquet shards of an earlier push that this
export no longer has deleted, so a smaller export never leaves stale rows behind. `--dry-run`
prints the same plan and touches no network.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from curation.card import read_header

REPO_TYPE = "dataset"
MANAGED = ("data", "README.md", "train.jsonl", "export_report.json")  # what an export writes
SHARD_NAME = re.compile(r"train-(\d{5})-of-(\d{5})\.parquet")


class PublishError(Exception):
    """Why a folder will not be published; one line."""


@dataclass(frozen=True)
class Upload:
    path_in_repo: str
    local: Path
    size: int
    sha256: str


def layout_problem(out: Path) -> str:
    """'' when OUT's managed entries are what an export writes (or absent), else the first that
    is not: a symbolic link, a file where the shards' folder belongs (or the reverse), or
    anything in data/ that is not a shard. Export and publish both refuse such a folder."""
    for name in MANAGED:
        path = out / name
        if path.is_symlink():
            return f"{path} is a symbolic link; kminer never writes or reads through one"
        if name == "data" and path.exists() and not path.is_dir():
            return f"{path} is a file where the shards' folder belongs"
        if name != "data" and path.is_dir():
            return f"{path} is a folder where a file belongs"
    data = out / "data"
    for entry in sorted(os.scandir(data), key=lambda e: e.name) if data.is_dir() else []:
        regular = entry.is_file(follow_symlinks=False)
        if not regular or not SHARD_NAME.fullmatch(entry.name):
            kind = "a symbolic link" if entry.is_symlink() else "not one of the export's shards"
            return f"{data} holds {entry.name}, {kind}; move it away"
    return ""


def _shards(out: Path) -> list[Path]:
    """data/'s shards, a complete train-i-of-n set (checked by `layout_problem` first)."""
    names = sorted(e.name for e in os.scandir(out / "data")) if (out / "data").is_dir() else []
    counts = {SHARD_NAME.fullmatch(n).group(2) for n in names}
    expected = [f"train-{i:05d}-of-{n}.parquet" for n in counts for i in range(int(n))]
    if len(counts) > 1 or names != expected:
        raise PublishError(f"{out}/data: the shards are not one complete train-*-of-* set")
    return [out / "data" / n for n in names]


def files(out: Path) -> list[Upload]:
    """What a push uploads: the export's own files, none through a symbolic link."""
    problem = layout_problem(out)
    if problem:
        raise PublishError(problem)
    found = []
    for path in [*_shards(out), *(out / n for n in MANAGED if n != "data")]:
        if path.is_file() and not path.is_symlink():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            rel = path.relative_to(out).as_posix()
            found.append(Upload(rel, path, path.stat().st_size, digest))
    return sorted(found, key=lambda u: u.path_in_repo)


def check(out: Path) -> int:
    """The number of rows; PublishError for the first reason not to publish."""
    if not out.is_dir():
        raise PublishError(f"{out}: not a folder written by `kminer export`")
    problem = layout_problem(out)
    if problem:
        raise PublishError(problem)
    card = out / "README.md"
    if not card.is_file():
        raise PublishError(f"{out}: no dataset card (README.md); run `kminer export` first")
    try:
        head = read_header(card.read_text(encoding="utf-8"))
    except Exception as exc:  # yaml's errors are many classes; any means a broken card
        raise PublishError(f"{card}: the YAML header does not parse: {exc}") from None
    if not head.get("license") or not head.get("configs"):
        raise PublishError(f"{card}: the YAML header needs `license` and `configs`")
    shards = _shards(out)
    if not shards:
        raise PublishError(f"{out}/data: no Parquet shards")
    rows, unknown, local = 0, 0, set()
    for shard in shards:
        if "verification" not in pq.read_schema(shard).names:
            raise PublishError(f"{shard}: its rows do not say how they were verified; export again")
        table = pq.read_table(shard, columns=["license", "repo"])
        rows += table.num_rows
        unknown += sum(1 for v in table.column("license").to_pylist() if v in (None, "", "unknown"))
        local |= {
            r
            for r in table.column("repo").to_pylist()
            if "://" not in r and not r.startswith("git@")
        }
    if rows == 0:
        raise PublishError(f"{out}: the dataset is empty")
    if unknown:
        raise PublishError(f"{out}: {unknown} rows have an unknown license")
    if local:
        raise PublishError(
            f"{out}: rows name a local path as their repository ({sorted(local)[0]}); "
            "export again with --source PATH=URL"
        )
    return rows


def plan(out: Path, repo_id: str, private: bool, revision: str | None) -> list[str]:
    """The operations a push makes, one line each (what --dry-run prints)."""
    rows = check(out)
    where = f"{repo_id}@{revision or 'main'}"
    lines = [f"create_repo {REPO_TYPE} {repo_id} private={private} (if it does not exist)"]
    if revision:
        lines.append(f"create_branch {revision} on {repo_id} (if it does not exist)")
    lines += [f"add {u.path_in_repo} ({u.size} bytes, sha256 {u.sha256[:12]})" for u in files(out)]
    lines.append(f"delete data/* files on {where} that this export does not have")
    lines.append(f'commit "kminer export: {rows} rows" to {where}')
    return lines


def token() -> str:
    from huggingface_hub import get_token

    found = os.environ.get("HF_TOKEN") or get_token()
    if not found:
        raise PublishError("no Hugging Face token: set HF_TOKEN or run `hf auth login`")
    return found


def publish(
    out: Path,
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    endpoint: str | None = None,
) -> str:
    """Push the folder; the commit's URL."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    rows = check(out)
    api = HfApi(token=token(), endpoint=endpoint)
    api.create_repo(repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True)
    if revision:
        api.create_branch(repo_id, repo_type=REPO_TYPE, branch=revision, exist_ok=True)
    uploads = files(out)
    ours = {u.path_in_repo for u in uploads}
    there = api.list_repo_files(repo_id, repo_type=REPO_TYPE, revision=revision)
    ops = [CommitOperationAdd(u.path_in_repo, str(u.local)) for u in uploads]
    ops += [CommitOperationDelete(p) for p in there if p.startswith("data/") and p not in ours]
    info = api.create_commit(
        repo_id,
        ops,
        commit_message=f"kminer export: {rows} rows",
        repo_type=REPO_TYPE,
        revision=revision,
    )
    return info.commit_url
