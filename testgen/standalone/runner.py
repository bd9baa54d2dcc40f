"""Runs a verification bundle on a GPU box: each label's test, then its wrong variants.

This file travels in the bundle as `run.py` (testgen/bundle.py), to a machine that has python,
torch and pytest and nothing of kminer, so it imports the standard library only (not even torch:
its version comes from the package metadata). In an unpacked bundle:
    python run.py [--jobs N] [--out results.json] [--only ID ...] [--resume]

Why it is shaped like this:
- A test runs twice, as separate processes (the contract in testgen/__init__.py): the `build`
  phase compiles and imports the label and the reference (CPU work, `--jobs` at a time), the `run`
  phase runs the cases on the GPU (`--gpu-jobs` at a time, by default four per visible GPU, each
  pinned to its GPU), so one hung kernel holds up one slot only. Tests that share a GPU share it
  for their cases and take it alone for the label's timing (KMINER_GPU_LOCK: a file lock with a
  turnstile, so a timing waits for the runs under way and no new one starts meanwhile); wrong
  variants are not timed (KMINER_TIMING=0).
- The labels, variants and references are built many to one extension (prebuild.py), a round
  of entries at a time; a round's tests start once its sources are built, while the next round
  builds, so a call cut short while building keeps the results of the rounds before. A test
  imports its module from there, and builds alone only what did not batch.
- One run.py at a time holds a bundle's build folders (a flock), so the lock files torch leaves
  in a folder when a run is killed mid-build are stale, and are freed before anything builds:
  left alone, the next build of that folder waits on them forever.
- Every subprocess gets a fresh temp dir as cwd, its own process group (a timeout kills all it
  started) and a timeout; whatever it does (crash, hang, no report) is an outcome, never an
  error of the batch. The verdict: the timeout, then death by a signal (crash), then a CUDA
  error in the report or the output (crash, run phase), then the report's outcome, then pytest's
  exit status.
- Extensions are built in `.build/<hash of the reference>`: a label and its variants share it,
  so the reference is built once, and a regenerated test reuses every build (tests name each
  module's folder by a hash of its source). A marker per built impl lets a later run skip the build
  subprocess (pass, build_error and import_error are kept; timeouts and crashes are retried).
  Tests should build each module in its own subfolder named after a hash of its source.
- results.json is rewritten atomically after each entry and after each step of one (its label,
  each wrong variant, kept under "partial" until the entry ends), so a killed run keeps what it
  did, and `--resume` goes on from there, within an entry too. Its shape: {"gpu", "torch",
  "cuda", "started", "partial", "entries": {id: {"outcome", "phase" (build|run|""), "cases",
  "kernel_time_us", "kill_rate" (see below; variants, null when none ran), "variants":
  [{"kind", "path", "outcome", "detail"}], "build_s", "run_s", "build_cached", "detail" (one
  line), "log_tail"}}}. A variant's outcome is one of the run outcomes, or `invalid` when it
  does not build.
- The label's run calibrates the cases kminer made (KMINER_CALIBRATE=1): one on which the
  repository's own kernel disagrees with its own reference is outside the op's contract (a
  widened axis that was not channels, values the op does not take), reported invalid with
  that note; the variants' runs leave those cases out (KMINER_OUTSIDE), and so does the
  published row's test, which embeds them (curation.rows). The cases the label passed are
  named too (KMINER_JUDGED, embedded the same way): there the repository's kernel gave the
  reference's result, so a kernel under test that gives another one when run again (it reads
  memory it never wrote: NMS's suppression mask) fails, it is not excused as nondeterministic.
  A made case the kernel faults on
  (an illegal address: the process cannot go on) is named in the report, and the label's run
  is made again without it. A recorded case is never excused.
- Wrong variants come in kinds (no_write, off_by_one, op_swap), best first within a kind. A kind
  is killed when the test fails one of its variants; a variant the test passes may be
  equivalent to the label (NMS's `start = tid + 1` -> `tid - 1` adds comparisons whose bits are
  never read), so the next of its kind is tried, and every variant run stays in the entry.
  kill_rate = kinds killed / kinds with a variant that built; a kind never killed: weak_test, and
  so is a pass with no variant that built (its kill rate is unmeasured, null).
  So is a test with fewer valid cases or shapes than its manifest entry's min_cases/min_shapes
  (a test that sees one shape cannot tell a kernel that works for that shape only).
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import datetime
import hashlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

try:  # in kminer
    from miner import sandbox, toolchain
    from testgen.standalone import prebuild
except ImportError:  # in a bundle: beside run.py
    import prebuild
    import sandbox
    import toolchain

OUTCOMES = ("pass", "mismatch", "build_error", "import_error", "crash", "timeout")
OUTCOMES += ("no_reference", "weak_test", "nondeterministic", "no_cases", "reference_disagrees")
OUTCOMES += ("internal_error",)  # a bug of this runner
INVALID = "invalid"  # a variant that does not build: neither killed nor survived
MAX_FAULTED_CASES = 3  # label runs again without a made case it faulted on, at most this often
MAX_ISOLATED_CASES = 16  # a test from before KMINER_ISOLATE: made cases run one a run
CACHED = ("pass", "build_error", "import_error")  # build verdicts that do not change on a rerun
CUDA_ERROR = re.compile(
    r"illegal memory access|unspecified launch failure|device-side assert|misaligned address"
    r"|illegal instruction|CUDA error|CUDA_ERROR_\w+|cudaErrorLaunch\w*",
    re.IGNORECASE,
)
LOG_TAIL = 2000
GPU_JOBS_PER_GPU = 4  # tests at once on one GPU (their cases are small; timing is exclusive)


class Interrupted(Exception):
    """The runner itself is stopping (SIGINT/SIGTERM): the entry is not recorded."""


_STOP = threading.Event()
_LIVE: set[int] = set()  # supervisors of running tests (sandbox.stop ends each one's tree)
_LIVE_LOCK = threading.Lock()
TEST_LIMITS = dict(memory_mb=32 << 10, processes=512, file_mb=8 << 10)


def stop_all() -> None:
    """End every running test's tree; no new one starts after this."""
    with _LIVE_LOCK:
        _STOP.set()
        for pid in list(_LIVE):
            sandbox.stop(pid)


