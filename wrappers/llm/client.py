"""One OpenAI-compatible chat endpoint behind a cache, bounded retries and a concurrency limit.

vLLM, Ollama, llama.cpp servers and OpenAI all speak the same chat-completions protocol, so the
real `openai` client talks to each. What kminer adds around it:

- a cache in the workdir's store keyed by the canonical request (model, messages, parameters,
  template id + hash, never the API key), so a rerun makes no call at all;
- our own retries (the openai client's are off) for infrastructure errors only: connection
  errors, timeouts, 429 and 5xx, with exponential backoff that honors `Retry-After`. A 200 answer
  is data, however wrong: it is cached and returned, never retried;
- a semaphore, because the wrap stage may call from several threads, and thread-safe counters
  (calls, cache hits, tokens, cost) for the run's stats.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import openai

from miner.store import Store

log = logging.getLogger(__name__)

DEFAULT_MODEL = "gpt-4o-mini"
OPENAI_URL = "https://api.openai.com/v1"
BACKOFF_BASE = 0.5
BACKOFF_CAP = 8.0
RETRY_AFTER_CAP = 60.0  # a server asking for longer than this is as good as down


class LLMUnavailable(RuntimeError):
    """The endpoint could not answer (after retries where retrying makes sense); one line."""


@dataclass(frozen=True)
class Reply:
    text: str
    tokens_in: int
    tokens_out: int
    cached: bool
    cost_usd: float  # what this call cost; 0.0 for a cache hit


def request_key(
    model: str, messages: list[dict], params: dict, template_id: str, template_hash: str
) -> str:
    """sha256 of the canonical request: what changes the answer, and nothing else."""
    blob = json.dumps(
        {
            "model": model,
            "messages": messages,
            "params": params,
            "template_id": template_id,
            "template_hash": template_hash,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class LLMClient:
    """Cached, retried, rate-limited chat completions against one endpoint and model."""

    def __init__(
        self,
        store: Store,
        *,
        base_url: str,
        api_key: str,
        model: str,
        timeout: float = 60.0,
        max_retries: int = 4,
        max_concurrency: int = 4,
        price_in_per_mtok: float = 0.0,
        price_out_per_mtok: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store, self.base_url, self.model = store, base_url, model
        self.max_retries = max(0, max_retries)
        self.price_in, self.price_out = price_in_per_mtok, price_out_per_mtok
        # local servers need no key, but the openai client insists on one
        self._api = openai.OpenAI(
            base_url=base_url, api_key=api_key or "unused", timeout=timeout, max_retries=0
        )
        self._slots = threading.BoundedSemaphore(max(1, max_concurrency))
        self._lock = threading.Lock()
        self._sleep = sleep
        self._usage = dict.fromkeys(
            ("calls", "cache_hits", "retries", "tokens_in", "tokens_out"), 0
        ) | {"cost_usd": 0.0}

    def usage(self) -> dict:
        with self._lock:
            return dict(self._usage)

    def complete(
        self, messages: list[dict], *, template_id: str, template_hash: str, params: dict
    ) -> Reply:
        """The model's answer to `messages`, from the cache when this exact request was asked."""
        key = request_key(self.model, messages, params, template_id, template_hash)
        hit = self.store.llm_cached(key)
        if hit is not None and "text" in hit:
            self._count(cache_hits=1)
            return Reply(hit["text"], hit.get("tokens_in", 0), hit.get("tokens_out", 0), True, 0.0)
        with self._slots:
            response = self._call_with_retries(messages, params)
        text, tokens_in, tokens_out, finish = _unpack(response)
        cost = (tokens_in * self.price_in + tokens_out * self.price_out) / 1e6
        self._count(calls=1, tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cost)
        self.store.put_llm(
            key,
            self.model,
            request={
                "messages": messages,
                "params": params,
                "template_id": template_id,
                "template_hash": template_hash,
            },
            response={
                "text": text,
                "tokens_in": tokens_in,
                "tokens_out": tokens_out,
                "finish_reason": finish,
                "cost_usd": cost,
            },
        )
        return Reply(text, tokens_in, tokens_out, False, cost)

    def _call_with_retries(self, messages: list[dict], params: dict):
        tries = self.max_retries + 1
        for attempt in range(tries):
            try:
                return self._api.chat.completions.create(
                    model=self.model, messages=messages, **params
                )
            except (openai.APIConnectionError, openai.RateLimitError) as exc:  # timeouts too
                failure = exc
            except openai.APIStatusError as exc:
                if exc.status_code < 500:  # our request is wrong: retrying cannot help
                    raise LLMUnavailable(f"{self.base_url}: {_describe(exc)}") from exc
                failure = exc
            if attempt + 1 < tries:
                delay = _backoff(attempt, failure)
                log.info(
                    "LLM %s; retry %d/%d in %.1fs",
                    _describe(failure),
                    attempt + 1,
                    self.max_retries,
                    delay,
                )
                self._count(retries=1)
                self._sleep(delay)
        raise LLMUnavailable(f"{self.base_url}: {_describe(failure)} (after {tries} tries)")

    def _count(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._usage[name] += delta


def _unpack(response) -> tuple[str, int, int, str]:
    """(text, tokens in, tokens out, finish reason); an empty answer is an answer too."""
    choice = response.choices[0] if response.choices else None
    text = (choice.message.content or "") if choice is not None else ""
    usage = response.usage
    tokens_in = int(getattr(usage, "prompt_tokens", 0) or 0)
    tokens_out = int(getattr(usage, "completion_tokens", 0) or 0)
    return text, tokens_in, tokens_out, (choice.finish_reason or "") if choice else ""


def _backoff(attempt: int, exc: Exception) -> float:
    """Seconds before the next try: the server's Retry-After when it gave one, else 0.5·2^n."""
    wait = _retry_after(getattr(exc, "response", None))
    if wait is not None:
        return min(max(wait, 0.0), RETRY_AFTER_CAP)
    return min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt)


