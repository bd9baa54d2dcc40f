"""The wrap and build stages: a label per kernel (mined → rule → LLM), then its build check.

Wrap results are keyed by the code that made them and the label's hash; build verdicts by the
label's hash, the compiler and the torch headers. A rerun therefore re-renders nothing it has and
compiles nothing it has already judged.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING

from miner.candidate import Candidate, Reason, Stage, StageResult, Status
from miner.compile import nvcc_path
from miner.stages import matches
from wrappers.build import BuildResult, build_batch
from wrappers.label import Label, render_label, unit_parts, with_wrapper_includes
from wrappers.mined import LauncherIndex, mine_wrapper
from wrappers.opmap import op_map
from wrappers.rule import TEMPLATE_ID as RULE_TEMPLATE
from wrappers.rule import rule_wrapper
from wrappers.verdicts import build_key, cached_build, remember

if TYPE_CHECKING:
    from miner.pipeline import RunContext

log = logging.getLogger(__name__)
_WRAP_MODULES = (
    "build.py",
    "label.py",
    "mined.py",
    "opmap.py",
    "rule.py",
    "signature.py",
    "stage.py",
)


def wrapper_version() -> str:
    """Hash of the code and prompts that make labels: new code rewraps, the same does not."""
    from miner.pipeline import extractor_version, files_hash

    here = Path(__file__).parent
    return files_hash(
        [
            *(here / name for name in _WRAP_MODULES),
            *sorted(here.glob("llm/*.py")),
            *sorted(here.parent.glob("prompts/*.j2")),
        ],
        extra=extractor_version(),
    )


def _label_facts(cand: Candidate) -> dict:
    """What every label's header says of its candidate."""
    prov = cand.provenance
    return dict(
        cand_id=cand.id,
        kernel=cand.kernel.name,
        repo_url=prov.repo_url,
        commit=prov.commit,
        file=cand.kernel.file,
        line=cand.kernel.line,
        license=prov.license,
    )


def rule_label(cand: Candidate, rule, unit_text: str) -> Label:
    """The label of a rule wrapper: the unit's includes and device code, then the host code."""
    includes, device = unit_parts(unit_text)
    return render_label(
        strategy="rule",
        launcher="",
        includes=with_wrapper_includes(includes),
        device_code=device,
        host_code=rule.host_code,
        functions=rule.functions,
        **_label_facts(cand),
    )


def _label_for(ctx: RunContext, cand: Candidate, extractor, index) -> tuple[Label | None, str]:
    """(label, strategy or why none): mined first, then the rule, else nothing (LLM later)."""
    fk = ctx.found[cand.id]
    common = _label_facts(cand)
    mined = mine_wrapper(fk, extractor, index)
    if mined is not None:
        cand.wrapper.launcher = mined.chain[0]
        cand.wrapper.chain = mined.chain
        cand.wrapper.op_map = op_map(ctx.discovery, mined.chain, index.callers)
        label = render_label(
            strategy="mined",
            launcher=mined.chain[-1],
            includes=mined.includes,
            device_code=mined.code,
            host_code="",
            functions=mined.functions(),
            **common,
        )
        return label, "mined"
    compiled = cand.stage(Stage.COMPILE)
    if compiled is None or compiled.status != Status.OK:
        return None, "no_unit"
    rule = rule_wrapper(cand)
    if rule is None:
        return None, "no_rule"
    label = rule_label(cand, rule, (ctx.workdir / cand.unit.path).read_text("latin-1"))
    cand.wrapper.template_id = RULE_TEMPLATE
    return label, "rule"


def run_wrap(ctx: RunContext, cands: list[Candidate]) -> None:
    from miner.extract import Extractor

    version = wrapper_version()
    todo = []
    for cand in cands:
        done = cand.stage(Stage.WRAP)
        label_file = ctx.workdir / cand.wrapper.label_path if cand.wrapper.label_path else None
        if not matches(cand, ctx.cfg.filter):
            continue
        if (
            not ctx.cfg.redo
            and done is not None
            and done.key == version
            and (done.status != Status.OK or (label_file and label_file.exists()))
            and not (done.reason == Reason.NEEDS_LLM and ctx.llm is not None)
        ):
            continue
        todo.append(cand)
    ctx.progress.start(Stage.WRAP.value, len(todo))
    if not todo:
        ctx.progress.end(Stage.WRAP.value)
        return
    ctx.ensure_discovery()
    extractor, index = Extractor(ctx.discovery), LauncherIndex(ctx.discovery)
    labels = ctx.workdir / "labels"
    labels.mkdir(exist_ok=True)
    waiting = 0
    for cand in todo:
        start = time.perf_counter()
        try:
            label, why = _label_for(ctx, cand, extractor, index)
            if label is None and ctx.llm is not None:
                label, why = _llm_label(ctx, cand)
        except Exception as exc:  # one broken candidate never stops the stage
            log.exception("wrap failed for %s", cand.id)
            label, why = None, f"error: {type(exc).__name__}: {exc}"
        if label is None:
            status, reason = _why_not(why)
            waiting += reason == Reason.NEEDS_LLM
            cand.set_stage(
                Stage.WRAP, StageResult(status=status, reason=reason, detail=why, key=version)
            )
        else:
            path = labels / f"{cand.id}.cu"
            data = label.text.encode("latin-1", errors="replace")
            if not path.exists() or path.read_bytes() != data:
                path.write_bytes(data)
            cand.wrapper.strategy = label.strategy
            cand.wrapper.functions = [f.name for f in label.functions]
            cand.wrapper.label_path = str(path.relative_to(ctx.workdir))
            cand.wrapper.label_hash = label.hash
            cand.set_stage(
                Stage.WRAP,
                StageResult(
                    status=Status.OK,
                    detail=label.strategy,
                    key=version,
                    seconds=time.perf_counter() - start,
                ),
            )
        ctx.store.save(cand, ctx.repo_id)
        ctx.progress.advance(Stage.WRAP.value)
    ctx.counters["waiting_for_llm"] = waiting
    ctx.progress.end(Stage.WRAP.value)