@dataclass
class Proc:
    """One test subprocess: how it ended, its report and its output."""

    rc: int | None
    timed_out: bool
    seconds: float
    report: dict
    log: str
    over_memory: bool = False


def run_test(
    test: Path, env_extra: dict[str, str], timeout: float, writable: tuple[Path, ...] = ()
) -> Proc:
    """`pytest -q -x <test>` in a fresh temp dir inside the execution boundary (no tokens, no
    network, limits, the whole tree ended at the timeout); never raises on its behaviour.

    pytest gets an empty ini of its own, so no `pytest.ini`/`pyproject.toml` above the bundle
    (addopts, markers) changes what runs; short tracebacks show the failing lines, not the whole
    test's source (whose strings could look like a CUDA error). The test may write its build
    folder, the GPU lock's folder and its temp dir; it reads the bundle."""
    with tempfile.TemporaryDirectory(prefix="kminer-test-") as tmp:
        work = Path(tmp)
        (work / "pytest.ini").write_text("[pytest]\n")
        report = work / "report.json"
        env = {**toolchain.extension_env(), **env_extra, "KMINER_REPORT": str(report)}
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
        argv = [sys.executable, "-m", "pytest", "-q", "-x", "--tb=short", "-p", "no:cacheprovider"]
        argv += ["-c", str(work / "pytest.ini"), "--rootdir", tmp, "--import-mode=importlib"]
        # a test still running near its time limit prints every thread's stack (verdict: where)
        argv += ["-o", f"faulthandler_timeout={max(1, int(timeout * 0.9))}"]
        argv.append(str(test))
        shared = [Path(env[k]) for k in ("KMINER_BUILD_DIR",) if env.get(k)] + list(writable)
        for folder in shared:  # the tests of one reference take turns in its build folder
            folder.mkdir(parents=True, exist_ok=True)
        if env.get("KMINER_GPU_LOCK"):  # the two lock files, shared by the tests of one GPU
            shared += _lock_files(Path(env["KMINER_GPU_LOCK"]))
        if _STOP.is_set():
            raise Interrupted

        supervisors: list[int] = []

        def started(pid: int) -> None:
            with _LIVE_LOCK:
                _LIVE.add(pid)
                supervisors.append(pid)
                if _STOP.is_set():
                    sandbox.stop(pid)

        limits = sandbox.Limits(seconds=timeout, **TEST_LIMITS)
        done = sandbox.run(
            argv, limits, env=env, cwd=work, shared=shared, readable=[test.parent.parent],
            gpu=True, on_start=started,
        )  # fmt: skip
        with _LIVE_LOCK:
            _LIVE.difference_update(supervisors)
        if _STOP.is_set() or done.stopped:
            raise Interrupted
        raw = sandbox.read_output(report, 4 << 20) or b"{}"
        try:
            data = json.loads(raw)
        except ValueError:
            data = {}
    data = data if isinstance(data, dict) else {}
    log = done.stdout + done.stderr
    if done.over_memory:
        log += f"\nkminer: the test went over the memory limit ({limits.memory_mb} MiB)"
    rc = None if done.timed_out else (-9 if done.over_memory else done.returncode)
    return Proc(rc, done.timed_out, done.seconds, data, log, done.over_memory)


def _lock_files(lock: Path) -> list[Path]:
    """The GPU lock and its turnstile, shared by the tests of one GPU (nothing else of the build
    root is theirs)."""
    files = [lock, Path(f"{lock}.turn")]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    return files


def _judged_before(cases) -> str:
    """What a test cut off at its time limit had judged, for its one-line detail."""
    if not isinstance(cases, list) or not cases:
        return "; no case judged before it"
    seen = [c for c in cases if isinstance(c, dict)]
    bad = sum(c.get("ok") is False for c in seen)
    left = sum(c.get("ok") is None for c in seen)
    return f"; {len(seen)} cases judged before it: {bad} differ, {left} left out"


