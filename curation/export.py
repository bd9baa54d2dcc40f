"""Accepted candidates of one or more workdirs → a Hugging Face dataset folder.

The folder holds Parquet shards under `data/` (the rows, typed by `rows.FEATURES`), the dataset
card `README.md`, `train.jsonl` (the same rows, for grep) and `export_report.json` (the funnel
and every row left out, with its reason). Filters run in a fixed order, each on what the one
before kept: the license filter, decontamination against `--exclude`, then duplicates, so a
copy dropped for its license never makes a permissive twin lose to it. Only then are the full
rows (label, test and reference text) read, shard by shard, so memory stays bounded by a shard.
Everything is written to a staging folder first and moved into place at the end: a failed export
leaves the previous one untouched.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from curation import card, describe, licenses
from curation.decontam import DEFAULT_OVERLAP, Excluded
from curation.dedup import CROSS_REPO_THRESHOLD, DEFAULT_THRESHOLD, find_duplicates
from curation.instructions import effective, read_label
from curation.reviews import Decision, Reviews
from curation.rows import FEATURES, build_row
from miner.candidate import Candidate, StageName
from miner.stats import funnel
from miner.store import DB_NAME, Store

MANAGED = ("data", "README.md", "train.jsonl", "export_report.json")
SHARD_ROWS = 1000


class Drop(StrEnum):
    """Why an accepted candidate is not a row (closed set: the report and card count them)."""

    MISSING_FILES = "missing_files"  # its label or test is no longer in the workdir
    LICENSE = "license"
    CONTAMINATED = "contaminated"  # overlaps a source given with --exclude
    DUPLICATE = "duplicate"  # the same kernel, comments and whitespace aside
    NEAR_DUPLICATE = "near_duplicate"  # shingle similarity at or above the thresholds


class ExportError(Exception):
    """Bad input to an export; one line."""


@dataclass
class Options:
    workdirs: list[Path]
    out: Path
    allow_license: list[str] = field(default_factory=list)
    exclude: list[Path] = field(default_factory=list)
    overlap: float = DEFAULT_OVERLAP
    threshold: float = DEFAULT_THRESHOLD
    cross_threshold: float = CROSS_REPO_THRESHOLD
    sources: dict[str, str] = field(default_factory=dict)  # local path → public URL
    shard_rows: int = SHARD_ROWS
    describe_with: Callable[[Store], object] | None = None  # store → LLM client, or None
    max_attempts: int = 3


@dataclass
class _Pick:
    """An accepted candidate on its way through the filters (no file text held yet)."""

    cand: Candidate
    review: dict
    workdir: Path
    store: Store
    repo_url: str
    root: Path | None
    summary: dict  # id, kill_rate, num_cases, num_shapes: what dedup ranks by


def public_url(url: str, sources: dict[str, str]) -> str:
    """The URL a row names for its repository: a mapping given for a local path, else the
    path's `origin` remote when it is a git checkout, else the path as mined."""
    for local, public in sources.items():
        same = url == local if _is_url(url) else Path(url).resolve() == Path(local).resolve()
        if same:
            return public
    if _is_url(url):
        return url
    try:
        from git import Repo

        repo = Repo(url)
        return repo.remotes.origin.url if "origin" in repo.remotes else url
    except Exception:  # not a git folder, or gone: the path is all there is
        return url


def _is_url(text: str) -> bool:
    return "://" in text or text.startswith("git@")


def _open(workdir: Path) -> Store:
    if not (workdir / DB_NAME).is_file():
        raise ExportError(f"--workdir {workdir}: no kminer store there (run `kminer mine` first)")
    return Store.open(workdir)


