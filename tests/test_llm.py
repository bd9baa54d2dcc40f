"""The LLM wrapper path against a fake OpenAI-compatible server on loopback.

The `openai` client and the HTTP path are real; the answers are recorded by hand in
tests/fixtures/llm/. Fast tests judge labels with a stand-in for nvcc (a function that reads the
label text); the `slow` ones build with real nvcc and the torch headers.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from pathlib import Path

import pytest
from conftest import kernel, needs_nvcc
from llm_server import FIXTURES, MALFORMED, FakeLLM, content_of, load
from sqlalchemy import select
from sqlalchemy.orm import Session

from miner.candidate import Provenance, Reason, Status
from miner.repo_model import to_candidate
from miner.store import LLMCacheRow, Store
from wrappers.batching import split_label
from wrappers.build import BuildResult
from wrappers.label import template_hash
from wrappers.llm.client import (
    DEFAULT_MODEL,
    OPENAI_URL,
    LLMClient,
    _backoff,
    client_from_env,
    request_key,
)
from wrappers.llm.compiler import LineMapper, error_excerpt
from wrappers.llm.flow import CODE, flow_hash, render_messages, wrap_with_llm
from wrappers.llm.parse import (
    AnswerError,
    contract_problem,
    parse_analysis,
    parse_code,
    parse_object,
    split_includes,
)
from wrappers.verdicts import cached_build

MMCV = Path("/tmp/src/open-mmlab+mmcv")
PROV = Provenance(repo_url="sample", commit="0" * 40, license="MIT")
SECRET = "sk-test-secret-0123456789"


# helpers ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sample_unit(sample):
    """(candidate, unit text) of a sample-repo kernel, as the pipeline would hand them over."""
    from miner.extract import Extractor

    extractor = Extractor(sample)

    def get(name: str):
        fk = kernel(sample, name)
        return to_candidate(fk, sample, PROV), extractor.extract(fk, "test").unit.text

    return get


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "work")
    yield s
    s.close()


def client_for(server: FakeLLM, store: Store, **kw) -> LLMClient:
    kw.setdefault("api_key", SECRET)
    kw.setdefault("timeout", 10.0)
    return LLMClient(store, base_url=server.base_url, model="fake-model", **kw)


def with_faults(recordings: list[dict], name: str, faults: list[str]) -> list[dict]:
    recs = copy.deepcopy(recordings)
    next(r for r in recs if r["name"] == name)["faults"] = faults
    return recs


def reflect_with(recordings: list[dict], kernel_name: str, answer: dict, step="code") -> list:
    """The recordings plus one answer to every reflection turn of `step`."""
    extra = {
        "name": f"reflect-{step}",
        "match": ["[kminer:reflect]", f"kernel={kernel_name}", f"step={step}"],
        "answers": [answer],
    }
    return [*copy.deepcopy(recordings), extra]


def answer_of(recordings: list[dict], name: str) -> dict:
    return next(r for r in recordings if r["name"] == name)["answers"][0]


class FakeBuild:
    """Stands in for nvcc: a label fails when a marker is in it, with an nvcc-style log that
    points at the marker's line of the label body (as build_batch's `#line` markers do)."""

    def __init__(self, fail_on: str | None = None, message: str = "") -> None:
        self.fail_on, self.message, self.calls = fail_on, message, []

    def __call__(self, cid: str, text: str) -> BuildResult:
        self.calls.append(text)
        if self.fail_on is None or self.fail_on not in text:
            return BuildResult(True, "", "", 0.01)
        body = split_label(text)[1].splitlines()
        line = next(i for i, ln in enumerate(body, 1) if self.fail_on in ln)
        first = f"kminer_{cid}.cu({line}): error: {self.message}"
        log = f"{first}\n  {body[line - 1].strip()}\n  ^\n\n1 error detected in the compilation"
        return BuildResult(False, f"label.cu({line}): error: {self.message}", log, 0.01)


def code_rows(store: Store, cid: str) -> list[dict]:
    return [a for a in store.attempts(cid) if a["step"] == "code"]


def host_line(recordings: list[dict], name: str, needle: str) -> int:
    lines = answer_of(recordings, name)["json"]["host_code"]
    return next(i for i, ln in enumerate(lines, 1) if needle in ln)


# the flow, end to end (fake build) --------------------------------------------------------------
def test_happy_path_analysis_then_code(sample_unit, store):
    cand, unit = sample_unit("box_iou_cuda_kernel")
    build = FakeBuild()
    with FakeLLM(load("box_iou_cuda_kernel")) as server:
        result = wrap_with_llm(
            cand, unit, client=client_for(server, store), store=store, build=build
        )
    assert result.status == Status.OK and result.reason is None and result.attempts == 1
    text = result.label.text
    assert "__global__ void box_iou_cuda_kernel(" in text
    assert "torch::Tensor box_iou_cuda_kernel_forward(torch::Tensor boxes_a" in text
    assert 'm.def("forward", &box_iou_cuda_kernel_forward, "pairwise IoU' in text
    assert "void kminer_bind(pybind11::module_& m)" in text
    assert "#include <ATen/cuda/CUDAContext.h>" in split_label(text)[0]
    assert result.label.strategy == "llm" and build.calls == [text]
    # the code step is conditioned on the analysis, and the prompts say what rules
    analysis_req, code_req = server.chat_requests()
    assert "[kminer:analysis]" in analysis_req["last_user"]
    assert "single source of truth" in analysis_req["last_user"]
    assert result.analysis["contract"] in code_req["last_user"]
    assert result.analysis["pointers"][2]["role"] == "output"
    assert (result.template_id, result.template_hash) == (CODE, flow_hash())
    rows = store.attempts(cand.id)
    assert [(r["step"], r["passed"]) for r in rows] == [("analysis", True), ("code", True)]
    assert rows[0]["parsed"] == result.analysis
    assert rows[1]["label"] == text and rows[1]["strategy"].startswith("Check both box")
    assert rows[1]["template_hash"] == template_hash(CODE)
    assert all(r["tokens_in"] > 0 and r["tokens_out"] > 0 for r in rows)


@pytest.mark.parametrize("fault", ["429", "500", "503", "drop"])
def test_infrastructure_error_then_answer(sample_unit, store, fault):
    cand, unit = sample_unit("scaled_add_cuda_kernel")
    delays: list[float] = []
    recs = with_faults(load("scaled_add_cuda_kernel"), "analysis", [fault, "ok"])
    with FakeLLM(recs) as server:
        client = client_for(server, store, sleep=delays.append)
        result = wrap_with_llm(cand, unit, client=client, store=store, build=FakeBuild())
    assert result.status == Status.OK
    assert len(server.chat_requests("[kminer:analysis]")) == 2
    assert len(server.chat_requests()) == 3  # analysis twice, code once
    assert client.usage()["retries"] == 1 and client.usage()["calls"] == 2
    assert delays == ([0.0] if fault == "429" else [0.5])  # Retry-After: 0 is honored


def test_timeout_then_answer(sample_unit, store):
    cand, unit = sample_unit("scaled_add_cuda_kernel")
    recs = with_faults(load("scaled_add_cuda_kernel"), "code", ["sleep:3", "ok"])
    with FakeLLM(recs) as server:
        client = client_for(server, store, timeout=1.0)
        start = time.perf_counter()
        result = wrap_with_llm(cand, unit, client=client, store=store, build=FakeBuild())
        elapsed = time.perf_counter() - start
    assert result.status == Status.OK and result.attempts == 1
    assert len(server.chat_requests("[kminer:code]")) == 2
    assert elapsed < 3.0  # gave up after 1 s instead of waiting for the slow answer
    assert len(code_rows(store, cand.id)) == 1  # the timed-out try is not an attempt


def test_every_try_times_out(sample_unit, store):
    cand, unit = sample_unit("scaled_add_cuda_kernel")
    recs = with_faults(load("scaled_add_cuda_kernel"), "analysis", ["sleep:3"] * 4)
    with FakeLLM(recs) as server:
        client = client_for(server, store, timeout=1.0, max_retries=1)
        result = wrap_with_llm(cand, unit, client=client, store=store, build=FakeBuild())
    assert result.status == Status.ERROR and result.reason == Reason.LLM_FAILED
    assert result.label is None and result.attempts == 0
    assert "timed out" in result.detail and "after 2 tries" in result.detail
    assert "\n" not in result.detail and server.base_url in result.detail
    assert len(server.chat_requests()) == 2
    assert store.attempts(cand.id) == []  # no answer, nothing to log


def test_client_error_is_not_retried(sample_unit, store):
    cand, unit = sample_unit("scaled_add_cuda_kernel")
    recs = with_faults(load("scaled_add_cuda_kernel"), "analysis", ["401", "ok"])
    with FakeLLM(recs) as server:
        client = client_for(server, store)
        result = wrap_with_llm(cand, unit, client=client, store=store, build=FakeBuild())
    assert result.reason == Reason.LLM_FAILED and "HTTP 401" in result.detail
    assert len(server.chat_requests()) == 1 and client.usage()["retries"] == 0


def test_connection_refused_is_llm_failed(sample_unit, store):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cand, unit = sample_unit("scaled_add_cuda_kernel")
    delays: list[float] = []
    client = LLMClient(
        store,
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key="",
        model="m",
        max_retries=2,
        sleep=delays.append,
    )
    result = wrap_with_llm(cand, unit, client=client, store=store, build=FakeBuild())
    assert result.reason == Reason.LLM_FAILED and "connection error" in result.detail
    assert delays == [0.5, 1.0]  # exponential backoff between the three tries


def test_backoff_schedule_and_cap():
    class Exc(Exception):
        response = None

    assert [_backoff(n, Exc()) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_malformed_answer_goes_into_reflection(sample_unit, store):
    cand, unit = sample_unit("scaled_add_cuda_kernel")
    recs = load("scaled_add_cuda_kernel")
    recs = reflect_with(
        with_faults(recs, "code", ["malformed"]), cand.kernel.name, answer_of(recs, "code")
    )
    build = FakeBuild()
    with FakeLLM(recs) as server:
        result = wrap_with_llm(
            cand, unit, client=client_for(server, store), store=store, build=build
        )
    assert result.status == Status.OK and result.attempts == 2
    assert len(build.calls) == 1  # the prose answer never reached the compiler
    reflect = server.chat_requests("[kminer:reflect]")
    assert len(reflect) == 1
    messages = reflect[0]["body"]["messages"]
    assert messages[-2] == {"role": "assistant", "content": MALFORMED}
    assert "not valid JSON" in messages[-1]["content"]
    assert "attempt=2/3" in messages[-1]["content"]
    rows = code_rows(store, cand.id)
    assert [r["passed"] for r in rows] == [False, True]
    assert rows[0]["build_log"].startswith("not valid JSON") and rows[0]["answer"] == MALFORMED
    assert rows[0]["label"] == "" and rows[1]["template_id"] == "llm_reflect.v1.j2"


def test_build_error_goes_into_reflection(sample_unit, store):
    cand, unit = sample_unit("row_sum_cuda_kernel")
    recs = load("row_sum_cuda_kernel")
    build = FakeBuild("row_blocks(rows)", 'identifier "row_blocks" is undefined')
    with FakeLLM(recs) as server:
        result = wrap_with_llm(
            cand, unit, client=client_for(server, store), store=store, build=build
        )
    assert result.status == Status.OK and result.attempts == 2 and len(build.calls) == 2
    assert "const int blocks = std::min(rows, 4096);" in result.label.text
    bad_line = host_line(recs, "code", "row_blocks(rows)")
    first, second = code_rows(store, cand.id)
    assert not first["passed"] and second["passed"]
    assert (
        f'host_code:{bad_line}: error: identifier "row_blocks" is undefined' in first["build_log"]
    )
    assert "row_blocks(rows)" in first["label"] and first["parsed"]["functions"]
    (reflect,) = server.chat_requests("[kminer:reflect]", "step=code", "attempt=2/3")
    assert first["build_log"] in reflect["last_user"]
    assert second["label"] == result.label.text


def test_never_builds_is_build_error_with_every_attempt_kept(sample_unit, store):
    cand, unit = sample_unit("box_iou_cuda_kernel")
    recs = load("box_iou_cuda_kernel")
    recs = reflect_with(recs, cand.kernel.name, answer_of(recs, "code"))
    build = FakeBuild("box_iou_cuda_kernel<<<", "too few arguments in function call")
    with FakeLLM(recs) as server:
        result = wrap_with_llm(
            cand, unit, client=client_for(server, store), store=store, build=build, max_attempts=3
        )
    assert result.status == Status.ERROR and result.reason == Reason.BUILD_ERROR
    line = host_line(recs, "code", "box_iou_cuda_kernel<<<")
    assert result.detail == f"host_code:{line}: error: too few arguments in function call"
    assert result.label is None and result.attempts == 3 and len(build.calls) == 3
    rows = code_rows(store, cand.id)
    assert [r["attempt"] for r in rows] == [1, 2, 3]
    assert not any(r["passed"] for r in rows) and all(r["build_log"] for r in rows)
    bodies = [json.dumps(r["body"], sort_keys=True) for r in server.chat_requests()]
    assert len(bodies) == 4 and len(set(bodies)) == 4  # never the identical request twice


def test_build_timeout_stops_the_loop(sample_unit, store):
    cand, unit = sample_unit("box_iou_cuda_kernel")
    calls = []

    def slow_compiler(cid: str, text: str) -> BuildResult:
        calls.append(cid)
        return BuildResult(
            False, "nvcc timed out after 1800 s", "nvcc timed out after 1800 s", 1800
        )

    with FakeLLM(load("box_iou_cuda_kernel")) as server:
        client = client_for(server, store)
        result = wrap_with_llm(cand, unit, client=client, store=store, build=slow_compiler)
    assert result.reason == Reason.BUILD_TIMEOUT and result.detail.startswith("nvcc timed out")
    assert calls == [cand.id] and result.attempts == 1  # not the model's fault: no reflection
    assert server.chat_requests("[kminer:reflect]") == []


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda a: a.update(host_code=["int unrelated() { return 0; }"]), "never launches"),
        (lambda a: a["functions"][0].update(cpp="box_iou_forward"), "is not defined in"),
        (lambda a: a["host_code"].insert(0, "__global__ void k() {}"), "__global__"),
        (lambda a: a.pop("functions"), "missing key 'functions'"),
    ],
)
def test_broken_rules_go_into_reflection(sample_unit, store, mutate, expected):
    cand, unit = sample_unit("box_iou_cuda_kernel")
    recs = load("box_iou_cuda_kernel")
    good = answer_of(recs, "code")
    recs = reflect_with(recs, cand.kernel.name, good)
    mutate(answer_of(recs, "code")["json"])
    build = FakeBuild()
    with FakeLLM(recs) as server:
        result = wrap_with_llm(
            cand, unit, client=client_for(server, store), store=store, build=build
        )
    assert result.status == Status.OK and result.attempts == 2 and len(build.calls) == 1
    (reflect,) = server.chat_requests("[kminer:reflect]")
    assert expected in reflect["last_user"]
    assert expected in code_rows(store, cand.id)[0]["build_log"]


def test_unusable_analysis_gets_one_correction(sample_unit, store, tmp_path):
    cand, unit = sample_unit("box_iou_cuda_kernel")
    recs = load("box_iou_cuda_kernel")
    analysis = answer_of(recs, "analysis")
    recs = reflect_with(
        with_faults(recs, "analysis", ["malformed"]), cand.kernel.name, analysis, step="analysis"
    )
    with FakeLLM(recs) as server:
        result = wrap_with_llm(
            cand, unit, client=client_for(server, store), store=store, build=FakeBuild()
        )
    assert result.status == Status.OK and result.analysis == analysis["json"]
    rows = [r for r in store.attempts(cand.id) if r["step"] == "analysis"]
    assert [r["passed"] for r in rows] == [False, True]
    (reflect,) = server.chat_requests("[kminer:reflect]", "step=analysis")
    assert '"contract"' in reflect["last_user"]  # asks again for the analysis keys

    recs = with_faults(recs, "reflect-analysis", ["malformed"])
    other = Store.open(tmp_path / "second")
    with FakeLLM(recs) as server:
        failed = wrap_with_llm(
            cand, unit, client=client_for(server, other), store=other, build=FakeBuild()
        )
    assert failed.reason == Reason.LLM_FAILED
    assert failed.detail.startswith("analysis unusable: not valid JSON")
    assert len(server.chat_requests()) == 2  # two analysis answers, no code step
    other.close()


# cache, key, usage ------------------------------------------------------------------------------
def test_rerun_makes_no_call_and_no_compile(sample_unit, store):
    cand, unit = sample_unit("row_sum_cuda_kernel")
    compiler = FakeBuild("row_blocks(rows)", 'identifier "row_blocks" is undefined')
    build = cached_build(compiler, store, key=lambda text: "test-" + str(hash(text)))
    with FakeLLM(load("row_sum_cuda_kernel")) as server:
        first = wrap_with_llm(
            cand, unit, client=client_for(server, store), store=store, build=build
        )
    assert first.status == Status.OK and len(server.chat_requests()) == 3
    rows = store.attempts(cand.id)
    with FakeLLM([]) as empty:  # would answer 400 to anything
        client = client_for(empty, store)
        again = wrap_with_llm(cand, unit, client=client, store=store, build=build)
    assert empty.requests == [] and len(compiler.calls) == 2
    assert again.status == Status.OK and again.label.text == first.label.text
    assert again.attempts == 2 and again.analysis == first.analysis
    assert client.usage()["cache_hits"] == 3 and client.usage()["calls"] == 0
    assert store.attempts(cand.id) == rows  # the attempt log is not duplicated


def test_cache_key_ignores_api_key_and_never_stores_it(sample_unit, store):
    cand, unit = sample_unit("box_iou_cuda_kernel")
    with FakeLLM(load("box_iou_cuda_kernel")) as server:
        wrap_with_llm(cand, unit, client=client_for(server, store), store=store, build=FakeBuild())
    assert {r["authorization"] for r in server.requests} == {f"Bearer {SECRET}"}
    with FakeLLM([]) as empty:
        client = client_for(empty, store, api_key="sk-another-key")
        result = wrap_with_llm(cand, unit, client=client, store=store, build=FakeBuild())
    assert result.status == Status.OK and empty.requests == []
    with Session(store.engine) as s:
        rows = list(s.scalars(select(LLMCacheRow)))
    assert len(rows) == 2
    dumped = json.dumps([[r.key, r.model, r.request, r.response] for r in rows])
    assert SECRET not in dumped and "[kminer:code]" in dumped
    attempts = json.dumps(store.attempts(cand.id), default=str)
    assert SECRET not in attempts


def test_request_key_is_canonical():
    msgs = [{"role": "user", "content": "x"}]
    base = request_key("m", msgs, {"temperature": 0, "max_tokens": 5}, "t.j2", "abc")
    assert base == request_key(
        "m", [{"content": "x", "role": "user"}], {"max_tokens": 5, "temperature": 0}, "t.j2", "abc"
    )
    assert base != request_key("m2", msgs, {"temperature": 0, "max_tokens": 5}, "t.j2", "abc")
    assert base != request_key("m", msgs, {"temperature": 0, "max_tokens": 5}, "t.j2", "abd")
    assert base != request_key("m", msgs, {"temperature": 0, "max_tokens": 5}, "u.j2", "abc")
    assert base != request_key("m", msgs, {"temperature": 1, "max_tokens": 5}, "t.j2", "abc")


def test_tokens_and_cost_are_counted(sample_unit, store):
    cand, unit = sample_unit("row_sum_cuda_kernel")
    build = FakeBuild("row_blocks(rows)", 'identifier "row_blocks" is undefined')
    with FakeLLM(load("row_sum_cuda_kernel")) as server:
        client = client_for(server, store, price_in_per_mtok=2.0, price_out_per_mtok=8.0)
        wrap_with_llm(cand, unit, client=client, store=store, build=build)
    usage = client.usage()
    tokens_in = sum(u["prompt_tokens"] for u in server.usages)
    tokens_out = sum(u["completion_tokens"] for u in server.usages)
    assert usage["calls"] == 3 and (usage["tokens_in"], usage["tokens_out"]) == (
        tokens_in,
        tokens_out,
    )
    assert usage["cost_usd"] == pytest.approx((tokens_in * 2.0 + tokens_out * 8.0) / 1e6)
    assert usage["cost_usd"] > 0
    rows = store.attempts(cand.id)
    assert sum(r["tokens_in"] for r in rows) == tokens_in
    # the reflection turn resends the conversation: its prompt is the largest
    assert server.usages[2]["prompt_tokens"] > server.usages[1]["prompt_tokens"]


def test_garbage_answer_is_returned_not_retried(store):
    recs = [{"name": "ping", "match": ["ping"], "answers": [{"text": "no JSON here {"}]}]
    with FakeLLM(recs) as server:
        client = client_for(server, store)
        reply = client.complete(
            [{"role": "user", "content": "ping"}], template_id="t", template_hash="h", params={}
        )
        again = client.complete(
            [{"role": "user", "content": "ping"}], template_id="t", template_hash="h", params={}
        )
    assert reply.text == "no JSON here {" and not reply.cached
    assert again.cached and again.text == reply.text and again.cost_usd == 0.0
    assert len(server.requests) == 1


def test_concurrency_is_bounded(store):
    recs = [
        {
            "name": "ping",
            "match": ["ping"],
            "answers": [{"text": "pong"}],
            "faults": ["sleep:0.3"] * 6,
        }
    ]
    with FakeLLM(recs) as server:
        client = client_for(server, store, max_concurrency=2)

        def ask(i: int) -> None:
            client.complete(
                [{"role": "user", "content": f"ping {i}"}],
                template_id="t",
                template_hash="h",
                params={},
            )

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert server.max_in_flight == 2 and len(server.requests) == 6
    assert client.usage()["calls"] == 6


def test_client_from_env(monkeypatch, store):
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "KMINER_LLM_MODEL", "KMINER_LLM_PRICE_IN"):
        monkeypatch.delenv(name, raising=False)
    assert client_from_env(store) is None
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    local = client_from_env(store)
    assert local.base_url == "http://127.0.0.1:9/v1" and local.model == DEFAULT_MODEL
    monkeypatch.setenv("KMINER_LLM_MODEL", "qwen2.5-coder")
    assert client_from_env(store).model == "qwen2.5-coder"
    assert client_from_env(store, model="x").model == "x"
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    assert client_from_env(store).base_url == OPENAI_URL
    monkeypatch.setenv("KMINER_LLM_PRICE_IN", "0.15")
    assert client_from_env(store).price_in == 0.15
    monkeypatch.setenv("KMINER_LLM_PRICE_IN", "cheap")
    with pytest.raises(ValueError, match="KMINER_LLM_PRICE_IN must be a number"):
        client_from_env(store)


# prompts, parsing, helpers ----------------------------------------------------------------------
def test_prompts_render_strictly(sample_unit):
    cand, unit = sample_unit("row_sum_cuda_kernel")
    from wrappers.label import unit_parts

    includes, device = unit_parts(unit)
    context = dict(
        kernel=cand.kernel,
        qualified_name=cand.kernel.name,
        repo_url="r",
        device_code=device,
        includes=includes,
        launches=cand.launches,
        compiled_types=["float", "double"],
    )
    analysis = render_messages("llm_analysis.v1.j2", **context)
    assert [m["role"] for m in analysis] == ["system", "user"]
    user = analysis[1]["content"]
    assert user.startswith("[kminer:analysis] kernel=row_sum_cuda_kernel")
    assert "`const T* input`" in user and "row_blocks(rows), THREADS_PER_BLOCK" in user
    assert "__shfl_down_sync" in user and '"contract"' in user
    code = render_messages("llm_code.v1.j2", analysis_json="{}", **context)[1]["content"]
    assert "AT_DISPATCH_FLOATING_TYPES" in code and "compiles for: float, double" in code
    with pytest.raises(Exception, match="analysis_json"):
        render_messages("llm_code.v1.j2", **context)  # StrictUndefined


def test_parse_object_strict_and_tolerant():
    assert parse_object('{"a": 1}') == {"a": 1}
    assert parse_object('Here it is:\n```json\n{"a": 2}\n```\nDone.') == {"a": 2}
    assert parse_object('Answer: {"a": {"b": 3}} hope this helps') == {"a": {"b": 3}}
    assert parse_object('{"code": "line1\nline2"}') == {"code": "line1\nline2"}
    with pytest.raises(AnswerError, match="not valid JSON"):
        parse_object("no braces at all")
    with pytest.raises(AnswerError, match="expected a JSON object"):
        parse_object("[1, 2]")


def test_parse_code_and_analysis_validate():
    ok = {"strategy": "s", "host_code": "void f() {}", "functions": [{"name": "f", "cpp": "f"}]}
    assert parse_code(json.dumps(ok)).functions[0].cpp == "f"
    for bad, message in [
        ({**ok, "host_code": ""}, "host_code must not be empty"),
        ({**ok, "functions": []}, "functions must not be empty"),
        ({**ok, "functions": [{"name": "not-valid", "cpp": "f"}]}, "Python identifier"),
        ({**ok, "functions": [{"name": "f", "cpp": "f(x)"}]}, "one C++ function"),
        ({**ok, "functions": [{"name": "f", "cpp": "f"}] * 2}, "unique"),
        ({**ok, "host_code": 3}, "host_code must be a str"),
    ]:
        with pytest.raises(AnswerError, match=re.escape(message)):
            parse_code(json.dumps(bad))
    analysis = {"summary": "s", "contract": "c", "pointers": [], "scalars": [], "launch": {}}
    assert parse_analysis(json.dumps(analysis)) == analysis
    pointer = {"name": "x", "role": "reads", "shape": "(n,)"}
    with pytest.raises(AnswerError, match="role must be one of"):
        parse_analysis(json.dumps({**analysis, "pointers": [pointer]}))


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_recorded_answers_are_valid(path):
    """Golden answers: every recorded analysis and code answer passes the checks."""
    data = json.loads(path.read_text())
    kernel_name = data["kernel"]
    for rec in data["recordings"]:
        for answer in rec["answers"]:
            text = content_of(answer)
            if rec["name"] == "analysis":
                parsed = parse_analysis(text)
                assert parsed["pointers"] and parsed["contract"]
            else:
                code = parse_code(text)
                host, _ = split_includes(code.host_code)
                assert contract_problem(code, host, kernel_name) == ""
                assert "CUDAGuard" in host and "getCurrentCUDAStream" in host


def test_error_excerpt_and_line_mapping():
    log = "noise with error in it\n" + "\n".join(f"x.cu({i}): error: e{i}" for i in range(60))
    excerpt = error_excerpt(log).splitlines()
    assert len(excerpt) == 40 and excerpt[0] == "x.cu(0): error: e0"
    expansion = "    switch (_st) { case at::ScalarType::Double: " + "x" * 2000
    repeated = f'k.cu(61): error: identifier "row_blocks" is undefined\n{expansion}\n    ^\n'
    log = repeated * 2 + "k.cu:70:3: error: other\n1 error detected in the compilation of k\n"
    assert error_excerpt(log).splitlines() == [
        'k.cu(61): error: identifier "row_blocks" is undefined',
        expansion[:240] + " [...]",
        "k.cu:70:3: error: other",
    ]
    label = (
        "#include <torch/extension.h>\n// kminer-label-body-begin\n__global__ void k() {}\n\n"
        "void host() {\n  k<<<1, 1>>>();\n}\nvoid kminer_bind(pybind11::module_& m) {}\n"
        "// kminer-label-body-end\n"
    )
    mapper = LineMapper(label, "void host() {\n  k<<<1, 1>>>();\n}")
    assert mapper.apply("kminer_ab.cu(4): error: x", "ab") == "host_code:2: error: x"
    assert mapper.apply("label.cu(1): error: y", "ab") == "device code:1: error: y"
    assert mapper.apply("/tmp/kminer_ab.cu:6:3: error: z", "ab") == "binding: error: z"


# real nvcc (slow) -------------------------------------------------------------------------------
class CountingBuild:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, cid: str, text: str) -> BuildResult:
        from wrappers.build import build_batch

        self.calls += 1
        return build_batch([(cid, text)])[cid]


@pytest.mark.slow
@needs_nvcc
def test_real_build_then_rerun_is_free(sample_unit, store):
    cand, unit = sample_unit("scaled_add_cuda_kernel")
    compiler = CountingBuild()
    build = cached_build(compiler, store)  # keyed like the build stage: label hash + nvcc + flags
    with FakeLLM(load("scaled_add_cuda_kernel")) as server:
        result = wrap_with_llm(
            cand, unit, client=client_for(server, store), store=store, build=build
        )
    assert result.status == Status.OK, result.detail
    assert "AT_DISPATCH_FLOATING_TYPES_AND_HALF" in result.label.text
    assert compiler.calls == 1 and len(server.chat_requests()) == 2
    with FakeLLM([]) as empty:
        again = wrap_with_llm(cand, unit, client=client_for(empty, store), store=store, build=build)
    assert again.status == Status.OK and again.label.text == result.label.text
    assert empty.requests == [] and compiler.calls == 1


@pytest.mark.slow
@needs_nvcc
def test_real_build_error_then_fixed(sample_unit, store):
    cand, unit = sample_unit("row_sum_cuda_kernel")
    recs = load("row_sum_cuda_kernel")
    compiler = CountingBuild()
    with FakeLLM(recs) as server:
        result = wrap_with_llm(
            cand, unit, client=client_for(server, store), store=store, build=compiler
        )
    assert result.status == Status.OK, result.detail
    assert compiler.calls == 2 and result.attempts == 2
    first, second = code_rows(store, cand.id)
    bad_line = host_line(recs, "code", "row_blocks(rows)")
    assert not first["passed"] and second["passed"]
    assert re.search(
        rf'host_code:{bad_line}: error: identifier "row_blocks" is undefined', first["build_log"]
    ), first["build_log"]
    (reflect,) = server.chat_requests("[kminer:reflect]")
    assert "row_blocks" in reflect["last_user"]


MMCV_KERNELS = (
    "sigmoid_focal_loss_forward_cuda_kernel",
    "three_nn_forward_cuda_kernel",
    "MaskedIm2colForward",
)


@pytest.mark.devset
@needs_nvcc
def test_mmcv_kernels_reach_built_labels(tmp_path):
    """Three real mmcv kernels, their flows run concurrently (one client, one store); their
    build calls meet in one nvcc batch, so the torch headers are parsed once."""
    from miner.discover import discover
    from miner.extract import Extractor
    from wrappers.build import build_batch

    disc = discover(MMCV)
    extractor = Extractor(disc)
    prov = Provenance(
        repo_url="https://github.com/open-mmlab/mmcv", commit="a8073c74" * 5, license="Apache-2.0"
    )
    work = [
        (
            to_candidate(kernel(disc, n), disc, prov),
            extractor.extract(kernel(disc, n), "t").unit.text,
        )
        for n in MMCV_KERNELS
    ]
    pending: dict[str, str] = {}
    verdicts: dict[str, BuildResult] = {}
    barrier = threading.Barrier(
        len(work),
        action=lambda: verdicts.update(build_batch(list(pending.items()))),
        timeout=600,
    )

    def build(cid: str, text: str) -> BuildResult:
        pending[cid] = text
        barrier.wait()
        return verdicts[cid]

    store = Store.open(tmp_path)
    recordings = [rec for name in MMCV_KERNELS for rec in load(name)]
    results = {}
    with FakeLLM(recordings) as server:
        client = client_for(server, store, max_concurrency=3)

        def run(cand, unit) -> None:
            results[cand.kernel.name] = wrap_with_llm(
                cand, unit, client=client, store=store, build=build
            )

        threads = [threading.Thread(target=run, args=w) for w in work]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for name in MMCV_KERNELS:
        result = results[name]
        assert result.status == Status.OK, (name, result.detail)
        assert f"__global__ void {name}(" in result.label.text
        assert "kminer_bind" in result.label.text
    assert "std::optional<torch::Tensor> weight" in results[MMCV_KERNELS[0]].label.text
    assert len(server.chat_requests()) == 6 and client.usage()["calls"] == 6
    store.close()
