"""Accepted candidates of one or more workdirs → a Hugging Face dataset folder.

The folder holds Parquet shards under `data/` (the rows, typed by `rows.FEATURES`), the dataset
card `README.md`, `train.jsonl` (the same rows, for grep) and `export_report.json` (the funnel
and every row left out, with its reason). Filters run in a fixed order, each on what the one
before kept: curator overrides (kept only with `--include-overrides`), the license filter,
decontamination against `--exclude`, then duplicates, so a copy dropped for its license never
makes a permissive twin lose to it. Only then are the full rows (label, test and reference text)
read, shard by shard, so memory stays bounded by a shard; a row whose text looks like it holds a
credential is dropped there. Everything is written to a staging folder first and moved into
place at the end: a failed export leaves the previous one untouched, and so does an empty one
(its report goes beside OUT, to OUT.export_report.json). kminer never writes or deletes through
a symbolic link, nor over a file it did not write.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from curation import card, describe, licenses, ops
from curation.decontam import DEFAULT_OVERLAP, Excluded
from curation.dedup import CROSS_REPO_THRESHOLD, DEFAULT_THRESHOLD, find_duplicates
from curation.export_out import (
    ExportError,
    check_out,
    check_workdir,
    replace_all,
    report_beside,
    write_shards,
)
from curation.instructions import (
    Instructions,
    derive_instruction,
    effective,
    function_of,
    op_complete_text,
    read_label,
)
from curation.reviews import Decision, Reviews
from curation.rows import (
    GPU_PASS,
    build_row,
    environment_secrets,
    public_url,
    redact,
    secret_in,
    verification,
)
from miner.candidate import Candidate, StageName
from miner.stats import funnel
from miner.store import Store

SHARD_ROWS = 1000


class Drop(StrEnum):
    """Why an accepted candidate is not a row (closed set: the report and card count them)."""

    MISSING_FILES = "missing_files"  # its label or test is no longer in the workdir
    OVERRIDE = "override"  # accepted by a curator's override, not a GPU pass (--include-overrides)
    LICENSE = "license"
    CONTAMINATED = "contaminated"  # overlaps a source given with --exclude
    DUPLICATE = "duplicate"  # the same kernel, comments and whitespace aside
    NEAR_DUPLICATE = "near_duplicate"  # shingle similarity at or above the thresholds
    SECRET = "secret"  # a text of the row looks like a credential
    OP_INCOMPLETE = "op_incomplete"  # no op row: not every kernel of the op passed its test


class EmptyExport(ExportError):
    """No row survived: OUT is left as it was; the report went to `report_path`."""

    def __init__(self, message: str, report: dict, report_path: Path | None) -> None:
        super().__init__(message)
        self.report, self.report_path = report, report_path


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
    include_overrides: bool = False  # export rows a curator accepted without a GPU pass


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
    verification: tuple[str, str]  # (gpu_pass | override, why an override)
    op: ops.Op | None = None  # when its label holds several kernels


def _check_options(opts: Options) -> None:
    if not opts.workdirs:
        raise ExportError("give at least one --workdir")
    if not all(0.0 < v <= 1.0 for v in (opts.threshold, opts.cross_threshold, opts.overlap)):
        raise ExportError(
            "--near-dup-threshold, --cross-repo-threshold and --exclude-overlap must be in (0, 1]"
        )
    seen: dict[Path, Path] = {}
    for workdir in opts.workdirs:
        check_workdir(workdir)
        first = seen.setdefault(workdir.resolve(), workdir)
        if first is not workdir:
            raise ExportError(f"--workdir {workdir} is given twice")
    check_out(opts.out, opts.workdirs)


def _picks(
    store: Store, workdir: Path, accepted: dict[str, dict], opts: Options, drops: list[dict]
) -> list[_Pick]:
    repos = store.repos()
    roots = {(r.url, r.commit): Path(r.root) if r.root else None for r in repos}
    urls = {r.url: public_url(r.url, opts.sources) for r in repos}  # a git open per repository
    picks, by_key = [], {}
    for cand in store.iter_candidates():
        if cand.wrapper.label_path:  # an op row needs all its kernels, accepted or not
            ops.collect(by_key, cand, read_label(workdir, cand))
        if cand.id not in accepted:
            continue
        prov, verify = cand.provenance, cand.stage(StageName.VERIFY)
        verified = verification(cand, accepted[cand.id])
        kills = verify.metrics.get("kill_rate") if verify else None
        pick = _Pick(
            cand,
            accepted[cand.id],
            workdir,
            store,
            urls.get(prov.repo_url) or public_url(prov.repo_url, opts.sources),
            roots.get((prov.repo_url, prov.commit)),
            {
                "id": cand.id,
                # an included override never wins over a GPU-passed copy of the same kernel
                "kill_rate": kills if verified[0] == GPU_PASS else -1.0,
                "repo": prov.repo_url,
                "name": cand.kernel.name,
                "num_cases": cand.tests.num_cases,
                "num_shapes": cand.tests.num_shapes,
            },
            verified,
        )
        missing = [
            rel
            for rel in (cand.wrapper.label_path, cand.tests.path)
            if not rel or not (workdir / rel).is_file()
        ]
        if missing:
            where = f"not in workdir {workdir.name}"
            drops.append(_drop(pick, Drop.MISSING_FILES, f"{where}: {', '.join(missing)}"))
        else:
            picks.append(pick)
    op_of = {m.id: op for op in by_key.values() for m in op.members}
    for p in picks:
        p.op = op_of.get(p.cand.id)
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
    allow, kept = licenses.allowed(opts.allow_license), []
    for p in picks:  # an override first: its license never matters when it is left out
        kind, why = p.verification
        license_why = licenses.drop_reason(p.cand.provenance.license, allow)
        if kind != GPU_PASS and not opts.include_overrides:
            drops.append(_drop(p, Drop.OVERRIDE, f"{why} (--include-overrides to export it)"))
        elif license_why:
            drops.append(_drop(p, Drop.LICENSE, license_why))
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


def _rows(picks: list[_Pick], model_text: dict[str, str], drops: list[dict], secrets: dict):
    for p in picks:
        label = read_label(p.workdir, p.cand)
        desc = describe.description(model_text.get(p.cand.id, ""), p.cand, p.root)
        inst = effective(p.cand, p.review, label, desc)
        row = build_row(p.cand, p.review, p.repo_url, p.workdir, label, inst)
        why = secret_in(row, secrets)
        if why:
            drops.append(_drop(p, Drop.SECRET, f"{why}; fix it at the source, then export again"))
        else:
            yield row


def _op_groups(picks: list[_Pick]) -> list[list[_Pick]]:
    """The kept candidates whose labels are one multi-kernel op, best tested first."""
    groups: dict[tuple, list[_Pick]] = {}
    for p in picks:
        if p.op is not None:
            groups.setdefault((str(p.workdir), p.op.key), []).append(p)
    rank = lambda p: (p.summary["kill_rate"] is None, -(p.summary["kill_rate"] or 0.0))  # noqa: E731
    return [sorted(g, key=lambda p: (rank(p), -p.cand.tests.num_cases, p.cand.id))
            for g in groups.values()]  # fmt: skip


def _op_rows(groups: list[list[_Pick]], drops: list[dict], secrets: dict):
    """One op-level row per multi-kernel op whose every kernel passed its test (accepted or
    not): the label and test of its best-tested accepted kernel, the instruction for the whole
    op, the lowest kill rate its kernels measured."""
    for group in groups:
        p = group[0]
        names, failed = p.op.kernels, p.op.incomplete()
        if failed:
            why = f"its kernels did not all pass their tests ({'; '.join(failed)})"
            drops.append(_drop(p, Drop.OP_INCOMPLETE, f"op row of {', '.join(names)}: {why}"))
            continue
        label = read_label(p.workdir, p.cand)
        op_name = p.cand.wrapper.op_map.get("python_name") or function_of(p.cand)
        complete = op_complete_text(p.cand, label, op_name)
        inst = Instructions(derive_instruction(complete), complete, "", False)
        row = build_row(p.cand, p.review, p.repo_url, p.workdir, label, inst, op_kernels=names)
        row["id"] = ops.op_id(p.repo_url, p.cand.provenance.commit, function_of(p.cand), names)
        row["kill_rate"] = p.op.kill_rate()
        why = secret_in(row, secrets)
        if why:
            drops.append(_drop(p, Drop.SECRET, f"{why}; fix it at the source, then export again"))
        else:
            yield row


def _report(rows: list[dict], picks, drops, failures, opts: Options, funnels, secrets) -> dict:
    report = {
        "rows": len(rows),
        "accepted": len(picks) + sum(d["reason"] == Drop.MISSING_FILES for d in drops),
        "verification": dict(Counter(r["verification"] for r in rows)),
        "levels": dict(Counter(r["level"] for r in rows)),
        "dropped": dict(Counter(d["reason"] for d in drops)),
        "drops": drops,
        "describe_failures": failures,
        "options": {
            "allow_license": sorted(licenses.allowed(opts.allow_license)),
            "exclude": [p.name for p in opts.exclude],
            "exclude_overlap": opts.overlap,
            "near_dup_threshold": opts.threshold,
            "cross_repo_threshold": opts.cross_threshold,
            "include_overrides": opts.include_overrides,
        },
        "workdirs": funnels,
        "seconds": 0.0,
    }
    return redact(report, secrets)


def _empty(report: dict, out: Path) -> EmptyExport:
    """Write the report beside OUT (OUT itself untouched); the one-line error to raise."""
    path, tmp = report_beside(out), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".kminer-report-", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1, default=str)
        os.replace(tmp, path)  # replaces a link at `path` itself, never what it points to
        where = f"report: {path}"
    except OSError as exc:
        if tmp:
            with suppress(OSError):
                os.unlink(tmp)
        where, path = f"report not written ({exc.strerror or exc})", None
    dropped = ", ".join(f"{k} {n}" for k, n in report["dropped"].items())
    why = (
        f"none of the {report['accepted']} accepted candidates survived (left out: {dropped})"
        if report["accepted"]
        else "no accepted candidates in the workdirs"
    )
    return EmptyExport(f"nothing exported: {why}; {out} left as it was; {where}", report, path)


def export(opts: Options, progress: Callable[[str], None] = lambda _: None) -> dict:
    """Run the export; returns the report (also written to OUT/export_report.json).
    EmptyExport when no row survives: OUT is left exactly as it was."""
    started = time.perf_counter()
    _check_options(opts)
    secrets = environment_secrets()
    stores = [(w, Store.open(w)) for w in opts.workdirs]
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
        if not kept:
            raise _empty(_report([], picks, drops, [], opts, funnels, secrets), opts.out)
        kept.sort(key=lambda p: (p.repo_url, p.cand.kernel.file, p.cand.kernel.line, p.cand.id))
        llm_failures = _describe(kept, opts) if opts.describe_with else []
        model_text = {}
        for _, store in stores:
            model_text |= {
                i: a.get("description", "") for i, a in store.passed_attempts(describe.STEP).items()
            }
        rows = itertools.chain(
            _rows(kept, model_text, drops, secrets), _op_rows(_op_groups(kept), drops, secrets)
        )
        report = _write(opts, rows, lambda light: _report(
            light, picks, drops, llm_failures, opts, funnels, secrets))  # fmt: skip
    finally:
        for _, store in stores:
            store.close()
    report["seconds"] = round(time.perf_counter() - started, 3)
    return report


def _write(opts: Options, rows, make_report: Callable[[list[dict]], dict]) -> dict:
    """Stage the shards, card and report inside OUT, then move them over the previous ones."""
    out = opts.out
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        stage = Path(tempfile.mkdtemp(prefix=".kminer-export-", dir=out))
        try:
            light = write_shards(rows, stage, opts.shard_rows)
            report = make_report(light)
            if not light:
                raise _empty(report, out)
            (stage / "README.md").write_text(card.render(report, light), encoding="utf-8")
            (stage / "export_report.json").write_text(json.dumps(report, indent=1, default=str))
            replace_all(stage, out)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    except BaseException:
        if created:
            with suppress(OSError):
                out.rmdir()  # only ever an empty folder this export made
        raise
    stale = report_beside(out)  # an earlier empty export's report no longer describes OUT
    if stale.is_file() and not stale.is_symlink():
        stale.unlink()
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
