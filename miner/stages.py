"""The mining stages. Each takes the run context and the candidates and records its verdict on
every candidate it touches; a candidate whose stage already holds a result for the same inputs
is left alone, which is what makes reruns cheap and kills harmless."""

from __future__ import annotations

import fnmatch
import logging
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING

from miner.candidate import (
    Candidate,
    Dep,
    Kernel,
    Param,
    Provenance,
    Reason,
    Stage,
    StageResult,
    Status,
    TemplateParam,
    candidate_id,
)
from miner.compile import cache_key, compile_unit
from miner.textprep import readable

if TYPE_CHECKING:
    from miner.discover import Discovery, FoundKernel
    from miner.pipeline import RunContext

log = logging.getLogger(__name__)


def matches(cand: Candidate, pattern: str | None) -> bool:
    if not pattern:
        return True
    k = cand.kernel
    return any(fnmatch.fnmatch(s, pattern) for s in (k.file, k.name, f"{k.file}::{k.name}"))


def to_candidate(fk: FoundKernel, disc: Discovery, prov: Provenance) -> Candidate:
    kd = fk.kdef
    kernel = Kernel(
        name=kd.name,
        namespace="::".join(n for n in kd.namespace if not n.startswith("extern")),
        file=fk.file,
        line=fk.line,
        start_line=fk.start_line,
        end_line=fk.end_line,
        params=[Param(type=t, name=n, text=x) for t, n, x in kd.params],
        template_params=[TemplateParam(**tp) for tp in kd.template_params],
        specialization=kd.specialization,
        qualifiers=kd.qualifiers,
        source=readable(fk.source),
        from_macro=fk.from_macro,
        parse_fallback=fk.parse_fallback,
    )
    cand = Candidate(
        id=candidate_id(prov.repo_url, prov.commit, kernel),
        provenance=prov,
        kernel=kernel,
        launches=disc.launches.get(id(kd), []),
    )
    reason = (
        Reason.PARSE_FALLBACK
        if fk.parse_fallback
        else (None if cand.launches else Reason.NOT_LAUNCHED)
    )
    detail = f"{len(cand.launches)} launch sites" if cand.launches else "never launched"
    cand.set_stage(Stage.DISCOVER, StageResult(status=Status.OK, reason=reason, detail=detail))
    return cand


def run_discover(ctx: RunContext) -> list[Candidate]:
    """Find kernels and merge them with what the store already knows (keeping later stages)."""
    from miner.discover import discover

    started = False

    def on_file(total: int) -> None:
        nonlocal started
        if not started:
            ctx.progress.start(Stage.DISCOVER.value, total)
            started = True
        ctx.progress.advance(Stage.DISCOVER.value)

    disc = discover(ctx.src.root, max_bytes=ctx.cfg.max_file_bytes, on_file=on_file)
    if started:
        ctx.progress.end(Stage.DISCOVER.value)
    ctx.discovery = disc
    prov = Provenance(repo_url=ctx.src.url, commit=ctx.src.commit, license=ctx.src.license)
    known = {c.id: c for c in ctx.store.candidates(ctx.repo_id)}
    fresh: list[Candidate] = []
    ctx.found = {}
    for fk in disc.kernels:
        cand = to_candidate(fk, disc, prov)
        ctx.found[cand.id] = fk
        old = known.get(cand.id)
        if old is not None:
            cand.stages = {**old.stages, Stage.DISCOVER.value: cand.stages[Stage.DISCOVER.value]}
            cand.closure, cand.unit = old.closure, old.unit
        fresh.append(cand)
    ctx.store.save(fresh, ctx.repo_id)
    ctx.store.replace_file_skips(ctx.repo_id, [(p, r.value) for p, r in disc.inventory.skipped])
    ctx.discovery_info = {
        "files": len(disc.inventory.files),
        "skipped": disc.inventory.skip_counts(),
        "invalid_utf8": len(disc.inventory.invalid_utf8),
        "declarations": disc.declarations,
        "instantiations": disc.instantiations,
        "parse_error_files": len(disc.parse_errors),
    }
    return fresh