def _picks(
    store: Store, workdir: Path, accepted: dict[str, dict], opts: Options, drops: list[dict]
) -> list[_Pick]:
    repos = store.repos()
    roots = {(r.url, r.commit): Path(r.root) if r.root else None for r in repos}
    urls = {r.url: public_url(r.url, opts.sources) for r in repos}  # a git open per repository
    picks = []
    for cand in store.iter_candidates():
        if cand.id not in accepted:
            continue
        prov, verify = cand.provenance, cand.stage(StageName.VERIFY)
        pick = _Pick(
            cand,
            accepted[cand.id],
            workdir,
            store,
            urls.get(prov.repo_url) or public_url(prov.repo_url, opts.sources),
            roots.get((prov.repo_url, prov.commit)),
            {
                "id": cand.id,
                "kill_rate": verify.metrics.get("kill_rate") if verify else None,
                "repo": prov.repo_url,
                "name": cand.kernel.name,
                "num_cases": cand.tests.num_cases,
                "num_shapes": cand.tests.num_shapes,
            },
        )
        missing = [
            rel
            for rel in (cand.wrapper.label_path, cand.tests.path)
            if not rel or not (workdir / rel).is_file()
        ]
        if missing:
            drops.append(_drop(pick, Drop.MISSING_FILES, f"not in {workdir}: {', '.join(missing)}"))
        else:
            picks.append(pick)
    return picks


def _drop(p: _Pick, reason: Drop, detail: str, kept: str = "") -> dict:
    k = p.cand.kernel
    row = {
        "id": p.cand.id,
        "kernel": k.name,
        "repo": p.repo_url,
        "path": f"{k.file}:{k.line}",
        "license": p.cand.provenance.license,
        "reason": reason.value,
        "detail": detail,
    }
    return row | ({"kept": kept} if kept else {})


def _filter(picks: list[_Pick], opts: Options, drops: list[dict]) -> list[_Pick]:
    allow = licenses.allowed(opts.allow_license)
    kept = []
    for p in picks:
        why = licenses.drop_reason(p.cand.provenance.license, allow)
        if why:
            drops.append(_drop(p, Drop.LICENSE, why))
        else:
            kept.append(p)
    if opts.exclude:
        excluded = Excluded.read(opts.exclude)
        clean = []
        for p in kept:
            share, source = excluded.match(p.cand.kernel.source, opts.overlap)
            if source:
                drops.append(
                    _drop(p, Drop.CONTAMINATED, f"{share:.0%} of its 10-grams are in {source}")
                )
            else:
                clean.append(p)
        kept = clean
    dupes = find_duplicates(
        [p.summary for p in kept],
        [p.cand.kernel.source for p in kept],
        opts.threshold,
        opts.cross_threshold,
    )
    for i, (keep, kind, similarity) in sorted(dupes.items()):
        drops.append(
            _drop(
                kept[i],
                Drop(kind),
                f"similarity {similarity:.2f} with {kept[keep].cand.id}",
                kept=kept[keep].cand.id,
            )
        )
    return [p for i, p in enumerate(kept) if i not in dupes]


def _rows(picks: list[_Pick], model_text: dict[str, str]):
    for p in picks:
        label = read_label(p.workdir, p.cand)
        desc = describe.description(model_text.get(p.cand.id, ""), p.cand, p.root)
        inst = effective(p.cand, p.review, label, desc)
        yield build_row(p.cand, p.review, p.repo_url, p.workdir, label, inst)


