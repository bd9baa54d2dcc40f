"""The wrap stage: a label per kernel — the kernel, a torch-tensor host wrapper and a binding.

Tried in order: the repository's own launcher (mined), a signature-driven template (rule), and,
when an endpoint is set, a model (llm; its build checks share the build stage's verdict cache).
A kernel none of them can wrap waits with `needs_llm`, and is tried again when a model is there.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

from miner.candidate import Candidate, Reason, StageName, StageResult, Status
from miner.extract import Extractor
from miner.stage import Done, RunContext, Stage
from wrappers import through_forward
from wrappers.build import BuildResult, build_batch
from wrappers.kernel_twin import find_twin, has_twin, kernel_adapter
from wrappers.label import Exposed, Label, render_label, unit_parts, with_wrapper_includes
from wrappers.llm.flow import wrap_with_llm
from wrappers.mined import LauncherIndex, mine_wrapper, unmined_why
from wrappers.opmap import functions_by_name, op_map
from wrappers.rule import TEMPLATE_ID as RULE_TEMPLATE
from wrappers.rule import rule_wrapper
from wrappers.verdicts import cached_build


class NoLabel(Exception):
    """Why a candidate got no label: a closed reason, and the detail for humans."""

    def __init__(self, status: Status, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail


class Wrap(Stage):
    name = StageName.WRAP
    needs = (StageName.DISCOVER,)
    uses_llm = True

    def key(self, cand: Candidate, ctx: RunContext) -> str:
        compiled = cand.stage(StageName.COMPILE)
        unit = f"{cand.unit.hash}|{compiled.status.value if compiled else ''}"
        return hashlib.sha256(f"{self.version()}|{unit}".encode()).hexdigest()[:16]

    def fresh(self, cand: Candidate, ctx: RunContext) -> bool:
        done = cand.stage(self.name)
        if done.reason == Reason.NEEDS_LLM and ctx.llm is not None:
            return False  # a model may wrap what mined and rule could not
        label = ctx.workdir / cand.wrapper.label_path if cand.wrapper.label_path else None
        return done.status != Status.OK or bool(label and label.is_file())

    def run(self, batch: list[Candidate], ctx: RunContext) -> Iterator[Done]:
        disc = ctx.ensure_discovery()
        extractor, index = Extractor(disc), LauncherIndex(disc)
        functions = functions_by_name(disc)
        (ctx.workdir / "labels").mkdir(exist_ok=True)
        ctx.counters["waiting_for_llm"] = 0
        yield from self.each(batch, lambda cand: self._wrap(cand, ctx, extractor, index, functions))

    def _wrap(self, cand: Candidate, ctx: RunContext, extractor, index, functions) -> None:
        start = time.perf_counter()
        try:
            label = _mined_label(ctx, cand, extractor, index)
            if label is None or not has_twin(cand.wrapper.chain, functions):
                label = _twin_label(ctx, cand, index, functions) or label
            label = label or _rule_label(ctx, cand)
            if label is None and ctx.llm is not None:
                label = _llm_label(ctx, cand)
            if label is None:
                why = f"{_no_label_why(cand)}: {unmined_why(ctx.found[cand.id], extractor, index)}"
                raise NoLabel(Status.SKIPPED, Reason.NEEDS_LLM, why)
        except NoLabel as why:
            ctx.counters["waiting_for_llm"] += why.reason == Reason.NEEDS_LLM
            result = StageResult(status=why.status, reason=why.reason, detail=why.detail)
            cand.set_stage(self.name, result)
            return
        path = ctx.workdir / "labels" / f"{cand.id}.cu"
        data = label.text.encode("latin-1", errors="replace")
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
        cand.wrapper.strategy = label.strategy
        cand.wrapper.functions = [f.name for f in label.functions]
        cand.wrapper.label_path = str(path.relative_to(ctx.workdir))
        cand.wrapper.label_hash = label.hash
        result = StageResult(
            status=Status.OK, detail=label.strategy, seconds=time.perf_counter() - start
        )
        cand.set_stage(self.name, result)


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


def _mined_label(ctx: RunContext, cand: Candidate, extractor, index) -> Label | None:
    """The repository's own launcher, or the nearest caller pybind can bind."""
    compiled = tuple(cand.unit.compiled_types or ())
    mined = mine_wrapper(ctx.found[cand.id], extractor, index, compiled)
    if mined is None:
        return None
    cand.wrapper.launcher = mined.chain[0]
    cand.wrapper.chain = mined.chain
    cand.wrapper.op_map = op_map(ctx.discovery, mined.chain, index.callers)
    mined = _behind_forward(ctx, cand, mined, extractor, index, compiled) or mined
    return render_label(
        strategy="mined",
        launcher=mined.chain[-1],
        includes=mined.includes,
        device_code=mined.code,
        host_code="",
        functions=mined.functions(),
        **_label_facts(cand),
    )


