"""Where an export is written: the checks on OUT and the workdirs before any work, the shards
written into a staging folder, and the move of the staged files over the previous export's,
all or none. Nothing here follows a link out of OUT or deletes through one.
"""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path

from curation import card
from curation.publish import MANAGED, layout_problem
from curation.rows import FEATURES
from miner.store import DB_NAME


class ExportError(Exception):
    """Bad input to an export; one line."""


def check_out(out: Path, workdirs: list[Path]) -> None:
    """ExportError unless OUT is a folder (or nothing yet) that the export may write into
    without touching a workdir or anything it did not write."""
    if out.is_symlink() and not out.exists():
        raise ExportError(f"--out {out} is a symbolic link to nothing")
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file, not a folder")
    where = out.resolve()
    for workdir in workdirs:
        home = workdir.resolve()
        if where == home or home in where.parents:
            raise ExportError(f"--out {out} is inside --workdir {workdir}: write it elsewhere")
        for name in MANAGED:
            if home == where / name or where / name in home.parents:
                raise ExportError(f"--workdir {workdir} is inside {out / name}: export replaces it")
    problem = layout_problem(out) if out.is_dir() else ""
    if problem:
        raise ExportError(f"--out {out}: {problem}")


def check_workdir(workdir: Path) -> None:
    """ExportError unless `workdir` holds a kminer store (read only: nothing is created)."""
    db = workdir / DB_NAME
    if not workdir.is_dir() or not db.is_file():
        raise ExportError(f"--workdir {workdir}: no kminer store there (run `kminer mine` first)")
    # a closed WAL store is read as an immutable file: a read-only open would still leave
    # -shm/-wal files in the workdir; a store in use (its -wal there) is read the usual way
    idle = not Path(f"{db}-wal").exists()
    uri = f"{db.resolve().as_uri()}?mode=ro" + ("&immutable=1" if idle else "")
    try:
        with closing(sqlite3.connect(uri, uri=True)) as conn:
            query = "select name from sqlite_master where type = 'table'"
            tables = {row[0] for row in conn.execute(query)}
    except sqlite3.Error:
        tables = set()
    if not {"repos", "candidates"} <= tables:
        raise ExportError(f"--workdir {workdir}: its {DB_NAME} is not a kminer store")


def write_shards(rows, stage: Path, shard_rows: int) -> list[dict]:
    """Parquet shards under stage/data and train.jsonl; the rows' light fields for the card.
    Shards are named once the last is written: rows may still drop out on the way."""
    import datasets
    from datasets import Dataset

    datasets.disable_progress_bars()
    data = stage / "data"
    data.mkdir(parents=True)
    light: list[dict] = []
    batch: list[dict] = []
    parts: list[Path] = []
    with (stage / "train.jsonl").open("w", encoding="utf-8") as jsonl:

        def flush() -> None:
            part = data / f"part-{len(parts):05d}.parquet"
            columns = {key: [row[key] for row in batch] for key in FEATURES}
            Dataset.from_dict(columns, features=FEATURES).to_parquet(str(part))
            parts.append(part)
            batch.clear()

        for row in rows:
            batch.append(row)
            jsonl.write(json.dumps(row, ensure_ascii=False) + "\n")
            light.append({k: row[k] for k in card.FIELDS})
            if len(batch) == shard_rows:
                flush()
        if batch:
            flush()
    for index, part in enumerate(parts):
        part.rename(data / f"train-{index:05d}-of-{len(parts):05d}.parquet")
    return light


def report_beside(out: Path) -> Path:
    """Where an empty export's report goes: OUT.export_report.json, beside OUT, not in it."""
    here = Path(os.path.abspath(out))
    return here.parent / f"{here.name or 'export'}.export_report.json"


def replace_all(stage: Path, out: Path) -> None:
    """Move the staged files over the previous export's, all or none: the previous ones go
    into the staging folder first and come back if any move fails. Other files in OUT are
    left alone; a managed path that turned into a link meanwhile stops the export."""
    problem = layout_problem(out)
    if problem:
        raise ExportError(f"--out {out}: {problem}")
    previous = stage / ".previous"
    previous.mkdir()
    moved, placed = [], []
    try:
        for name in MANAGED:
            target = out / name
            if target.exists():
                target.rename(previous / name)
                moved.append(name)
            (stage / name).rename(target)
            placed.append(name)
    except BaseException:
        for name in placed:
            (out / name).rename(stage / name)
        for name in moved:
            (previous / name).rename(out / name)
        raise
