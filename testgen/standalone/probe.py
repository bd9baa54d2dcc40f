"""Run drafted calls through a repository's CPU implementation built with AddressSanitizer.

kminer drafts calls for an op its repository's tests never call (testgen/probe_inputs.py); this
script, in the sandbox with libasan preloaded, runs each draft through the module's `reference`
in a process forked for it, and says what happened: `asan` when the sanitizer reported a read or
write outside an allocation (its reports go to stderr, a file here), `raised` with the
exception, `crashed` or `timeout`, `empty` when the call wrote nothing but zeros, else `ok`.
A draft out of bounds may write over memory it does not own; in a child of its own, that harms
no other draft, and a crash costs a fork, not a start of torch. Each tensor sits between
poisoned fences (far past its end is someone else's memory, where ASan sees nothing), but those
the code resizes (grown in place, they would write into their own fence).

Drafts come in groups, best first, and a group ends at its KEEP-th `ok`. Each verdict is
appended to OUT.jsonl as it comes. Usage:
    python probe.py MODULE.so NAME DRAFTS.pt OUT.jsonl KEEP [BARE]
DRAFTS a list of (group, arguments), BARE a JSON list of the argument positions not fenced.
Needs only python and torch.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import json
import os
import signal
import sys
import time

import torch

DRAFT_SECONDS = 20.0
FENCE_BYTES = 1 << 20  # poisoned on each side of a tensor, at least


def _load(path: str, name: str):
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _wrote_something(before: list, args: list, result) -> bool:
    """Whether the call produced anything not zero: a returned tensor or an argument it changed."""
    returned = result if isinstance(result, (list, tuple)) else [result]
    for t in returned:
        if isinstance(t, torch.Tensor) and t.numel() and bool((t != 0).any()):
            return True
    for old, new in zip(before, args, strict=True):
        if isinstance(new, torch.Tensor) and not torch.equal(old, new):
            return True
    return False


def _reported(since: int) -> bool:
    """Whether AddressSanitizer wrote a report to stderr after byte `since` (the code's own
    messages, a warning torch prints, are no report)."""
    sys.stderr.flush()
    with open("asan.txt", "rb") as reports:
        reports.seek(since)
        return b"AddressSanitizer" in reports.read(1 << 20)


def _poisoner():
    """AddressSanitizer's `__asan_poison_memory_region`, where the runtime is preloaded."""
    try:
        poison = ctypes.CDLL(None).__asan_poison_memory_region
    except (AttributeError, OSError):
        return None
    poison.argtypes, poison.restype = (ctypes.c_void_p, ctypes.c_size_t), None
    return poison


def _fenced(t: torch.Tensor, poison) -> torch.Tensor:
    """A copy of `t` in the middle of a larger allocation whose rest is poisoned: an index
    past the tensor by more than an allocation's own redzone lands in other live memory,
    where the sanitizer sees nothing (`in_feat[in_pos * c + j]` with rows of the wrong
    width); within a fence it is a report."""
    if poison is None or not t.numel():
        return t
    size = t.element_size()
    fence = max(FENCE_BYTES, 4 * t.numel() * size) // 64 * 64 // size  # elements, aligned
    buf = torch.empty(t.numel() + 2 * fence, dtype=t.dtype)
    inner = buf[fence : fence + t.numel()].view(t.shape)
    inner.copy_(t)
    start, end = buf.data_ptr(), buf.data_ptr() + buf.numel() * size
    poison(start, fence * size)
    poison(inner.data_ptr() + t.numel() * size, end - inner.data_ptr() - t.numel() * size)
    return inner


def _run_one(fn, args: list, poison, bare: set) -> str:
    args = [  # a loaded tensor's storage cannot grow: a resized one is a copy
        (a.clone() if i in bare else _fenced(a, poison)) if isinstance(a, torch.Tensor) else a
        for i, a in enumerate(args)
    ]
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    size = os.fstat(2).st_size
    try:
        result = fn(*args)
        verdict = "ok" if _wrote_something(before, args, result) else "empty"
    except Exception as exc:  # the implementation refused the draft
        verdict = f"raised: {type(exc).__name__}: {str(exc)[:200]}"
    return "asan" if _reported(size) else verdict


def _in_child(fn, args: list, poison, bare: set) -> str:
    """The draft's verdict, run in a forked child (killed after DRAFT_SECONDS)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, answer, leave without running any cleanup
        os.close(read_end)
        try:
            answer = _run_one(fn, args, poison, bare)
        except BaseException as exc:  # a child must always answer
            answer = f"raised: {type(exc).__name__}"
        os.write(write_end, answer.encode()[:4000])
        os._exit(0)
    os.close(write_end)
    size, deadline = os.fstat(2).st_size, time.monotonic() + DRAFT_SECONDS
    status = None
    while status is None:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status = code
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_end)
            return "timeout"
        else:
            time.sleep(0.005)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read().decode(errors="replace")
    if answer:
        return answer
    return "asan" if _reported(size) else f"crashed: status {status}"


def main() -> int:
    module_path, name, drafts_path, out_path, keep = sys.argv[1:6]
    bare = set(json.loads(sys.argv[6])) if len(sys.argv) > 6 else set()  # resized: unfenced
    torch.set_num_threads(1)  # no thread pool to lose in the children
    drafts = torch.load(drafts_path, weights_only=True)
    reports = open("asan.txt", "ab")  # noqa: SIM115 (held for the whole run, as stderr)
    os.dup2(reports.fileno(), 2)
    fn = _load(module_path, name).reference
    poison = _poisoner()
    held: dict = {}  # group -> its drafts that ran ok
    with open(out_path, "a", encoding="utf-8") as out:
        for k, (group, args) in enumerate(drafts):
            if held.get(group, 0) >= int(keep):
                continue
            verdict = _in_child(fn, args, poison, bare)
            out.write(json.dumps({"draft": k, "verdict": verdict}) + "\n")
            out.flush()
            if verdict == "ok":
                held[group] = held.get(group, 0) + 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