def verdict(phase: str, p: Proc, timeout: float) -> tuple[str, str]:
    """(outcome, one line for humans) of one phase: the timeout and the exit signal first, then
    a CUDA error anywhere in the output (run phase), then the report, then the exit status."""
    if p.timed_out:
        where = hung_at(p.log)
        return "timeout", f"{phase} timed out after {timeout:g}s" + (f" ({where})" if where else "")
    if p.over_memory:
        return "crash", f"{phase} went over the memory limit"
    if p.rc is not None and p.rc < 0:
        name = signal.Signals(-p.rc).name if -p.rc in signal.valid_signals() else -p.rc
        return "crash", f"{phase} killed by {name}"
    error = [ln.strip() for ln in str(p.report.get("error") or "").splitlines() if ln.strip()]
    log = [ln.strip() for ln in p.log.splitlines() if ln.strip()]
    said = [ln[1:].strip() for ln in log if ln.startswith("E ")]  # pytest's error lines
    cuda = [ln for ln in error + said + log if CUDA_ERROR.search(ln)] if phase == "run" else []
    why = (cuda or error or [ln for ln in log if "rror" in ln][-1:] or log[-1:] or [""])[0][:300]
    outcome = p.report.get("outcome")
    if cuda:
        outcome = "crash"
    elif outcome not in OUTCOMES or outcome == "pass":
        if p.rc == 0:
            return "pass", ""
        outcome = "build_error" if phase == "build" else "crash"  # failed without a verdict
        outcome = "mismatch" if phase == "run" and "AssertionError" in p.log else outcome
    return outcome, why


@dataclass
class Check:
    """A label or a variant, built and (when it built) run."""

    outcome: str
    phase: str  # where it ended: build | run
    build_s: float = 0.0
    run_s: float = 0.0
    cached: bool = False
    report: dict = field(default_factory=dict)
    detail: str = ""
    log: str = ""


OUTSIDE_NOTE = "invalid: outside the op's contract"  # the test's note on such a case
# why a label's cases were left out, where that is why too few are left to judge the kernel:
# (how the case's note begins (one or several), the outcome, the detail's words, what it means)
LEFT_OUT = (
    (
        f"{OUTSIDE_NOTE}: the repository's kernel and its reference disagree",
        "reference_disagrees",
        "the repository's kernel and its reference disagree on",
        "the reference computes something else, or the inputs kminer made break a contract "
        "neither checks",
    ),
    (
        (
            f"{OUTSIDE_NOTE}: the repository's kernel fails on",
            f"{OUTSIDE_NOTE}: the repository's code ended the process",
        ),
        "reference_disagrees",
        "the repository's kernel faults where its reference runs on",
        "the inputs kminer made break a contract the kernel assumes and its reference does not "
        "check",
    ),
    (
        f"{OUTSIDE_NOTE}: the repository's reference ended the process",
        "reference_disagrees",
        "the repository's reference ends the process on",
        "its CPU code takes the op's arguments in another form than the recorded calls give "
        "them (a dispatcher that broadcasts or converts them first)",
    ),
    (
        "invalid: nondeterministic",
        "nondeterministic",
        "the label or its reference gives another result when run again on",
        "the op draws its own random numbers or races, and no order-free comparison fits it",
    ),
)
# a recorded case only the GPU's fused multiply-adds move the repository's kernel off its
# reference on (the test's _fused_rounding_explains): left out of later runs the same way
ROUNDING_NOTE = "invalid: rounding"
SLOW_NOTE = "invalid: left out for time"  # the reference ran past its time there


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)', re.MULTILINE)


def hung_at(log: str) -> str:
    """Where a test that ran out of time was (pytest's faulthandler_timeout dump, taken just
    before its limit): the innermost frame of the test file, and the innermost of all when that
    lies elsewhere (a build's wait, a torch call). "" without a dump."""
    dump = log.rfind("Timeout (")
    if dump < 0:
        return ""
    for thread in re.split(r"\n(?=Thread 0x|Current thread)", log[dump:]):
        frames = _FRAME.findall(thread)  # innermost first
        mine = [f for f in frames if "/tests/" in f[0] or Path(f[0]).name.startswith("test")]
        if mine:
            path, line, func = mine[0]
            where = f"in {func} at {Path(path).name}:{line}"
            if frames[0] != mine[0]:
                where += f", inside {frames[0][2]} at {Path(frames[0][0]).name}:{frames[0][1]}"
            return where
    return ""


def log_tail(log: str) -> str:
    """The end of a test's log; for a process a signal ended, where faulthandler's dump
    begins instead: its first frames say where it died (a tail shows only pytest's own)."""
    dump = max(log.rfind("Fatal Python error"), log.rfind("Current thread"), log.rfind("Timeout ("))
    return log[dump : dump + LOG_TAIL] if dump >= 0 else log[-LOG_TAIL:]


def outside_cases(cases) -> dict[str, str]:
    """{case id: why} of the cases a label's run found outside the op's contract: inputs
    kminer made on which the repository's own kernel disagrees with its own reference, and
    recorded ones it differs on only by the GPU's fused rounding (ROUNDING_NOTE), and those
    the reference ran out of time on (SLOW_NOTE: a variant's run would judge on what the
    label's never did). The test leaves them out of every later run (its variants', a
    published row's)."""
    return {
        c["id"]: c["note"].removeprefix("invalid: ")
        for c in cases or []
        if isinstance(c, dict)
        and str(c.get("note", "")).startswith((OUTSIDE_NOTE, ROUNDING_NOTE, SLOW_NOTE))
    }


def _case_ids(test: Path) -> tuple[list[str], list[str]]:
    """(every case id, those of cases kminer made) of a test, read from its CASES literal."""
    try:
        tree = ast.parse(test.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return [], []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "CASES" for t in node.targets
        ):
            try:
                cases = ast.literal_eval(node.value)
            except ValueError:
                return [], []
            ids = [str(c["id"]) for c in cases if isinstance(c, dict) and "id" in c]
            made = [str(c["id"]) for c in cases if isinstance(c, dict) and c.get("made")]
            return ids, made
    return [], []