def _retry_after(response) -> float | None:
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return float(ms) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        try:  # an HTTP date
            return parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None


def _describe(exc: Exception) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "request timed out"
    if isinstance(exc, openai.APIStatusError):
        message = getattr(exc, "message", "") or str(exc)
        return f"HTTP {exc.status_code}: {' '.join(message.split())[:200]}"
    cause = exc.__cause__ or exc.__context__
    detail = f" ({type(cause).__name__})" if cause is not None else ""
    return f"connection error{detail}"


def client_from_env(
    store: Store,
    *,
    base_url: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
) -> LLMClient | None:
    """The client the environment (or kminer's flags) asks for; None when there is no endpoint,
    so that kminer runs the mined and rule paths only. OPENAI_BASE_URL / OPENAI_API_KEY pick the
    endpoint, KMINER_LLM_MODEL the model; KMINER_LLM_TIMEOUT, KMINER_LLM_PRICE_IN and _OUT are
    optional."""
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or ""
    api_key = api_key or os.environ.get("OPENAI_API_KEY") or ""
    if not base_url and not api_key:
        return None
    return LLMClient(
        store,
        base_url=base_url or OPENAI_URL,
        api_key=api_key,
        model=model or os.environ.get("KMINER_LLM_MODEL") or DEFAULT_MODEL,
        timeout=_env_float("KMINER_LLM_TIMEOUT") or 60.0,  # seconds; local models can be slow
        price_in_per_mtok=_env_float("KMINER_LLM_PRICE_IN"),  # USD per million tokens
        price_out_per_mtok=_env_float("KMINER_LLM_PRICE_OUT"),
    )


def _env_float(name: str) -> float:
    try:
        return float(os.environ.get(name, "") or 0.0)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number, got {os.environ[name]!r}") from exc
