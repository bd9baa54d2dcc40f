"""The runner: the stages of one run over one repository, each the same way.

For each stage it picks the candidates (the `--filter`, the stages it needs, its key against the
stored one unless `--redo`), runs the stage over them, stamps each result with its key and saves
it as soon as it is yielded (a killed run loses at most the candidates in flight), times the
stage, and turns a bug on one candidate into `internal_error` with the traceback in the log,
never into a domain reason and never into the end of the run. The run itself is one row in the
store: its command, status, timings and counters.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

from miner.candidate import Candidate, Reason, StageResult, Status
from miner.clone import RepoSource, fetch_repo
from miner.errors import BadInput, KminerError
from miner.stage import Failed, NullProgress, Progress, RunConfig, RunContext, Stage
from miner.store import Store

log = logging.getLogger(__name__)


def run(
    cfg: RunConfig,
    stages: list[Stage],
    *,
    command: str,
    progress: Progress | None = None,
    store: Store | None = None,
    clone: bool = False,
    make_llm=None,
) -> RunContext:
    """Run `stages` in order over the workdir's repository (fetched first when `clone`).
    `make_llm(store)` gives the LLM client when a stage can use one."""
    workdir = cfg.workdir.resolve()
    store = store or Store.open(workdir, cfg.db_url)
    ctx = RunContext(cfg, store, workdir, progress or NullProgress())
    if not clone:
        _attach_stored(ctx)
    run_id = store.start_run(command)
    status = "failed"
    try:
        if clone:
            with ctx.timed("clone"):
                _attach_clone(ctx)
        if make_llm is not None and any(s.uses_llm for s in stages):
            ctx.llm = make_llm(store)
        for stage in stages:
            with ctx.timed(stage.name.value):
                run_stage(ctx, stage)
        status = "ok"
        return ctx
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        if ctx.llm is not None:
            ctx.counters.update({f"llm_{k}": v for k, v in ctx.llm.usage().items()})
        store.finish_run(run_id, status, ctx.repo_id or None, ctx.timings, ctx.counters)


def _attach_clone(ctx: RunContext) -> None:
    cfg = ctx.cfg
    src = fetch_repo(cfg.repo, ctx.workdir, ref=cfg.ref, submodules=cfg.submodules)
    ctx.src = src
    ctx.repo_id = ctx.store.upsert_repo(
        src.url,
        src.commit,
        ref=src.ref,
        kind=src.kind,
        license=src.license,
        license_file=src.license_file,
        root=str(src.root),
    )


def _attach_stored(ctx: RunContext) -> None:
    """The repository an earlier `kminer mine` fetched into this workdir."""
    repo = ctx.store.repo()
    if repo is None:
        raise BadInput(f"no mined repository in {ctx.workdir}: run `kminer mine` first")
    ctx.repo_id = repo.id
    ctx.src = RepoSource(
        url=repo.url,
        kind=repo.kind,
        commit=repo.commit,
        ref=repo.ref,
        root=Path(repo.root),
        license=repo.license,
        license_file=repo.license_file,
    )
    if not ctx.src.root.exists():
        raise BadInput(f"the sources of {repo.url} are gone from {repo.root}: rerun `kminer mine`")


def _plan(ctx: RunContext, stage: Stage) -> list[tuple[Candidate, str]] | None:
    """(candidate, key) for each candidate the stage has work on now; None: no work."""
    cands = ctx.store.candidates(ctx.repo_id)
    name = stage.name
    if stage.scope == "repo":  # all or nothing: discovery reads the whole tree
        keys = [(c, stage.key(c, ctx)) for c in cands]
        stale = not cands or ctx.cfg.redo
        stale = stale or any(k != (c.stage(name).key if c.stage(name) else None) for c, k in keys)
        stale = stale or not all(stage.fresh(c, ctx) for c in cands)
        if not stale:
            ctx.count(f"reused_{name.value}")
        return keys if stale else None
    todo = []
    for cand in cands:
        if not cand.matches(ctx.cfg.filter):
            continue
        needed = [cand.stage(n) for n in stage.needs]
        if any(r is None or r.status != Status.OK for r in needed):
            if stage.upstream_reason is not None:
                skipped = StageResult(status=Status.SKIPPED, reason=stage.upstream_reason)
                cand.set_stage(name, skipped)
                ctx.store.save(cand, ctx.repo_id)
            continue
        key = stage.key(cand, ctx)
        if key is None:
            continue
        done = cand.stage(name)
        if not ctx.cfg.redo and done is not None and done.key == key and stage.fresh(cand, ctx):
            continue
        todo.append((cand, key))
    return todo or None


def run_stage(ctx: RunContext, stage: Stage) -> None:
    """One stage over the candidates that need it; never raises for a candidate's sake."""
    todo = _plan(ctx, stage)
    per_candidate = stage.scope != "repo"  # a repository-wide stage shows its own progress
    if per_candidate:
        ctx.progress.start(stage.name.value, len(todo or ()))
    try:
        if todo is not None:
            _drive(ctx, stage, todo, per_candidate)
    finally:
        if per_candidate:
            ctx.progress.end(stage.name.value)


def _drive(ctx: RunContext, stage: Stage, todo: list, per_candidate: bool) -> None:
    keys = {cand.id: key for cand, key in todo}
    waiting = {cand.id: cand for cand, _ in todo}
    try:
        for done in stage.run(list(waiting.values()), ctx):
            cand = done.cand if isinstance(done, Failed) else done
            if isinstance(done, Failed):
                _internal_error(ctx, stage, cand, done.error)
            else:
                result = cand.stage(stage.name)
                if result is not None and result.reason != Reason.INTERNAL_ERROR:
                    # (a repository-wide stage may make new candidates: they have no key yet)
                    result.key = keys[cand.id] if cand.id in keys else stage.key(cand, ctx)
                ctx.store.save(cand, ctx.repo_id)
            waiting.pop(cand.id, None)
            if per_candidate:
                ctx.progress.advance(stage.name.value)
    except (KminerError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a bug in the stage's work on the whole batch
        for cand in waiting.values():
            _internal_error(ctx, stage, cand, exc)


def _internal_error(ctx: RunContext, stage: Stage, cand: Candidate, error: BaseException) -> None:
    """Record a bug on one candidate: a closed reason, the traceback in the log, no key (the
    next run tries again)."""
    trace = "".join(traceback.format_exception(error))
    log.error("%s failed on %s (%s):\n%s", stage.name.value, cand.id, cand.kernel.name, trace)
    detail = f"{type(error).__name__}: {error}"[:300]
    cand.set_stage(
        stage.name,
        StageResult(status=Status.ERROR, reason=Reason.INTERNAL_ERROR, detail=detail, key=""),
    )
    ctx.store.save(cand, ctx.repo_id)