def _behind_forward(ctx: RunContext, cand: Candidate, mined, extractor, index, compiled):
    """The mined label with the backward's forward and kminer's glue beside it, where the
    backward takes what only its forward computes (wrappers.through_forward); else None."""
    fk = ctx.found[cand.id]
    found = through_forward.plan(cand, cand.wrapper.op_map, mined.exposed[0], ctx.discovery,
                                 index, ctx.found)  # fmt: skip
    if found is None:
        return None
    item, chain, fwd_map, flow = found
    fwd_sig = index.signature(item)
    made = through_forward.glue(flow, fwd_sig, mined.exposed[0]) if fwd_sig else None
    both = mine_wrapper(fk, extractor, index, compiled, also=item) if made else None
    if both is None:
        return None
    sig, code = made
    both.code = f"{both.code}\n\n{code}"
    both.exposed = [sig, *both.exposed]  # the glue first: the function its test calls
    cand.wrapper.op_map["through_forward"] = {
        "function": sig.name,
        "alone": through_forward.runs_alone(flow, mined.exposed[0]),
        "forward": flow.forward,
        "flow_file": flow.file,
        "gradients": [k for k, _ in flow.gradients],  # the Function's arguments, in order
        "forward_call": [list(s) for s in flow.forward_call],
        "function_outputs": [list(s) if s else None for s in flow.outputs],
        "out_grads": [p[1].removeprefix("kminer_grad_") for p in sig.params[len(fwd_sig.params) :]],
        "forward_wrapper": {
            "launcher": chain[0], "chain": chain, "functions": [fwd_sig.name], "op_map": fwd_map,
        },
    }  # fmt: skip
    return both


def _twin_label(ctx: RunContext, cand: Candidate, index, functions) -> Label | None:
    """The kernel alone behind kminer's adapter, where a CPU function of its very parameters
    is its twin and the mined label's functions have none (wrappers.kernel_twin)."""
    compiled = cand.stage(StageName.COMPILE)
    if compiled is None or compiled.status != Status.OK:
        return None
    if find_twin(cand.kernel, index, functions) is None:
        return None
    includes, device = unit_parts((ctx.workdir / cand.unit.path).read_text("latin-1"))
    dtypes = tuple(cand.unit.compiled_types or ()) or ("float", "double")
    made = kernel_adapter(cand.kernel, ctx.found[cand.id], index, device, dtypes)
    if made is None:
        return None
    sig, adapter = made
    cand.wrapper.launcher = cand.kernel.name
    cand.wrapper.chain = [cand.kernel.name]
    cand.wrapper.op_map = {}
    return render_label(
        strategy="mined",
        launcher=cand.kernel.name,
        includes=with_wrapper_includes(includes),
        device_code=device,
        host_code=adapter,
        functions=[Exposed(sig.name, sig.reference())],
        **_label_facts(cand),
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


def _rule_label(ctx: RunContext, cand: Candidate) -> Label | None:
    """The element-wise template, for a kernel whose unit compiles and whose signature fits."""
    compiled = cand.stage(StageName.COMPILE)
    if compiled is None or compiled.status != Status.OK:
        return None
    rule = rule_wrapper(cand)
    if rule is None:
        return None
    cand.wrapper.template_id = RULE_TEMPLATE
    return rule_label(cand, rule, (ctx.workdir / cand.unit.path).read_text("latin-1"))


def _no_label_why(cand: Candidate) -> str:
    compiled = cand.stage(StageName.COMPILE)
    return "no_rule" if compiled is not None and compiled.status == Status.OK else "no_unit"


def _llm_label(ctx: RunContext, cand: Candidate) -> Label:
    """The LLM path; its build checks go through the cache the build stage reads."""

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
        reason = result.reason or Reason.LLM_FAILED
        raise NoLabel(Status.ERROR, reason, f"llm: {reason.value}: {result.detail}")
    return result.label
