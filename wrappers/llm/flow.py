"""The LLM wrapper path: analysis → host code → build check → reflection, every attempt kept.

Kernels that have no launcher to mine and fit no rule still have a contract the code states; a
model can read it. We ask first for an analysis (shapes, roles, launch geometry, the contract as
an expression) so that the code step writes against an explicit reading of the kernel and the
curator can check that reading. The code answer fills the host half of prompts/label.cu.j2; the
device half is the mined unit, unchanged. The compiler is the judge: its errors go back to the
model as the next turn of the same conversation, up to `max_attempts` answers. A wrong answer is
data (stored, fed back), never retried blindly; only the endpoint failing ends the flow early.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from miner.candidate import Candidate, Reason, Status
from miner.store import Store
from wrappers.build import BuildFn
from wrappers.label import (
    Exposed,
    Label,
    environment,
    render_label,
    template_hash,
    unit_parts,
    with_wrapper_includes,
)
from wrappers.llm.client import LLMClient, LLMUnavailable, Reply
from wrappers.llm.compiler import LineMapper, error_excerpt
from wrappers.llm.parse import (
    AnswerError,
    CodeAnswer,
    c_string,
    contract_problem,
    parse_analysis,
    parse_code,
    split_includes,
)

ANALYSIS = "llm_analysis.v1.j2"
CODE = "llm_code.v1.j2"
REFLECT = "llm_reflect.v1.j2"
CODE_KEYS = ('"strategy"', '"host_code"', '"functions"')
ANALYSIS_KEYS = ('"summary"', '"pointers"', '"scalars"', '"launch"', '"contract"')
ANALYSIS_TRIES = 2  # one correction turn when the analysis is not the JSON we asked for
DEFAULT_PARAMS = {"temperature": 0.0, "max_tokens": 4096}


@dataclass
class LLMWrapResult:
    label: Label | None
    status: Status
    reason: Reason | None
    detail: str
    attempts: int  # code answers received
    template_id: str
    template_hash: str  # covers the analysis and reflection prompts too
    analysis: dict = field(default_factory=dict)


@dataclass
class _Verdict:
    passed: bool
    kind: str  # "" | parse | contract | build | timeout
    problem: str = ""  # one line
    log: str = ""  # what the model is shown of a failed build
    label: Label | None = None
    answer: CodeAnswer | None = None


def flow_hash() -> str:
    """One hash for the three prompts: a change to any of them changes the labels they make."""
    joined = "".join(template_hash(name) for name in (ANALYSIS, CODE, REFLECT))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def render_messages(name: str, *blocks: str, **context) -> list[dict]:
    """The chat messages of a prompt template: its `system` and `user` blocks, in that order,
    or the `blocks` named (a block other than `system` is a user turn)."""
    template = environment().get_template(name)
    messages = []
    for block_name in blocks or ("system", "user"):
        block = template.blocks.get(block_name)
        if block is not None:
            text = "".join(block(template.new_context(context))).strip()
            role = "system" if block_name == "system" else "user"
            messages.append({"role": role, "content": text})
    return messages


def log_attempt(
    store: Store,
    cand_id: str,
    logged: set,
    step: str,
    attempt: int,
    template: str,
    messages: list[dict],
    reply: Reply,
    **fields,
) -> None:
    """One answer as an attempt row; an answer a rerun got from the cache is logged once.
    `logged` holds (step, prompt hash, passed) of the rows already there."""
    prompt_hash = hashlib.sha256(
        json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()
    key = (step, prompt_hash, fields["passed"])
    if reply.cached and key in logged:
        return
    logged.add(key)
    store.add_attempt(
        cand_id,
        attempt=attempt,
        step=step,
        template_id=template,
        template_hash=template_hash(template),
        prompt_hash=prompt_hash,
        answer=reply.text,
        prompt=messages[-1]["content"] if messages else "",
        tokens_in=reply.tokens_in,
        tokens_out=reply.tokens_out,
        **fields,
    )


def wrap_with_llm(
    cand: Candidate,
    unit_text: str,
    *,
    client: LLMClient,
    store: Store,
    build: BuildFn,
    max_attempts: int = 3,
    params: dict | None = None,
) -> LLMWrapResult:
    """A built label for `cand` written by the model, or the reason there is none."""
    flow = _Flow(cand, unit_text, client, store, build, params or DEFAULT_PARAMS)
    try:
        return flow.run(max(1, max_attempts))
    except LLMUnavailable as exc:
        return flow.result(None, Status.ERROR, Reason.LLM_FAILED, str(exc))


class _Flow:
    """One candidate's conversation with the model; every answer becomes an attempt row."""

    def __init__(
        self,
        cand: Candidate,
        unit_text: str,
        client: LLMClient,
        store: Store,
        build: BuildFn,
        params: dict,
    ) -> None:
        self.cand, self.client, self.store, self.build = cand, client, store, build
        self.params = params
        self.includes, self.device_code = unit_parts(unit_text)
        self.attempts, self.analysis = 0, {}
        # a rerun answered from the cache must not duplicate the attempt log
        self.logged = {(a["step"], a["prompt_hash"], a["passed"]) for a in store.attempts(cand.id)}
        k = cand.kernel
        self.context = dict(
            kernel=k,
            qualified_name=f"{k.namespace}::{k.name}" if k.namespace else k.name,
            repo_url=cand.provenance.repo_url,
            device_code=self.device_code,
            includes=self._includes([]),
            launches=cand.launches,
            compiled_types=cand.unit.compiled_types,
        )

    def result(self, label, status, reason, detail) -> LLMWrapResult:
        return LLMWrapResult(
            label, status, reason, detail, self.attempts, CODE, flow_hash(), self.analysis
        )

    def run(self, max_attempts: int) -> LLMWrapResult:
        analysis, problem = self._analyse()
        if analysis is None:
            return self.result(
                None, Status.ERROR, Reason.LLM_FAILED, f"analysis unusable: {problem}"
            )
        self.analysis = analysis
        messages = render_messages(
            CODE, analysis_json=json.dumps(analysis, indent=2), **self.context
        )
        template = CODE
        for attempt in range(1, max_attempts + 1):
            reply = self._ask(messages, template)
            self.attempts = attempt
            verdict = self._judge(reply.text)
            self._log_code(attempt, template, messages, reply, verdict)
            if verdict.passed:
                return self.result(verdict.label, Status.OK, None, "")
            if verdict.kind == "timeout":  # the compiler's limit, not the model's fault
                return self.result(None, Status.ERROR, Reason.BUILD_TIMEOUT, verdict.problem)
            if attempt < max_attempts:
                turn = self._feedback(reply, verdict, "code", attempt + 1, max_attempts)
                messages = [*messages, *turn]
                template = REFLECT
        reason = Reason.BUILD_ERROR if verdict.kind == "build" else Reason.LLM_FAILED
        return self.result(None, Status.ERROR, reason, verdict.problem)

    # steps ------------------------------------------------------------------------------------
    def _analyse(self) -> tuple[dict | None, str]:
        """(the analysis, "") or (None, why the last answer was unusable)."""
        messages, template = render_messages(ANALYSIS, **self.context), ANALYSIS
        for attempt in range(1, ANALYSIS_TRIES + 1):
            reply = self._ask(messages, template)
            try:
                parsed, problem = parse_analysis(reply.text), ""
            except AnswerError as exc:
                parsed, problem = None, str(exc)
            passed = parsed is not None
            self._log(
                "analysis",
                attempt,
                template,
                messages,
                reply,
                parsed=parsed or {},
                build_log=problem,
                passed=passed,
            )
            if passed:
                return parsed, ""
            if attempt < ANALYSIS_TRIES:
                verdict = _Verdict(False, "parse", problem)
                turn = self._feedback(reply, verdict, "analysis", attempt + 1, ANALYSIS_TRIES)
                messages = [*messages, *turn]
                template = REFLECT
        return None, problem

    def _judge(self, text: str) -> _Verdict:
        """Parse, check the rules a build cannot see, render, build: the first failure wins."""
        try:
            answer = parse_code(text)
        except AnswerError as exc:
            return _Verdict(False, "parse", str(exc))
        host_code, extra = split_includes(answer.host_code)
        problem = contract_problem(answer, host_code, self.cand.kernel.name)
        if problem:
            return _Verdict(False, "contract", problem, answer=answer)
        label = self._render(host_code, extra, answer)
        built = self.build(self.cand.id, label.text)
        if built.ok:
            return _Verdict(True, "", label=label, answer=answer)
        if "timed out" in built.detail:
            return _Verdict(False, "timeout", built.detail, built.log, label, answer)
        mapper = LineMapper(label.text, host_code)
        log = mapper.apply(error_excerpt(built.log) or built.detail, self.cand.id)
        detail = mapper.apply(built.detail, self.cand.id) or "build failed"
        return _Verdict(False, "build", detail, log, label, answer)

    def _render(self, host_code: str, extra: list[str], answer: CodeAnswer) -> Label:
        c, prov = self.cand, self.cand.provenance
        return render_label(
            cand_id=c.id,
            kernel=c.kernel.name,
            strategy="llm",
            launcher="",
            repo_url=prov.repo_url,
            commit=prov.commit,
            file=c.kernel.file,
            line=c.kernel.line,
            license=prov.license,
            includes=self._includes(extra),
            device_code=self.device_code,
            host_code=host_code,
            functions=[Exposed(f.name, "&" + f.cpp, c_string(f.doc)) for f in answer.functions],
        )

    def _includes(self, extra: list[str]) -> list[str]:
        """The unit's includes, what every written wrapper needs, what the answer asked for."""
        return with_wrapper_includes(self.includes, extra)

    def _feedback(
        self, reply: Reply, verdict: _Verdict, step: str, attempt: int, max_attempts: int
    ) -> list[dict]:
        """The model's answer and our reply to it: the next turn of the same conversation."""
        note = render_messages(
            REFLECT,
            kernel_name=self.cand.kernel.name,
            step=step,
            attempt=attempt,
            max_attempts=max_attempts,
            kind=verdict.kind,
            problem=verdict.problem,
            log=verdict.log,
            keys=CODE_KEYS if step == "code" else ANALYSIS_KEYS,
        )
        return [{"role": "assistant", "content": reply.text}, *note]

    # model and store --------------------------------------------------------------------------
    def _ask(self, messages: list[dict], template: str) -> Reply:
        return self.client.complete(
            messages,
            template_id=template,
            template_hash=template_hash(template),
            params=self.params,
        )

    def _log_code(self, attempt, template, messages, reply: Reply, v: _Verdict) -> None:
        a = v.answer
        parsed = (
            {}
            if a is None
            else {
                "strategy": a.strategy,
                "host_code": a.host_code,
                "functions": [vars(f) for f in a.functions],
            }
        )
        self._log(
            "code",
            attempt,
            template,
            messages,
            reply,
            parsed=parsed,
            strategy=a.strategy if a else "",
            label=v.label.text if v.label else "",
            build_log=v.log or v.problem,
            passed=v.passed,
        )

    def _log(self, step: str, attempt: int, template: str, messages, reply: Reply, **fields):
        log_attempt(
            self.store,
            self.cand.id,
            self.logged,
            step,
            attempt,
            template,
            messages,
            reply,
            **fields,
        )