def _why_not(why: str) -> tuple[Status, Reason]:
    """Status and reason of a candidate that got no label, from the explanation it got."""
    if why.startswith("llm:"):
        name = why.split(":")[1].strip()
        known = name in {r.value for r in Reason}
        return Status.ERROR, Reason(name) if known else Reason.LLM_FAILED
    if why.startswith("error"):
        return Status.ERROR, Reason.LLM_FAILED
    return Status.SKIPPED, Reason.NEEDS_LLM


def _llm_label(ctx: RunContext, cand: Candidate) -> tuple[Label | None, str]:
    """The LLM path; its build checks go through the cache the build stage reads."""
    from wrappers.llm.flow import wrap_with_llm

    def build(cid: str, text: str) -> BuildResult:
        return build_batch([(cid, text)], timeout=ctx.cfg.build_timeout)[cid]

    unit_text = (ctx.workdir / cand.unit.path).read_text("latin-1")
    result = wrap_with_llm(
        cand,
        unit_text,
        client=ctx.llm,
        store=ctx.store,
        build=cached_build(build, ctx.store),
        max_attempts=ctx.cfg.max_attempts,
    )
    cand.wrapper.template_id = result.template_id
    cand.wrapper.template_hash = result.template_hash
    cand.wrapper.attempts = result.attempts
    if result.label is None:
        reason = result.reason.value if result.reason else Reason.LLM_FAILED.value
        return None, f"llm: {reason}: {result.detail}"
    return result.label, "llm"


def _apply_build(
    ctx: RunContext, cand: Candidate, key: str, ok: bool, detail: str, seconds: float, log_text: str
) -> None:
    if log_text:
        logs = ctx.workdir / "logs"
        logs.mkdir(exist_ok=True)
        (logs / f"{cand.id}.build.log").write_text(log_text, encoding="utf-8")
    reason = None
    if not ok:
        reason = Reason.BUILD_TIMEOUT if "timed out" in detail else Reason.BUILD_ERROR
    cand.set_stage(
        Stage.BUILD,
        StageResult(
            status=Status.OK if ok else Status.ERROR,
            reason=reason,
            detail=detail,
            key=key,
            seconds=seconds,
        ),
    )
    ctx.store.save(cand, ctx.repo_id)


GB_PER_BUILD = 5.0  # one batch unit with torch headers: ~3 GB for 8 labels, ~4-5 GB for 16


def build_workers(wanted: int, batches: int) -> int:
    """Parallel batch builds, capped by the memory available (never below one)."""
    try:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        available_gb = int(info["MemAvailable"].split()[0]) / 1024 / 1024
    except (OSError, KeyError, ValueError):
        available_gb = GB_PER_BUILD * wanted
    return max(1, min(wanted, batches, int(available_gb // GB_PER_BUILD)))


def run_build(ctx: RunContext, cands: list[Candidate]) -> None:
    """Build-check labels in batches (one torch-header parse per batch), batches in parallel."""
    todo: list[tuple[Candidate, str, str]] = []
    for cand in cands:
        wrap = cand.stage(Stage.WRAP)
        if not matches(cand, ctx.cfg.filter) or wrap is None or wrap.status != Status.OK:
            continue
        key = build_key(cand.wrapper.label_hash)
        done = cand.stage(Stage.BUILD)
        if not ctx.cfg.redo and done is not None and done.key == key:
            continue
        hit = None if ctx.cfg.redo else ctx.store.cached_compile(key)
        if hit is not None:
            _apply_build(ctx, cand, key, hit.status == "ok", hit.detail, hit.seconds, hit.log)
            continue
        todo.append((cand, key, (ctx.workdir / cand.wrapper.label_path).read_text("latin-1")))
    ctx.counters["built"] = len(todo)
    ctx.progress.start(Stage.BUILD.value, len(todo))
    if not todo:
        ctx.progress.end(Stage.BUILD.value)
        return
    if nvcc_path() is None:
        for cand, _key, _ in todo:
            cand.set_stage(
                Stage.BUILD, StageResult(status=Status.SKIPPED, reason=Reason.NO_COMPILER, key="")
            )
            ctx.store.save(cand, ctx.repo_id)
        ctx.progress.end(Stage.BUILD.value)
        return
    size = max(1, ctx.cfg.batch_size)
    batches = [todo[i : i + size] for i in range(0, len(todo), size)]
    by_id = {cand.id: (cand, key) for cand, key, _ in todo}
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=build_workers(ctx.cfg.build_jobs, len(batches))) as pool:
        futures = [
            pool.submit(build_batch, [(c.id, t) for c, _, t in batch], ctx.cfg.build_timeout)
            for batch in batches
        ]
        for fut in as_completed(futures):
            for cid, r in fut.result().items():
                cand, key = by_id[cid]
                remember(ctx.store, key, r)
                _apply_build(ctx, cand, key, r.ok, r.detail, r.seconds, r.log)
                ctx.progress.advance(Stage.BUILD.value)
    ctx.counters["build_wall_ms"] = int((time.perf_counter() - start) * 1000)
    ctx.progress.end(Stage.BUILD.value)
