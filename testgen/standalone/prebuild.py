"""Build a bundle's labels, wrong variants and references many to one extension, before the tests.

A test builds its implementation alone with `cpp_extension.load`: about a minute of nvcc per
build on an H100 box, nearly all of it parsing the torch headers. A bundle holds a label, three
variants and a reference per candidate, so the runner builds them here first, several per
translation unit (wrappers/batching.py: each body in its own namespace, the headers parsed once
per batch), and the tests import the module of their source from the batch instead of building it
(the test's `KMINER_PREBUILT`: a folder of `<sha256(source)[:16]>.json` files, one per built
module). The file is keyed by the exact bytes a test would build, so a prediction or an edited
label never picks up another's module. Whatever does not batch (no kminer body markers, a member
the compiler blames, a batch that will not import) gets no file and is built by its test alone,
whose verdict is the one that counts. Travels in the bundle beside run.py with `batching.py` and
`toolchain.py` (the arch list every build uses); standard library only.
"""

from __future__ import annotations

import concurrent.futures as cf
import fcntl
import functools
import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

try:  # in kminer
    from miner import sandbox, toolchain
    from wrappers.batching import BODY_BEGIN, BODY_END, batch_source, blame, split_label
except ImportError:  # in a bundle: beside run.py
    import sandbox
    import toolchain
    from batching import BODY_BEGIN, BODY_END, batch_source, blame, split_label

MAX_PER_BATCH = 12
# a label whose build took this long where it was mined (its batch's share) instantiates so much
# that batching saves nothing: the header parse a batch shares is a small part of its time, and
# a batch of several such sources outlasts the time a GPU box is lent for
HEAVY_BUILD_S = 60.0
# a heavy label this slow builds only the first variant of each kind up front: every variant of
# mamba's 960-instantiation selective_scan_bwd (365 s where mined) side by side shared 16 cores
# two threads each and none was done in two 560 s device calls; four builds get four each
ALL_VARIANTS_UNDER_S = 240.0
_LIVE: set[int] = set()  # supervisors of the batch builds under way (stop() ends them)
_STOPPED = False
_BUILD = """
import sys, torch.utils.cpp_extension as ce
ce.load(name=sys.argv[1], sources=[sys.argv[2]], build_directory=sys.argv[3])
"""


def digest(text: bytes) -> str:
    """The key of a source: what the test's `_load` computes from the bytes it would build."""
    return hashlib.sha256(text).hexdigest()[:16]


def batchable(text: bytes) -> bool:
    body = split_label(text.decode("latin-1"))[1] if BODY_BEGIN.encode() in text else ""
    return BODY_END.encode() in text and "void kminer_bind(" in body


@dataclass
class Built:
    """The outcome of one batch compile: which members built, and why the others did not."""

    ok: bool
    log: str
    seconds: float


def compile_batch(
    members: list[tuple[str, bytes]], suffix: str, folder: Path, timeout: float, threads: int = 1
):
    """Build `members` (id, source) as one extension in `folder`, inside the execution boundary
    (mined code: no tokens, no network, the tree ended at `timeout`); the import is part of the
    build. `threads` > 1: nvcc optimizes the device code on that many threads (a heavy label's
    hundreds of instantiations: one nvcc process on one core outlasted a device call)."""
    labels = [(cid, text.decode("latin-1")) for cid, text in members]
    source, owners = batch_source(labels, module="TORCH_EXTENSION_NAME")
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / f"batch{suffix}"
    src.write_text(source, encoding="latin-1", errors="replace")
    env = {**toolchain.extension_env(), "MAX_JOBS": "1"}
    if threads > 1:  # nvcc reads it on every call cpp_extension makes
        env["NVCC_APPEND_FLAGS"] = f"--split-compile={threads}"
    argv = [sys.executable, "-c", _BUILD, folder.name, str(src), str(folder)]
    limits = sandbox.Limits(seconds=timeout, memory_mb=24 << 10, processes=128)
    mine: list[int] = []

    def started(pid: int) -> None:
        _LIVE.add(pid)
        mine.append(pid)
        if _STOPPED:
            sandbox.stop(pid)

    done = sandbox.run(argv, limits, env=env, cwd=folder, gpu=True, on_start=started)
    _LIVE.difference_update(mine)
    if _STOPPED or done.stopped:
        raise KeyboardInterrupt
    if done.timed_out:
        return Built(False, f"batch build timed out after {timeout:g}s", timeout), owners
    log = (done.stdout + done.stderr).replace(str(src), src.name)
    log = re.sub(r"\S*/(batch\.(?:cu|cpp))\b", r"\1", log)
    return Built(done.returncode == 0, log, done.seconds), owners


def stop() -> None:
    """End the batch builds under way; prebuild() then raises KeyboardInterrupt."""
    global _STOPPED
    _STOPPED = True
    for pid in list(_LIVE):
        sandbox.stop(pid)