def _write_shards(rows, total: int, stage: Path, shard_rows: int) -> list[dict]:
    """Parquet shards under stage/data and train.jsonl; the rows' light fields for the card."""
    import datasets
    from datasets import Dataset

    datasets.disable_progress_bars()
    (stage / "data").mkdir(parents=True)
    shards = max(1, -(-total // shard_rows))
    light, batch, index = [], [], 0
    with (stage / "train.jsonl").open("w", encoding="utf-8") as jsonl:

        def flush() -> None:
            nonlocal index, batch
            name = stage / "data" / f"train-{index:05d}-of-{shards:05d}.parquet"
            columns = {key: [row[key] for row in batch] for key in FEATURES}  # [] when empty
            Dataset.from_dict(columns, features=FEATURES).to_parquet(str(name))
            index, batch = index + 1, []

        for row in rows:
            batch.append(row)
            jsonl.write(json.dumps(row, ensure_ascii=False) + "\n")
            light.append(
                {
                    k: row[k]
                    for k in (
                        "repo",
                        "commit",
                        "license",
                        "strategy",
                        "reference_kind",
                        "kill_rate",
                        "description_source",
                    )
                }
            )
            if len(batch) == shard_rows:
                flush()
        if batch or index == 0:
            flush()
    return light


def export(opts: Options, progress: Callable[[str], None] = lambda _: None) -> dict:
    """Run the export; returns the report (also written to OUT/export_report.json)."""
    started = time.perf_counter()
    if not opts.workdirs:
        raise ExportError("give at least one --workdir")
    if not all(0.0 < v <= 1.0 for v in (opts.threshold, opts.cross_threshold, opts.overlap)):
        raise ExportError(
            "--near-dup-threshold, --cross-repo-threshold and --exclude-overlap must be in (0, 1]"
        )
    stores = [(w, _open(w)) for w in opts.workdirs]
    drops: list[dict] = []
    try:
        picks, funnels = [], []
        for order, (workdir, store) in enumerate(stores):
            accepted = Reviews(store).all(Decision.ACCEPTED)
            mine = _picks(store, workdir, accepted, opts, drops)
            for p in mine:
                p.summary["order"] = order
            found = funnel(store)
            found["repo"] = found.get("repo") or {"url": "", "commit": "", "license": ""}
            # the report is published with the rows: it names the repository, not this machine
            found["repo"]["url"] = public_url(found["repo"]["url"], opts.sources)
            found["repo"]["public_url"] = found["repo"]["url"]
            funnels.append({"workdir": workdir.name, "accepted": len(accepted), **found})
            picks += mine
        progress(f"{len(picks)} accepted candidates with their files")
        kept = _filter(picks, opts, drops)
        kept.sort(key=lambda p: (p.repo_url, p.cand.kernel.file, p.cand.kernel.line, p.cand.id))
        llm_failures = _describe(kept, opts) if opts.describe_with else []
        model_text = {}
        for _, store in stores:
            model_text |= {
                i: a.get("description", "") for i, a in store.passed_attempts(describe.STEP).items()
            }
        opts.out.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".kminer-export-", dir=opts.out))
        try:
            light = _write_shards(_rows(kept, model_text), len(kept), stage, opts.shard_rows)
            report = {
                "rows": len(kept),
                "accepted": len(picks) + sum(d["reason"] == Drop.MISSING_FILES for d in drops),
                "dropped": dict(Counter(d["reason"] for d in drops)),
                "drops": drops,
                "describe_failures": llm_failures,
                "options": {
                    "allow_license": sorted(licenses.allowed(opts.allow_license)),
                    "exclude": [p.name for p in opts.exclude],
                    "exclude_overlap": opts.overlap,
                    "near_dup_threshold": opts.threshold,
                    "cross_repo_threshold": opts.cross_threshold,
                },
                "workdirs": funnels,
                "seconds": 0.0,
            }
            (stage / "README.md").write_text(card.render(report, light), encoding="utf-8")
            report["seconds"] = round(time.perf_counter() - started, 3)
            (stage / "export_report.json").write_text(json.dumps(report, indent=1, default=str))
            _replace(stage, opts.out)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    finally:
        for _, store in stores:
            store.close()
    return report


def _describe(picks: list[_Pick], opts: Options) -> list[dict]:
    """Ask the model for the descriptions not asked yet; the failures, one line each."""
    failures, clients = [], {}
    for p in picks:
        client = clients.setdefault(id(p.store), opts.describe_with(p.store))
        if client is None:
            continue
        why = describe.ask(client, p.store, p.cand, p.workdir, p.root, opts.max_attempts)
        if why:
            failures.append({"id": p.cand.id, "kernel": p.cand.kernel.name, "detail": why})
    return failures


def _replace(stage: Path, out: Path) -> None:
    """Move the staged files over the previous export's (other files in OUT are left alone)."""
    for name in MANAGED:
        old = out / name
        if old.is_dir():
            shutil.rmtree(old)
        elif old.exists():
            old.unlink()
        (stage / name).rename(old)