def run_closure(ctx: RunContext, cands: list[Candidate]) -> None:
    """Build each kernel's standalone unit; rewrite it only when its text changed."""
    from miner.extract import Extractor

    extractor = Extractor(ctx.discovery)
    units = ctx.workdir / "units"
    units.mkdir(exist_ok=True)
    todo = [c for c in cands if matches(c, ctx.cfg.filter)]
    ctx.progress.start(Stage.CLOSURE.value, len(todo))
    for cand in todo:
        fk = ctx.found[cand.id]
        t0 = time.perf_counter()
        try:
            header = (
                f"kminer unit {cand.id}: {cand.kernel.name} from {ctx.src.url}@"
                f"{ctx.src.commit[:12]} {cand.kernel.file}:{cand.kernel.line}"
            )
            result = extractor.extract(fk, header)
        except Exception as exc:  # a bug on one kernel must not stop the run
            log.exception("closure failed for %s", cand.id)
            cand.set_stage(
                Stage.CLOSURE,
                StageResult(
                    status=Status.ERROR,
                    reason=Reason.EXTRACT_FAILED,
                    detail=f"{type(exc).__name__}: {exc}"[:300],
                ),
            )
            ctx.store.save(cand, ctx.repo_id)
            ctx.progress.advance(Stage.CLOSURE.value)
            continue
        path = units / f"{cand.id}.cu"
        data = result.unit.text.encode("latin-1")
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
        entries = [e for e in result.closure.entries if e.item is not fk.kdef.item]
        cand.closure = [
            Dep(
                kind=e.item.kind,
                name=(e.item.names or (e.item.target,))[0],
                file=e.item.file,
                line=e.item.line,
            )
            for e in entries
        ]
        cand.unit.path = str(path.relative_to(ctx.workdir))
        cand.unit.hash = result.unit.hash
        cand.unit.needs_torch = result.unit.needs_torch
        cand.unit.instantiations = result.unit.instantiations
        cand.set_stage(
            Stage.CLOSURE,
            StageResult(
                status=Status.OK,
                key=result.unit.hash,
                seconds=time.perf_counter() - t0,
                detail=_closure_detail(len(entries), result),
            ),
        )
        ctx.store.save(cand, ctx.repo_id)
        ctx.progress.advance(Stage.CLOSURE.value)
    ctx.progress.end(Stage.CLOSURE.value)


def _closure_detail(n_deps: int, result) -> str:
    parts = [f"{n_deps} deps"]
    if result.closure.from_tu:
        parts.append(f"context from {result.closure.from_tu}")
    if result.pruned:
        parts.append(f"libclang dropped {result.pruned} unused same-named definitions")
    return ", ".join(parts)


def run_compile(ctx: RunContext, cands: list[Candidate]) -> None:
    """nvcc every unit in parallel; results keyed by content hash are never compiled twice."""
    todo: list[tuple[Candidate, str, str]] = []
    for cand in cands:
        closure = cand.stage(Stage.CLOSURE)
        if not matches(cand, ctx.cfg.filter):
            continue
        if closure is None or closure.status != Status.OK:
            cand.set_stage(
                Stage.COMPILE, StageResult(status=Status.SKIPPED, reason=Reason.UPSTREAM_FAILED)
            )
            ctx.store.save(cand, ctx.repo_id)
            continue
        path = ctx.workdir / cand.unit.path
        if not path.exists():
            continue
        key = cache_key(cand.unit.hash, cand.unit.needs_torch)
        done = cand.stage(Stage.COMPILE)
        if not ctx.cfg.redo and done is not None and done.key == key:
            continue
        cached = None if ctx.cfg.redo else ctx.store.cached_compile(key)
        if cached is not None:
            _apply(
                ctx,
                cand,
                key,
                cached.status,
                cached.reason,
                cached.detail,
                cached.compiled_types,
                cached.text,
                cached.log,
                cached.seconds,
                path,
            )
            continue
        todo.append((cand, key, path.read_bytes().decode("latin-1")))
    ctx.progress.start(Stage.COMPILE.value, len(todo))
    ctx.counters["compiled"] = len(todo)
    if not todo:
        ctx.progress.end(Stage.COMPILE.value)
        return
    pool = ThreadPoolExecutor(max_workers=max(1, ctx.cfg.jobs))
    try:
        futures = {
            pool.submit(
                compile_unit,
                text,
                cand.unit.needs_torch,
                cand.unit.instantiations,
                ctx.cfg.compile_timeout,
            ): (cand, key)
            for cand, key, text in todo
        }
        for fut in as_completed(futures):
            cand, key = futures[fut]
            r = fut.result()
            ctx.store.put_compile(
                key,
                status=r.status.value,
                reason=r.reason.value if r.reason else None,
                detail=r.detail,
                compiled_types=r.compiled_types,
                text=r.text,
                log=r.log,
                seconds=r.seconds,
            )
            _apply(
                ctx,
                cand,
                key,
                r.status.value,
                r.reason.value if r.reason else None,
                r.detail,
                r.compiled_types,
                r.text,
                r.log,
                r.seconds,
                ctx.workdir / cand.unit.path,
            )
            ctx.progress.advance(Stage.COMPILE.value)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        ctx.progress.end(Stage.COMPILE.value)


def _apply(
    ctx: RunContext,
    cand: Candidate,
    key: str,
    status: str,
    reason: str | None,
    detail: str,
    types: list[str],
    text: str,
    log_text: str,
    seconds: float,
    path: Path,
) -> None:
    data = text.encode("latin-1", errors="replace")
    if text and path.read_bytes() != data:
        path.write_bytes(data)
    logs = ctx.workdir / "logs"
    logs.mkdir(exist_ok=True)
    (logs / f"{cand.id}.compile.log").write_text(log_text, encoding="utf-8")
    cand.unit.compiled_types = types
    cand.set_stage(
        Stage.COMPILE,
        StageResult(
            status=Status(status),
            reason=Reason(reason) if reason else None,
            detail=detail,
            key=key,
            seconds=seconds,
        ),
    )
    ctx.store.save(cand, ctx.repo_id)
