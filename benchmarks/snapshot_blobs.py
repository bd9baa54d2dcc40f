"""A git repository of the blobs a mirror holds, for a mirror that lacks a few (a full checkout
of it fails): every tracked file of HEAD whose blob is present, committed in a fresh repository.
kminer mines that folder like any other. Prints how many blobs were missing.

    python benchmarks/snapshot_blobs.py /work/.mirror/OWNER+NAME/repo /tmp/OUT
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def snapshot(mirror: Path, out: Path) -> int:
    listing = subprocess.run(
        ["git", "-C", str(mirror), "ls-tree", "-r", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    missing = 0
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        mode, kind, sha = meta.split()
        if kind != "blob":
            continue
        blob = subprocess.run(
            ["git", "-C", str(mirror), "cat-file", "blob", sha], capture_output=True
        )
        if blob.returncode:
            missing += 1
            continue
        dest = out / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(blob.stdout)
        if mode == "100755":
            dest.chmod(0o755)
    git = ["git", "-C", str(out), "-c", "user.email=kminer@localhost", "-c", "user.name=kminer"]
    subprocess.run(["git", "init", "-q", str(out)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", f"snapshot of {mirror}"], check=True)
    return missing


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: snapshot_blobs.py MIRROR_GIT_DIR OUT_DIR")
    print(f"{snapshot(Path(sys.argv[1]), Path(sys.argv[2]))} blobs missing")