def judged_cases(cases) -> list[str]:
    """The ids of the cases a label's run passed: it gave the reference's result there, so a
    later run may not excuse a difference there as the kernel's nondeterminism."""
    return sorted(
        str(c["id"])
        for c in cases or []
        if isinstance(c, dict) and c.get("ok") is True and "id" in c
    )


def _digest(*paths: Path, extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:20]


class Runner:
    def __init__(self, bundle: Path, args: argparse.Namespace, devices: list[str | None]) -> None:
        self.bundle = bundle
        self.args = args
        self.build_slots = threading.Semaphore(args.jobs)
        self.gpus: queue.Queue[str | None] = queue.Queue()
        for i in range(args.gpu_jobs):
            self.gpus.put(devices[i % len(devices)])
        self.devices = devices
        self.cpu_threads = max(1, args.jobs // args.gpu_jobs)  # a test's share of the cores
        self.env_key = f"{sys.version}|{toolchain.torch_version()}"
        self.prebuilt: Path | None = None  # where prebuild() left its module files, when it ran
        self.prebuilt_state: dict[str, str] = {}  # source digest -> built | cached | alone
        self._dir_locks: dict[Path, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        # an entry's label verdict and the variants run so far, kept as they come: a call cut
        # short mid-entry (a label whose variants each build for minutes) resumes from there
        self.partial: dict[str, dict] = {}
        self.on_progress = lambda eid, res: None

    def _dir_lock(self, path: Path) -> threading.Lock:
        with self._locks_lock:
            return self._dir_locks.setdefault(path, threading.Lock())

    def _build(self, test: Path, impl: Path, ref: Path, build_dir: Path, env: dict) -> Check:
        """The build phase: batched by prebuild, cached by an earlier run, or run now."""
        marker = build_dir / ".kminer-built" / f"{_digest(impl)}.json"
        cached = None if self.args.rebuild else _read_json(marker)
        batched = []
        if self.prebuilt:
            batched = [prebuild.prebuilt_module(self.prebuilt, p) for p in (impl, ref)]
        if batched and all(batched) and _takes_prebuilt(test):  # the run phase imports them
            was = self.prebuilt_state.get(prebuild.digest(impl.read_bytes()))
            return Check("pass", "build", batched[0].get("seconds", 0.0), cached=was == "cached")
        if cached and cached.get("outcome") in CACHED:
            built = Check(cached["outcome"], "build", cached=True, detail=cached.get("detail", ""))
            built.log = cached.get("log", "")
            return built
        build_env = {**env, "KMINER_PHASE": "build", "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
        with self.build_slots:
            p = run_test(test, build_env, self.args.build_timeout)
        outcome, why = verdict("build", p, self.args.build_timeout)
        if outcome == "timeout":  # its tree was ended mid-build: its lock would hold the folder
            prebuild.free_locks(build_dir)
        if outcome in CACHED:
            marker.parent.mkdir(parents=True, exist_ok=True)
            _write_json(marker, {"outcome": outcome, "detail": why, "log": p.log[-LOG_TAIL:]})
        return Check(outcome, "build", p.seconds, report=p.report, detail=why, log=p.log)

    def check(
        self,
        test: Path,
        impl: Path,
        ref: Path,
        build_dir: Path,
        timed=True,
        outside=None,
        judged=None,
        isolate=False,
    ) -> Check:
        """One test run (`timed`: the label's; else a wrong variant's, which only reads the
        reference outputs the label's run left in the test's cache folder, and leaves out the
        cases the label's run found `outside` the op's contract, and may not excuse a miss on
        a case it `judged` as nondeterminism; `isolate`: only which made cases end the
        process they run in)."""
        env = {"KMINER_IMPL": str(impl), "KMINER_REFERENCE": str(ref)}
        env["KMINER_TIMING"] = "1" if timed else "0"
        env["KMINER_STOP_EARLY"] = "0" if timed else "1"  # a variant's verdict: its first miss
        env["KMINER_CALIBRATE"] = "1" if timed else "0"
        env["KMINER_OUTSIDE"] = json.dumps(outside or {})
        env["KMINER_JUDGED"] = json.dumps(list(judged or []))
        env["KMINER_BUILD_DIR"] = str(build_dir)
        env["KMINER_ISOLATE"] = "1" if isolate else "0"
        # the test's CPU work (its reference) gets its share of this bundle's cores, not all
        # of them: four tests at 16 OpenMP threads each beside 16 builds loaded the H100 box's
        # 16 cores 38-fold
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(self.cpu_threads)
        cache = self.bundle / ".refcache" / _digest(test, extra=_digest(ref))
        cache.mkdir(parents=True, exist_ok=True)
        env["KMINER_REF_CACHE"] = str(cache)
        if self.prebuilt is not None:
            env["KMINER_PREBUILT"] = str(self.prebuilt)
        with self._dir_lock(build_dir):  # torch's build lock assumes one module per folder
            built = self._build(test, impl, ref, build_dir, env)
        if built.outcome != "pass":
            return built
        dev = self.gpus.get()
        try:
            run_env = {**env, "KMINER_PHASE": "run"}
            if dev is not None:
                run_env["CUDA_VISIBLE_DEVICES"] = dev
            if self.args.gpu_jobs > len(self.devices):  # tests share a GPU: timing takes it alone
                lock = self.bundle / ".locks" / f"gpu{dev if dev is not None else ''}.lock"
                run_env["KMINER_GPU_LOCK"] = str(lock)
            p = run_test(test, run_env, self.args.run_timeout, (cache,) if timed else ())
        finally:
            self.gpus.put(dev)
        outcome, why = verdict("run", p, self.args.run_timeout)
        return Check(outcome, "run", built.build_s, p.seconds, built.cached, p.report, why, p.log)

    def prebuild(self, entries: list[dict]) -> None:
        """Labels, variants and references of `entries` built in batches (testgen/prebuild.py);
        what does not batch is left to each test's own build."""
        store = self.bundle / ".build" / f"prebuilt-{_digest(extra=self.env_key)}"
        if self.args.rebuild and store.is_dir():  # the module files, not the other build folders
            shutil.rmtree(store)
        paths, heavy = [], set()
        for e in entries:
            if not (e.get("reference") and _takes_prebuilt(self.bundle / e["test"])):
                continue
            variants = e.get("variants") or []
            # alternates (a kind's later variants) build alone in the test when needed; a heavy
            # label's are built here, side by side: one after another, each for minutes, they
            # outlast the time a box is lent for (but not a label so heavy that all of them
            # side by side would: prebuild.ALL_VARIANTS_UNDER_S)
            build_s = float(e.get("build_s") or 0.0)
            chosen = [group[0]["path"] for _, group in _by_kind(variants)]
            if prebuild.HEAVY_BUILD_S <= build_s < prebuild.ALL_VARIANTS_UNDER_S:
                chosen = [v["path"] for v in variants]
            if build_s >= prebuild.HEAVY_BUILD_S:
                heavy.update(self.bundle / p for p in (e["label"], *chosen))
            paths += [e["label"], e["reference"], *chosen]
        files = [self.bundle / p for p in paths if (self.bundle / p).is_file()]
        if not files:
            return
        start = time.monotonic()
        state = prebuild.prebuild(
            files, store, self.args.jobs, self.args.build_timeout, heavy=heavy
        )
        self.prebuilt = store
        self.prebuilt_state.update(state)  # a round's sources join those of the rounds before
        done = sum(v in ("built", "cached") for v in state.values())
        print(
            f"prebuilt {done} of {len(state)} sources in {time.monotonic() - start:.0f}s "
            f"(the rest build in their tests)",
            file=sys.stderr,
            flush=True,
        )

    def calibrated_label(self, test: Path, impl: Path, ref: Path, build_dir: Path) -> Check:
        """The label's run; where it faulted on a case kminer made (the report names it under
        `outside_crash`: the CUDA context was lost with it), run again without that case, up
        to MAX_FAULTED_CASES times; then the made cases that end a process are found in one
        isolating run (pyg-lib's spline backward faulted on every drafted call its CPU
        implementation took, and the test was a `crash`)."""
        outside: dict[str, str] = {}
        label = self.check(test, impl, ref, build_dir, outside=outside)
        for _ in range(MAX_FAULTED_CASES):
            faulted = label.report.get("outside_crash") if label.outcome == "crash" else None
            if not isinstance(faulted, dict) or not faulted or set(faulted) <= set(outside):
                break
            outside.update({str(k): str(v) for k, v in faulted.items()})
            label = self.check(test, impl, ref, build_dir, outside=outside)
        faulted = label.report.get("outside_crash") if label.outcome == "crash" else None
        more = isinstance(faulted, dict) and faulted and not set(faulted) <= set(outside)
        if label.outcome == "crash" and (not label.report.get("cases") or more):
            # no report survived, or it faults on more made cases than runs were given to
            # leave out one at a time: the made cases that end a process, found in one run
            ended = self._ending_cases(test, impl, ref, build_dir, outside, label.detail)
            if ended:
                outside.update(ended)
                label = self.check(test, impl, ref, build_dir, outside=outside)
        return label

    def _ending_cases(
        self, test: Path, impl: Path, ref: Path, build_dir: Path, outside: dict, how: str
    ) -> dict[str, str]:
        """{case id: why} of the cases kminer made that end the label's process when run alone.
        The repository's host code may abort on an input its CPU twin takes (SparseConvNet's
        `assert(false)` where no tile size divides the planes): no report survives the abort,
        so one test run has a child process run the made cases, noting each before it runs it
        (a test from before KMINER_ISOLATE: a run each, the others left out), to find them. A case
        recorded from the repository's own call that the label ends stays a crash of the test;
        one its reference ends (the test notes when the reference runs) is left out too."""
        isolated = self.check(test, impl, ref, build_dir, True, outside, isolate=True)
        ended = isolated.report.get("ended")
        if isinstance(ended, dict):  # the test found them itself
            return {str(k): str(v) for k, v in ended.items()}
        ids, made = _case_ids(test)  # a test from before KMINER_ISOLATE: a run a case
        ended = {}
        todo = [c for c in made if c not in outside][:MAX_ISOLATED_CASES]
        for cid in todo:
            alone = {**outside, **{o: "run apart" for o in ids if o != cid}}
            # untimed: whether it ends the process is all this run asks (no timing, no
            # calibration of a case that differs)
            if self.check(test, impl, ref, build_dir, False, alone).outcome == "crash":
                ended[cid] = (
                    f"{OUTSIDE_NOTE.removeprefix('invalid: ')}: the repository's code ended the "
                    f"process on this input kminer made ({how})"
                )
        return ended

    def _variant(
        self, test: Path, path: Path, ref: Path, build_dir: Path, outside: dict, judged: list
    ) -> dict:
        """{"outcome", "detail"} of the test on one wrong variant (`invalid` when it has no
        module); one the test passes keeps its cases, {"id", "ok", "note"} each, which say
        where the test looked and saw nothing wrong."""
        if not path.is_file():
            return {"outcome": INVALID, "detail": "missing file"}
        c = self.check(test, path, ref, build_dir, False, outside, judged)
        no_module = c.outcome in ("build_error", "import_error")
        out = {"outcome": INVALID if c.phase == "build" or no_module else c.outcome}
        out["detail"] = c.detail
        cases = c.report.get("cases") if out["outcome"] == "pass" else None
        if isinstance(cases, list):
            out["cases"] = [
                {k: x.get(k) for k in ("id", "ok", "note")} for x in cases if isinstance(x, dict)
            ]
        return out

    def process(self, entry: dict) -> dict:
        """The results.json entry of one manifest entry (never raises but `Interrupted`)."""
        res = _entry("")
        if not entry.get("reference"):
            res.update(outcome="no_reference", detail="the manifest names no CPU reference")
            return res
        test, impl, ref = (self.bundle / entry[k] for k in ("test", "label", "reference"))
        missing = [str(p.relative_to(self.bundle)) for p in (test, impl, ref) if not p.is_file()]
        if missing:
            res.update(outcome="build_error", phase="build", detail=f"missing: {missing[0]}")
            return res
        build_dir = self.bundle / ".build" / _digest(ref, extra=self.env_key)
        eid = entry.get("id", "")
        prior = self.partial.get(eid)
        sources = _digest(test, impl, ref)  # a partial entry of other bytes is not resumed
        if (
            isinstance(prior, dict)
            and prior.get("outcome") == "pass"
            and (prior.get("_sources") == sources)
        ):
            res.update(prior)  # the label passed in an earlier call: its variants go on
            res["variants"] = list(prior.get("variants") or [])
        else:
            label = self.calibrated_label(test, impl, ref, build_dir)
            res.update(outcome=label.outcome, phase=label.phase, build_s=label.build_s)
            res.update(run_s=label.run_s, build_cached=label.cached, detail=label.detail)
            res.update(log_tail=log_tail(label.log))
            if label.phase == "run":
                cases = label.report.get("cases")
                if label.outcome == "timeout" and not cases:
                    cases = label.report.get("cases_so_far")  # judged before the time ran out
                    res["detail"] += _judged_before(cases)
                res["cases"] = cases if isinstance(cases, list) else []
                res["kernel_time_us"] = label.report.get("kernel_time_us")
            res["_env"] = {k: label.report.get(k) for k in ("gpu", "torch", "cuda")}
            if label.outcome == "no_cases":  # nothing was left to judge it by
                _mostly_left_out(res)
            if label.outcome != "pass":
                return res
            res["_sources"] = sources
            self.on_progress(eid, res)
        ran = {v.get("path"): v for v in res["variants"]}
        outside, judged = outside_cases(res["cases"]), judged_cases(res["cases"])
        tried, killed = set(), set()  # kinds with a valid variant run / with one killed
        for kind, group in _by_kind(entry.get("variants") or []):
            for v in group:
                if v["path"] in ran:  # run in an earlier call
                    out = ran[v["path"]].get("outcome", INVALID)
                else:
                    ran_v = self._variant(
                        test, self.bundle / v["path"], ref, build_dir, outside, judged
                    )
                    out = ran_v["outcome"]
                    res["variants"].append({"kind": kind, "path": v["path"], **ran_v})
                    self.on_progress(eid, res)
                if out == INVALID:
                    continue  # does not build: the next of its kind stands in
                tried.add(kind)
                if out != "pass":
                    killed.add(kind)
                    break
        res.pop("_sources", None)
        if tried:
            res["kill_rate"] = round(len(killed) / len(tried), 4)
        if tried - killed:
            kinds = ", ".join(sorted(tried - killed))
            res.update(outcome="weak_test", detail=f"passed every wrong variant of: {kinds}")
        valid = [c for c in res["cases"] if isinstance(c, dict) and c.get("ok") is not None]
        shapes = len({json.dumps(c.get("shape")) for c in valid})
        short = len(valid) < entry.get("min_cases", 0) or shapes < entry.get("min_shapes", 0)
        if short and _mostly_left_out(res):  # whatever its variants did
            pass
        elif res["outcome"] == "pass" and short:
            need = f"{entry.get('min_cases', 0)} over {entry.get('min_shapes', 0)}"
            res.update(
                outcome="weak_test",
                detail=f"{len(valid)} valid cases over {shapes} shapes (needs {need})",
            )
        if res["outcome"] == "pass" and not tried:  # a strength nobody measured is no strength
            made = len(entry.get("variants") or [])
            why = f"none of its {made} wrong variants built" if made else "no wrong variant"
            res.update(outcome="weak_test", detail=f"{why}: its kill rate is unmeasured")
        return res


def _mostly_left_out(res: dict) -> bool:
    """Name the outcome after why the label's cases were left out, where most were left out for
    one reason and as many as are left to judge the kernel by (too few, the caller found): the
    repository's kernel and its reference disagreeing (`reference_disagrees`), or the label or
    the reference giving another result when run again (`nondeterministic`: a random walk that
    draws its own numbers). Either says more than a weak test, and no test of it can pass a
    correct kernel."""
    cases = [c for c in res["cases"] if isinstance(c, dict)]
    valid = [c for c in cases if c.get("ok") is not None]
    left_out = len(cases) - len(valid)
    for note, outcome, what, why in LEFT_OUT:
        hit = [c for c in cases if str(c.get("note", "")).startswith(note)]
        if hit and len(hit) >= len(valid) and 2 * len(hit) > left_out:  # most of those
            res.update(
                outcome=outcome,
                detail=f"{what} {len(hit)} of the {len(cases)} cases, {len(valid)} left to "
                f"judge it by: {why}",
            )
            return True
    return False


def _takes_prebuilt(test: Path) -> bool:
    """A test that reads KMINER_PREBUILT (every generated one); another builds for itself, in
    its build phase."""
    try:
        return b"KMINER_PREBUILT" in test.read_bytes()
    except OSError:
        return False


def _by_kind(variants: list[dict]) -> list[tuple[str, list[dict]]]:
    """The variants grouped by kind, each group in manifest order (best first), kinds in the
    order they first appear."""
    groups: dict[str, list[dict]] = {}
    for v in variants:
        groups.setdefault(v.get("kind", ""), []).append(v)
    return list(groups.items())


def _entry(outcome: str, **fields) -> dict:
    """A results.json entry with every field present."""
    res = {"outcome": outcome, "phase": "", "cases": [], "kernel_time_us": None, "kill_rate": None}
    res.update(variants=[], build_s=0.0, run_s=0.0, build_cached=False, detail="", log_tail="")
    return {**res, **fields}


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data) -> None:
    """Atomically: a reader (or a killed run) sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _gpus() -> tuple[list[str | None], str]:
    """The GPUs to pin GPU slots to ([None]: no pinning) and the first one's name, from
    nvidia-smi: this process never touches CUDA."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    rows = [ln.split(",", 1) for ln in out.splitlines() if "," in ln]
    devices: list[str | None] = [r[0].strip() for r in rows]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    return devices or [None], rows[0][1].strip() if rows else ""


def default_jobs() -> int:
    """Parallel builds: one per core, but no more than one per 3 GB (nvcc with torch headers)."""
    cpus = os.cpu_count() or 1
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 30)
    except (ValueError, OSError, AttributeError):
        return cpus
    return max(1, min(cpus, mem_gb // 3))


def load_manifest(path: Path) -> list[dict]:
    """The entries, checked: relative paths inside the bundle, unique ids. ValueError if not."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable manifest ({e})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: the manifest is not a list of entries")
    seen: set[str] = set()
    for i, e in enumerate(data):
        ok = isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("id", "test", "label"))
        ok = ok and (e.get("reference") is None or isinstance(e["reference"], str))
        variants = e.get("variants") or [] if isinstance(e, dict) else []
        ok = ok and isinstance(variants, list)
        ok = ok and all(isinstance(v, dict) and isinstance(v.get("path"), str) for v in variants)
        if not ok:
            raise ValueError(f"{path}: entry {i} lacks id/test/label or has bad fields")
        paths = [e["test"], e["label"], e.get("reference") or "", *(v["path"] for v in variants)]
        if any(p.startswith("/") or ".." in Path(p).parts for p in paths):
            raise ValueError(f"{path}: entry {e['id']} has a path outside the bundle")
        if e["id"] in seen or not re.fullmatch(r"[\w.-]+", e["id"]):
            raise ValueError(f"{path}: duplicate or odd id {e['id']!r}")
        seen.add(e["id"])
    return data


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Run a kminer verification bundle.")
    ap.add_argument("--bundle", type=Path, default=Path(__file__).resolve().parent)
    ap.add_argument("--out", type=Path, default=Path("results.json"))
    ap.add_argument("--jobs", type=int, default=0, help="parallel builds (default: by cores/RAM)")
    ap.add_argument("--gpu-jobs", type=int, default=0, help="parallel GPU runs (default: 4/GPU)")
    ap.add_argument("--only", nargs="+", default=None, metavar="ID")
    ap.add_argument("--resume", action="store_true", help="skip ids already in --out")
    ap.add_argument("--rebuild", action="store_true", help="ignore cached build verdicts")
    ap.add_argument("--build-timeout", type=float, default=900.0)
    ap.add_argument(
        "--no-prebuild", dest="prebuild", action="store_false",
        help="build every source in its own test (no batched builds first)",
    )  # fmt: skip
    ap.add_argument("--run-timeout", type=float, default=180.0)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bundle = args.bundle.resolve()
    if (bundle / "bin" / "bwrap").is_file():  # the boundary's namespaces on a box without them
        os.environ.setdefault("KMINER_BWRAP", str(bundle / "bin" / "bwrap"))
    try:
        manifest = load_manifest(bundle / "manifest.json")
    except ValueError as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 2
    try:  # held to the end of the process
        builds_held = prebuild.hold_builds(bundle / ".build")  # noqa: F841
    except prebuild.BundleBusy as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 2
    devices, gpu_name = _gpus()
    args.jobs = args.jobs if args.jobs > 0 else default_jobs()
    args.gpu_jobs = args.gpu_jobs if args.gpu_jobs > 0 else GPU_JOBS_PER_GPU * len(devices)
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    results = {"gpu": "", "torch": "", "cuda": "", "started": now}  # the tests' reports fill these
    results["entries"] = {}
    if args.resume and args.out.exists():
        prev = _read_json(args.out)
        if not isinstance(prev, dict) or not isinstance(prev.get("entries"), dict):
            print(f"run.py: {args.out}: not a results file, will not resume it", file=sys.stderr)
            return 2
        results.update(prev)
    partial = results.setdefault("partial", {})  # entries begun, not finished (Runner.partial)
    seen = {k for k in ("gpu", "torch", "cuda") if results[k]}  # values from the tests' reports
    known = {e["id"] for e in manifest}
    for eid in sorted(set(args.only or ()) - known):
        print(f"run.py: --only {eid}: not in the manifest", file=sys.stderr)
    order = {e["id"]: i for i, e in enumerate(manifest)}
    todo = [e for e in manifest if args.only is None or e["id"] in args.only]
    todo = [e for e in todo if e["id"] not in results["entries"]]
    results["gpu"] = results["gpu"] or gpu_name
    results["torch"] = results["torch"] or toolchain.torch_version()
    results["nvcc"] = results.get("nvcc") or toolchain.nvcc_version()
    results["sandbox"] = sandbox.describe()  # what this machine's boundary gave the tests
    runner = Runner(bundle, args, devices)
    runner.partial = {k: v for k, v in partial.items() if isinstance(v, dict)}
    write_lock = threading.Lock()

    def progress(eid: str, res: dict) -> None:
        with write_lock:
            partial[eid] = json.loads(json.dumps(res))
            _write_json(args.out, results)

    runner.on_progress = progress
    signal.signal(signal.SIGTERM, _raise_interrupt)
    pool = cf.ThreadPoolExecutor(max_workers=2 * args.jobs + args.gpu_jobs)
    feeder = Feeder(runner, pool, todo, args.prebuild, prebuild_round(args.jobs))
    try:
        for done, (eid, res) in enumerate(feeder.results(), 1):
            for key, value in (res.pop("_env", None) or {}).items():
                if value and key not in seen:
                    results[key] = str(value)
                    seen.add(key)
            with write_lock:
                entries = {**results["entries"], eid: res}
                order_key = lambda kv: order.get(kv[0], -1)  # noqa: E731
                results["entries"] = dict(sorted(entries.items(), key=order_key))
                partial.pop(eid, None)
                _write_json(args.out, results)
            rate = "" if res["kill_rate"] is None else f" kill_rate {res['kill_rate']:.2f}"
            print(f"[{done}/{len(todo)}] {eid} {res['outcome']}{rate} {res['detail']}", flush=True)
    except KeyboardInterrupt:
        # a second SIGTERM (the box's own limit after `timeout`'s) must not cut the shutdown
        # that ends the tests' process trees short: it left a traceback and live children
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        feeder.stop()
        stop_all()
        pool.shutdown(wait=True, cancel_futures=True)
        print("run.py: stopped; results so far are in the output file", file=sys.stderr)
        return 130
    pool.shutdown(wait=True)
    if not todo:
        _write_json(args.out, results)
    return 0


def prebuild_round(jobs: int) -> int:
    """Entries a prebuild round takes: about one batch of a few sources a build slot."""
    return max(2, jobs)


class Feeder:
    """Entries go to the test pool a round at a time, each round once its sources are
    prebuilt, while the rounds before it are tested: the first results come minutes into a
    call, not after every source of the bundle is built (a call that ends while building
    keeps the results of the rounds before; its prebuilt modules are lost with the box)."""

    def __init__(self, runner: Runner, pool, todo: list[dict], batch: bool, size: int):
        self.runner, self.pool, self.batch = runner, pool, batch
        self.rounds = [todo[i : i + size] for i in range(0, len(todo), size)]
        self.futures: dict = {}  # future -> entry id, in submission order
        self.lock = threading.Lock()
        self.fed = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._feed, daemon=True)
        self.thread.start()

    def _feed(self) -> None:
        try:
            for part in self.rounds:
                if _STOP.is_set():
                    return
                if self.batch:
                    self.runner.prebuild(part)
                with self.lock:
                    for e in part:
                        self.futures[self.pool.submit(_guarded, self.runner, e)] = e["id"]
        except BaseException as e:  # re-raised in the main thread
            self.failure = e
        finally:
            self.fed.set()

    def results(self):
        """(entry id, result) of each entry as it finishes."""
        handed: set = set()
        while True:
            fed = self.fed.is_set()  # read first: what was fed by then is in the futures
            with self.lock:
                waiting = [f for f in self.futures if f not in handed]
            if not waiting:
                if fed:
                    break
                self.fed.wait(0.2)
                continue
            finished, _ = cf.wait(waiting, timeout=0.5, return_when=cf.FIRST_COMPLETED)
            for fut in finished:
                handed.add(fut)
                yield self.futures[fut], fut.result()
        if self.failure is not None and not _STOP.is_set():
            raise self.failure

    def stop(self) -> None:
        prebuild.stop()
        _STOP.set()


def _guarded(runner: Runner, entry: dict) -> dict:
    """A bug of the runner on one entry is recorded on that entry; the batch goes on."""
    try:
        return runner.process(entry)
    except Interrupted:
        raise
    except Exception as e:
        res = _entry("internal_error", detail=f"runner error: {e!r}"[:300])
        res["log_tail"] = traceback.format_exc()[-LOG_TAIL:]
        return res


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
