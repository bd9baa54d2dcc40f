"""Push an exported dataset folder to the Hugging Face Hub, or say exactly what a push would do.

Before anything leaves the machine the folder is checked: a card whose YAML header names a
license and the Parquet configs, at least one row, no row under an unknown license and no row
whose repository is a local path (a dataset must name where its code came from). The push is
one commit: every file of the export added, and Parquet shards of an earlier push that this
export no longer has deleted, so a smaller export never leaves stale rows behind. `--dry-run`
prints the same plan and touches no network.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from curation.card import read_header
from curation.export import MANAGED

REPO_TYPE = "dataset"


class PublishError(Exception):
    """Why a folder will not be published; one line."""


@dataclass(frozen=True)
class Upload:
    path_in_repo: str
    local: Path
    size: int
    sha256: str


def files(out: Path) -> list[Upload]:
    found = []
    for name in MANAGED:
        path = out / name
        paths = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for p in paths:
            if p.is_file():
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                found.append(Upload(p.relative_to(out).as_posix(), p, p.stat().st_size, digest))
    return found


def check(out: Path) -> int:
    """The number of rows; PublishError for the first reason not to publish."""
    card = out / "README.md"
    if not card.is_file():
        raise PublishError(f"{out}: no dataset card (README.md); run `kminer export` first")
    try:
        head = read_header(card.read_text(encoding="utf-8"))
    except Exception as exc:  # yaml's errors are many classes; any means a broken card
        raise PublishError(f"{card}: the YAML header does not parse: {exc}") from None
    if not head.get("license") or not head.get("configs"):
        raise PublishError(f"{card}: the YAML header needs `license` and `configs`")
    shards = sorted((out / "data").glob("*.parquet"))
    if not shards:
        raise PublishError(f"{out}/data: no Parquet shards")
    rows, unknown, local = 0, 0, set()
    for shard in shards:
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
