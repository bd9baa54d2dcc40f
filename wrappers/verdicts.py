"""Build verdicts, remembered: a label text is compiled at most once per compiler and flags.

The build stage and the LLM reflection loop both judge labels; they share this cache (the
store's compile cache) so that a label the loop already built is not built again by the stage,
and a rerun of either compiles nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from miner import toolchain
from miner.candidate import Reason
from miner.versions import code_version
from wrappers.build import BuildFn, BuildResult
from wrappers.label import Label


def build_key(label_hash: str) -> str:
    """A verdict depends on the label, the compiler, its flags and how kminer batches labels."""
    flags = " ".join(toolchain.extension_flags())
    code = code_version("wrappers.build")
    blob = "\0".join([toolchain.nvcc_version(), flags, toolchain.torch_version(), code, label_hash])
    return "build-" + hashlib.sha256(blob.encode()).hexdigest()[:24]


def remember(store, key: str, r: BuildResult) -> None:
    store.put_compile(
        key,
        status="ok" if r.ok else "error",
        reason=None if r.ok else Reason.BUILD_ERROR.value,
        detail=r.detail,
        compiled_types=[],
        text="",
        log=r.log[-20000:],
        seconds=r.seconds,
    )


def recalled(store, key: str) -> BuildResult | None:
    hit = store.cached_compile(key)
    return None if hit is None else BuildResult(hit.status == "ok", hit.detail, hit.log, 0.0)


def cached_build(build: BuildFn, store, key: Callable[[str], str] | None = None) -> BuildFn:
    """`build`, asked once per label text (by default under the build stage's key)."""

    def cached(cid: str, text: str) -> BuildResult:
        k = key(text) if key is not None else build_key(Label(text, "").hash)
        hit = recalled(store, k)
        if hit is not None:
            return hit
        result = build(cid, text)
        remember(store, k, result)
        return result

    return cached