def build_group(members, suffix, root: Path, timeout: float, compile_fn=compile_batch) -> dict:
    """id -> {"so" (relative to `root`), "module", "sub", "seconds"} for every member that ends
    up in a built batch. Members the compiler blames leave the batch and the rest is rebuilt;
    a failure nobody is blamed for splits the batch in two (a lone member that fails gets no
    entry)."""
    modules: dict[str, dict] = {}
    pending = list(members)
    while pending:
        name = "kminer_pre_" + digest("|".join(c for c, _ in pending).encode() + suffix.encode())
        built, owners = compile_fn(pending, suffix, root / name, timeout)
        if built.ok:
            so = next((root / name).glob(f"{name}*.so"), root / name / f"{name}.so")
            so = so.relative_to(root)  # the file is read from `root`, wherever it is
            share = round(built.seconds / len(pending), 4)  # a fast batch of many: not 0
            for cid, _ in pending:
                modules[cid] = {"so": str(so), "module": name, "sub": f"c_{cid}", "seconds": share}
            return modules
        ids = {c for c, _ in pending}
        blamed = {c for c in blame(built.log, owners) if c in ids}
        if blamed:
            pending = [(c, t) for c, t in pending if c not in blamed]
            continue
        if len(pending) == 1 or "timed out" in built.log:
            return modules
        half = len(pending) // 2
        for part in (pending[:half], pending[half:]):
            modules.update(build_group(part, suffix, root, timeout, compile_fn))
        return modules
    return modules


def prebuild(
    sources: list[Path],
    store: Path,
    jobs: int,
    timeout: float,
    compile_fn=compile_batch,
    heavy: set[Path] = frozenset(),
) -> dict[str, str]:
    """Batch-build the sources that have no module file yet; write one per built source into
    `store`. The `heavy` ones get a batch each, started first. Returns {digest: "built" (now) |
    "cached" (by an earlier run) | "alone" (its test builds it)} for the sources asked."""
    store.mkdir(parents=True, exist_ok=True)
    state: dict[str, str] = {}
    groups: dict[str, dict[str, bytes]] = {}
    heavy_work = []
    for path in sources:
        text = path.read_bytes()
        key = digest(text)
        if key in state:
            continue
        if (store / f"{key}.json").is_file():
            state[key] = "cached"
        elif not batchable(text) or path.suffix not in (".cu", ".cpp"):
            state[key] = "alone"
        elif path in heavy:
            state[key] = "pending"
            heavy_work.append(([(key, text)], path.suffix))
        else:
            groups.setdefault(path.suffix, {})[key] = text
    # the heavy ones start first, each on its share of the cores (the light batches after them
    # are one nvcc process each)
    share = functools.partial(compile_fn, threads=max(1, jobs // max(1, len(heavy_work))))
    work = [(batch, suffix, share) for batch, suffix in heavy_work]
    for suffix, members in groups.items():
        items = sorted(members.items())
        per = max(1, min(MAX_PER_BATCH, -(-len(items) // max(1, jobs))))
        work += [(items[i : i + per], suffix, compile_fn) for i in range(0, len(items), per)]
    with cf.ThreadPoolExecutor(max_workers=max(1, min(jobs, _memory_slots()))) as pool:
        futures = [
            pool.submit(build_group, [(f"d{k}", t) for k, t in batch], suffix, store, timeout, fn)
            for batch, suffix, fn in work
        ]
        for (batch, _, _), fut in zip(work, futures, strict=True):
            modules = fut.result()
            for key, _ in batch:
                rec = modules.get(f"d{key}")
                if rec is None:
                    state[key] = "alone"
                    continue
                (store / f"{key}.json").write_text(json.dumps(rec))
                state[key] = "built"
    return state


def _memory_slots(gb_per_batch: float = 5.0) -> int:
    """Batch builds the memory allows at once (nvcc with torch headers and 12 bodies: ~5 GB)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (ValueError, OSError, AttributeError):
        return 1 << 10
    return max(1, int(total // gb_per_batch))


def prebuilt_module(store: Path, path: Path) -> dict | None:
    """Where the source at `path` was built many to one extension (so, module, sub), if it was."""
    try:
        return json.loads((store / f"{digest(path.read_bytes())}.json").read_text())
    except (OSError, ValueError):
        return None


class BundleBusy(RuntimeError):
    """Another run.py holds this bundle's build folders."""


def hold_builds(root: Path):
    """Take the bundle's build folders for this process alone, then free the build locks a
    killed run left in them.

    torch's cpp_extension guards a build folder with a lock file that only the builder removes
    (FileBaton): a run killed mid-build (a device call's time ran out) leaves it, and the next
    run's build of that folder waits on it forever, a whole call spent on nothing. While this
    process holds the flock (the kernel drops it when the process dies, however it dies), no
    other runner builds here, so every lock file found is stale. The returned file keeps the
    hold; keep it open for the run."""
    root.mkdir(parents=True, exist_ok=True)
    held = open(root / ".runner.lock", "w")  # noqa: SIM115 (held for the process's life)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.close()
        raise BundleBusy(f"another run.py is using {root}") from None
    freed = free_locks(root)
    if freed:
        print(f"freed {freed} build lock(s) left by a run that was killed", file=sys.stderr)
    return held


def free_locks(root: Path) -> int:
    """Remove torch's build locks under `root` (only where no build can be under way in it)."""
    locks = [lock for lock in root.rglob("lock") if lock.is_file()]
    for lock in locks:
        lock.unlink(missing_ok=True)
    return len(locks)
