"""The LLM wrapper path: a model reads a kernel, writes its host wrapper, and fixes it from the
compiler's errors. `client` talks to any OpenAI-compatible endpoint (cached, retried); `parse`
turns answers into checked JSON; `compiler` shows the model its build errors and caches
verdicts; `flow` runs analysis → code → build → reflection."""

from wrappers.llm.client import LLMClient, LLMUnavailable, Reply, client_from_env
from wrappers.llm.flow import LLMWrapResult, wrap_with_llm

__all__ = [
    "LLMClient",
    "LLMUnavailable",
    "LLMWrapResult",
    "Reply",
    "client_from_env",
    "wrap_with_llm",
]
