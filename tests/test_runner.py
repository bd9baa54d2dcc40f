"""The verification runner (testgen/runner.py, a bundle's run.py) and bundle (testgen/bundle.py).

run.py always runs as a real subprocess on a real bundle folder. Without a GPU its tests are
stand-ins that follow the contract (fixtures/runner/fake/fake_check.py: what each one does is
written in the label it is given); `slow` builds real CPU extensions; `gpu` runs real CUDA labels
that pass, write to an illegal address and spin forever. kminer's own modules are imported inside
the bundle tests only: the GPU box has python, torch and pytest, not pydantic.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from miner import sandbox, toolchain
from testgen.standalone import prebuild, runner

ROOT = Path(__file__).parent.parent
RUNNER = ROOT / "testgen" / "standalone" / "runner.py"
PREBUILD = ROOT / "testgen" / "standalone" / "prebuild.py"
BATCHING = ROOT / "wrappers" / "batching.py"
TOOLCHAIN = ROOT / "miner" / "toolchain.py"
SANDBOX = ROOT / "miner" / "sandbox.py"
SUPERVISOR = ROOT / "miner" / "supervisor.py"
FAKE = Path(__file__).parent / "fixtures" / "runner" / "fake"
CUDA = Path(__file__).parent / "fixtures" / "runner" / "cuda"
TIMING = ("build_s", "run_s", "build_cached", "log_tail")


def make_bundle(root: Path, check: Path, reference: Path, entries: list[dict]) -> Path:
    """A bundle folder as write_bundle lays it out. Entry: {id, label: Path, variants: [(kind,
    Path)], group, reference: bool}; tests of one group are byte-identical (one build folder)."""
    for sub in ("tests", "labels", "references", "variants"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy(RUNNER, root / "run.py")
    shutil.copy(PREBUILD, root / "prebuild.py")
    shutil.copy(BATCHING, root / "batching.py")
    shutil.copy(TOOLCHAIN, root / "toolchain.py")
    shutil.copy(SANDBOX, root / "sandbox.py")
    shutil.copy(SUPERVISOR, root / "supervisor.py")
    ref = f"references/ref{reference.suffix}"
    shutil.copy(reference, root / ref)
    manifest = []
    for e in entries:
        eid = e["id"]
        test = f"tests/{eid}.py"
        (root / test).write_text(check.read_text() + f"\n# group {e.get('group', eid)}\n")
        label = f"labels/{eid}{e['label'].suffix}"
        shutil.copy(e["label"], root / label)
        variants = []
        for n, (kind, src) in enumerate(e.get("variants", [])):
            variants.append({"kind": kind, "path": f"variants/{eid}.{n}{src.suffix}"})
            shutil.copy(src, root / variants[-1]["path"])
        entry = {"id": eid, "test": test, "label": label, "variants": variants}
        entry.update({k: e[k] for k in ("min_cases", "min_shapes") if k in e})
        manifest.append({**entry, "reference": ref if e.get("reference", True) else None})
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return root


def run_py(bundle: Path, *args: str, timeout: float = 300):
    argv = [sys.executable, str(bundle / "run.py"), *args]
    return subprocess.run(argv, cwd=bundle, capture_output=True, text=True, timeout=timeout)


def fake_log(bundle: Path) -> list[list[str]]:
    """[step, impl name, impl hash, build dir, pid, ns, OpenMP threads] per line the fake tests
    wrote in the bundle's build folders (the one place a test may write), oldest first."""
    lines = [
        ln.split()
        for path in sorted(bundle.glob(".build/**/fake.log"))
        for ln in path.read_text().splitlines()
    ]
    return sorted(lines, key=lambda line: int(line[5]))


def running(text: str) -> list[int]:
    """Processes of this machine whose command line holds `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


def same(a: dict, b: dict) -> bool:
    """Two entries agree on everything but timings and the build cache."""
    return {k: v for k, v in a.items() if k not in TIMING} == {
        k: v for k, v in b.items() if k not in TIMING
    }


def fake(name: str) -> Path:
    return FAKE / f"{name}.cu"


BATCH = [
    {
        "id": "good",
        "label": fake("pass"),
        "group": "shared",
        "variants": [
            ("off_by_one", fake("v_mismatch")),
            ("no_write", fake("v_nobuild")),
            ("op_swap", fake("v_segv")),
        ],
    },
    {
        "id": "weak",
        "label": fake("pass"),
        "group": "shared",
        "variants": [("op_swap", fake("v_pass")), ("off_by_one", fake("v_mismatch"))],
    },
    *(
        {"id": n, "label": fake(n)}
        for n in ("mismatch", "segv", "hang", "nobuild", "importerr", "cudaerr", "hangbuild")
    ),
    {"id": "asserts", "label": fake("asserts")},
    {"id": "noref", "label": fake("pass"), "reference": False},
    {"id": "short", "label": fake("pass"), "min_cases": 6, "min_shapes": 2},
    {  # the label's run finds case_1 outside the contract; its variants' runs leave it out
        "id": "calibrated",
        "label": fake("calibrated"),
        "variants": [("no_write", fake("v_calibrated")), ("no_write", fake("v_mismatch"))],
    },
    {  # the label and its reference disagree on every made case: one recorded case is left
        "id": "disagrees",
        "label": fake("disagrees"),
        "min_cases": 5,
        "min_shapes": 3,
        "variants": [("no_write", fake("v_pass"))],
    },
    {  # the label gives another result each run on every made case: one case is left
        "id": "random",
        "label": fake("random"),
        "min_cases": 5,
        "min_shapes": 3,
        "variants": [("no_write", fake("v_pass"))],
    },
    {  # a variant that gives another result each run where the label passed: killed
        "id": "judged",
        "label": fake("pass"),
        "variants": [("no_write", fake("v_unstable"))],
    },
    {  # the label faults on case_3, which kminer made: its run is made again without it
        "id": "faulted",
        "label": fake("faults"),
        "variants": [("no_write", fake("v_mismatch"))],
    },
    {  # the label faults on every case kminer made: past the runs that leave out one at a
        # time, one isolating run finds the rest; what is left is too little to judge by
        "id": "faulted_all",
        "label": fake("faults_all"),
        "min_cases": 5,
        "min_shapes": 3,
        "variants": [("no_write", fake("v_pass"))],
    },
    {  # the label's host code aborts on case_4, which kminer made: found alone, left out
        "id": "aborted",
        "label": fake("aborts"),
        "variants": [("no_write", fake("v_mismatch"))],
    },
    {  # the same, tested by a test from before KMINER_ISOLATE: each made case run alone
        "id": "aborted_legacy",
        "label": fake("aborts_legacy"),
        "variants": [("no_write", fake("v_mismatch"))],
    },
    {  # every wrong variant fails to build: the test's strength is unmeasured
        "id": "unmeasured",
        "label": fake("pass"),
        "variants": [("no_write", fake("v_nobuild")), ("off_by_one", fake("v_nobuild"))],
    },
    {
        "id": "alternate",  # an op_swap the test passes (maybe equivalent), then one it kills
        "label": fake("pass"),
        "variants": [
            ("op_swap", fake("v_pass")),
            ("op_swap", fake("v_mismatch")),
            ("op_swap", fake("v_segv")),
            ("no_write", fake("v_nobuild")),
            ("no_write", fake("v_mismatch")),
        ],
    },
]
FAKE_CASES = [
    {
        "id": "case_0",
        "shape": [[4, 8]],
        "dtype": "float32",
        "max_abs": 0.0,
        "max_rel": 0.0,
        "ok": True,
    },
    {
        "id": "case_1",
        "shape": [[1024]],
        "dtype": "float32",
        "max_abs": 0.0,
        "max_rel": 0.0,
        "ok": True,
    },
] + [
    {
        "id": f"case_{i}",
        "shape": [[n]],
        "dtype": "float64",
        "max_abs": 0.0,
        "max_rel": 0.0,
        "ok": True,
    }
    for i, n in ((2, 7), (3, 1024), (4, 7))
]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """The whole fake batch, run once: (bundle, results, the fake log of that run, the process)."""
    bundle = make_bundle(
        tmp_path_factory.mktemp("batch"), FAKE / "fake_check.py", FAKE / "ref.cpp", BATCH
    )
    args = ["--out", "results.json", "--jobs", "3", "--gpu-jobs", "2"]
    proc = run_py(bundle, *args, "--build-timeout", "8", "--run-timeout", "5")
    results = json.loads((bundle / "results.json").read_text())
    return bundle, results, fake_log(bundle), proc


def test_each_test_gets_its_share_of_the_cores_for_its_cpu_work(batch, tmp_path, monkeypatch):
    """Four tests side by side at 16 OpenMP threads each, beside 16 builds, left DCNv3's
    PyTorch reference unfinished at 180 s on the H100 box: each test's OpenMP threads are the
    bundle's build slots shared among its GPU runs (--jobs 3, --gpu-jobs 2: one), unless the
    user set OMP_NUM_THREADS."""
    import argparse

    log = batch[2]
    assert {line[6] for line in log if line[0] == "run"} == {"1"}
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    args = argparse.Namespace(jobs=16, gpu_jobs=4)
    assert runner.Runner(tmp_path, args, [None]).cpu_threads == 4
    assert runner.Runner(tmp_path, argparse.Namespace(jobs=2, gpu_jobs=8), [None]).cpu_threads == 1


def test_batch_completes_with_every_outcome(batch):
    _, results, _, proc = batch
    assert proc.returncode == 0, proc.stderr
    outcomes = {eid: (e["outcome"], e["phase"]) for eid, e in results["entries"].items()}
    assert outcomes == {
        "good": ("pass", "run"),
        "weak": ("weak_test", "run"),
        "mismatch": ("mismatch", "run"),
        "segv": ("crash", "run"),
        "hang": ("timeout", "run"),
        "nobuild": ("build_error", "build"),
        "importerr": ("import_error", "build"),
        "cudaerr": ("crash", "run"),
        "hangbuild": ("timeout", "build"),
        "asserts": ("mismatch", "run"),
        "noref": ("no_reference", ""),
        "alternate": ("pass", "run"),
        "short": ("weak_test", "run"),
        "unmeasured": ("weak_test", "run"),
        "calibrated": ("pass", "run"),
        "disagrees": ("reference_disagrees", "run"),
        "random": ("nondeterministic", "run"),
        "faulted": ("pass", "run"),
        "faulted_all": ("reference_disagrees", "run"),
        "aborted": ("pass", "run"),
        "aborted_legacy": ("pass", "run"),
        "judged": ("pass", "run"),
    }
    assert list(results["entries"]) == [e["id"] for e in BATCH]  # manifest order
    assert {k: results[k] for k in ("gpu", "torch", "cuda")} == {
        "gpu": "FakeGPU 80GB",
        "torch": "0.0.0+fake",
        "cuda": "12.9",
    }
    assert results["started"].startswith("20") and "T" in results["started"]
    assert proc.stdout.count("\n") == len(BATCH)  # one progress line per entry


def test_variants_leave_out_the_cases_the_labels_run_found_outside_the_contract(batch):
    """The label's run calibrates (KMINER_CALIBRATE): case_1 is outside the op's contract. A
    variant that differs from the label there only passes (KMINER_OUTSIDE), so the next of
    its kind is tried, and kills."""
    entry = batch[1]["entries"]["calibrated"]
    case_1 = next(c for c in entry["cases"] if c["id"] == "case_1")
    assert case_1["ok"] is None and case_1["note"].startswith(runner.OUTSIDE_NOTE)
    assert runner.outside_cases(entry["cases"]) == {"case_1": case_1["note"][len("invalid: ") :]}
    assert [v["outcome"] for v in entry["variants"]] == ["pass", "mismatch"]
    assert entry["kill_rate"] == 1.0


def test_a_test_short_for_why_its_cases_were_left_out_is_named_so(batch):
    """ScaledL2's CPU twin in PyTorch-Encoding returns the centres' gradient with the opposite
    sign: the label's run finds every case kminer made outside the contract and passes the one
    left, and so does every wrong variant. That is a reference computing something else (its
    own closed reason), not a test too weak to tell."""
    entry = batch[1]["entries"]["disagrees"]
    assert entry["outcome"] == "reference_disagrees"
    assert entry["detail"] == (
        "the repository's kernel and its reference disagree on 4 of the 5 cases, 1 left to "
        "judge it by: the reference computes something else, or the inputs kminer made break "
        "a contract neither checks"
    )
    assert [v["outcome"] for v in entry["variants"]] == ["pass"]
    # pytorch_cluster's random walk draws its own numbers: its one case left is no weak test
    random = batch[1]["entries"]["random"]
    assert (random["outcome"], random["kill_rate"]) == ("nondeterministic", 0.0)
    assert random["detail"] == (
        "the label or its reference gives another result when run again on 4 of the 5 cases, "
        "1 left to judge it by: the op draws its own random numbers or races, and no "
        "order-free comparison fits it"
    )
    from miner.candidate import Reason
    from testgen.bundle import REASONS

    assert REASONS["reference_disagrees"] is Reason.REFERENCE_DISAGREES


def test_a_variant_unstable_where_the_label_was_judged_is_killed(batch):
    """The label passed case_2 (one result, the reference's): a variant that gives another
    result each run there is not excused as nondeterministic (KMINER_JUDGED) but killed."""
    entry = batch[1]["entries"]["judged"]
    assert "case_2" in runner.judged_cases(entry["cases"])
    assert [v["outcome"] for v in entry["variants"]] == ["mismatch"]
    assert entry["kill_rate"] == 1.0
    assert runner.judged_cases([{"id": "a", "ok": None}, {"id": "b", "ok": False}]) == []


def test_a_label_faulting_on_a_made_case_runs_again_without_it(batch):
    """A CUDA fault ends the label's process; the case it faulted on was made by kminer, so
    the label runs again without it, and that run's verdict stands, with the case's reason."""
    _, results, log, _ = batch
    entry = results["entries"]["faulted"]
    assert runner.outside_cases(entry["cases"]) == {
        "case_3": "outside the op's contract: the kernel faults"
    }
    assert entry["kill_rate"] == 1.0
    label_runs = [line for line in log if line[0] == "run" and line[1] == "faulted.cu"]
    assert len(label_runs) == 2


def test_a_label_faulting_on_every_made_case_is_no_crash_of_its_kernel(batch):
    """pyg-lib's spline backward kernels faulted on every call kminer drafted that their CPU
    implementation ran clean: after three runs each leaving out one case, the test was a
    `crash`, a correct kernel blamed. One isolating run now finds the rest, and a test left
    with too little to judge by says why."""
    _, results, log, _ = batch
    entry = results["entries"]["faulted_all"]
    assert entry["outcome"] == "reference_disagrees"
    assert entry["detail"].startswith(
        "the repository's kernel faults where its reference runs on 4 of the 5 cases, 1 left"
    )
    notes = runner.outside_cases(entry["cases"])
    assert sorted(notes) == ["case_1", "case_2", "case_3", "case_4"]
    assert "(a CUDA fault)" in notes["case_4"]  # found by the isolating run
    runs = [line for line in log if line[0] == "run" and line[1] == "faulted_all.cu"]
    assert len(runs) == 1 + runner.MAX_FAULTED_CASES + 2  # the isolating run, the last one


def test_a_label_aborting_on_a_made_case_loses_that_case_not_the_test(batch):
    """The label's process dies by SIGABRT (a host `assert(false)`), and no report survives:
    one run tries each case kminer made in a child process of its own, the one that ends its
    child is left out with its reason, and the run without it stands. A test from before that
    run (no `ended` in its report) has each made case run alone. The recorded case_0 is never
    run apart."""
    _, results, log, _ = batch
    why = (
        "outside the op's contract: the repository's code ended the process on "
        "this input kminer made (run killed by SIGABRT)"
    )
    # the crash, the isolating run (a legacy test crashes again, then each made case runs
    # alone), the run without case_4
    for eid, runs in (("aborted", 1 + 1 + 1), ("aborted_legacy", 1 + 1 + 4 + 1)):
        entry = results["entries"][eid]
        assert runner.outside_cases(entry["cases"]) == {"case_4": why}, eid
        assert entry["kill_rate"] == 1.0
        assert len([line for line in log if line[:2] == ["run", f"{eid}.cu"]]) == runs, eid
    assert runner._case_ids(FAKE / "fake_check.py") == (
        [f"case_{i}" for i in range(5)],
        [f"case_{i}" for i in range(1, 5)],
    )


def test_a_surviving_variant_keeps_the_cases_it_passed(batch):
    """A weak test's surviving variant says where the test looked: its cases; a killed one's
    verdict needs no more than its detail."""
    variants = batch[1]["entries"]["weak"]["variants"]
    survivor = next(v for v in variants if v["outcome"] == "pass")
    assert [c["id"] for c in survivor["cases"]] == [c["id"] for c in FAKE_CASES]
    assert all(set(c) == {"id", "ok", "note"} for c in survivor["cases"])
    assert all("cases" not in v for v in variants if v["outcome"] != "pass")


def test_entry_fields(batch):
    entries = batch[1]["entries"]
    good = entries["good"]
    assert good["cases"] == FAKE_CASES
    assert good["kernel_time_us"] == 12.5
    assert good["kill_rate"] == 1.0
    assert good["detail"] == ""
    # good and weak test the same label in one build folder: whichever builds second finds it
    # built (the order is the pool's), and only that one says cached
    shared = (good, entries["weak"])
    assert sorted(e["build_cached"] for e in shared) == [False, True]
    assert next(e for e in shared if not e["build_cached"])["build_s"] > 0 and good["run_s"] > 0
    assert "1 passed" in good["log_tail"]
    assert [(v["kind"], v["path"], v["outcome"]) for v in good["variants"]] == [
        ("off_by_one", "variants/good.0.cu", "mismatch"),
        ("no_write", "variants/good.1.cu", "invalid"),  # does not build: not a kill
        ("op_swap", "variants/good.2.cu", "crash"),
    ]
    assert good["variants"][1]["detail"] == "label.cu(3): error: expected a ';'"
    assert good["variants"][2]["detail"] == "run killed by SIGSEGV"
    weak = entries["weak"]
    assert weak["kill_rate"] == 0.5
    assert [(v["kind"], v["outcome"]) for v in weak["variants"]] == [
        ("op_swap", "pass"),
        ("off_by_one", "mismatch"),
    ]
    assert weak["detail"] == "passed every wrong variant of: op_swap"
    alt = entries["alternate"]  # the next of a kind stands in for a survivor or a non-build
    assert [(v["kind"], v["outcome"]) for v in alt["variants"]] == [
        ("op_swap", "pass"),
        ("op_swap", "mismatch"),
        ("no_write", "invalid"),
        ("no_write", "mismatch"),
    ]
    assert alt["kill_rate"] == 1.0 and alt["detail"] == ""
    assert entries["short"]["detail"] == "5 valid cases over 3 shapes (needs 6 over 2)"
    unmeasured = entries["unmeasured"]
    assert unmeasured["kill_rate"] is None
    assert unmeasured["detail"] == "none of its 2 wrong variants built: its kill rate is unmeasured"
    assert [v["outcome"] for v in unmeasured["variants"]] == ["invalid", "invalid"]
    mismatch = entries["mismatch"]
    assert mismatch["cases"][1]["ok"] is False and mismatch["cases"][1]["max_abs"] == 1.5
    assert mismatch["kill_rate"] is None and mismatch["variants"] == []  # label failed: no variants
    assert entries["segv"]["detail"] == "run killed by SIGSEGV"
    # where it was, from the stacks pytest's faulthandler printed just before the limit
    # and what it had judged by then, which the test wrote as it went
    assert re.fullmatch(
        r"run timed out after 5s \(in \w+ at hang\.py:\d+\); 2 cases judged before it: "
        r"1 differ, 0 left out",
        entries["hang"]["detail"],
    )
    assert [c["ok"] for c in entries["hang"]["cases"]] == [True, False]
    assert (
        entries["hang"]["log_tail"].startswith("Timeout (")
        and "hang.py" in entries["hang"]["log_tail"]
    )
    assert (
        entries["hangbuild"]["detail"]
        == "build timed out after 8s (in test_fake at hangbuild.py:87)"
    )
    assert entries["nobuild"]["detail"] == "label.cu(3): error: expected a ';'"
    assert entries["importerr"]["detail"] == "ImportError: undefined symbol: _Z3foov"
    assert "illegal memory access" in entries["cudaerr"]["detail"]
    assert "wrong values" in entries["asserts"]["detail"]
    assert entries["noref"]["build_s"] == 0.0 and entries["noref"]["cases"] == []
    for e in entries.values():
        assert e["outcome"] in runner.OUTCOMES
        assert set(e) == set(entries["good"])


def test_each_source_and_each_reference_built_once(batch):
    _, _, log, _ = batch
    builds = collections.Counter(line[2] for line in log if line[0] == "build")
    assert set(builds.values()) == {1}  # the same label or variant is never built twice
    # pass.cu (good, weak) and v_mismatch (good, weak) are each built once for the two entries
    sources = {fake(n).read_bytes() for n in ("pass", "v_mismatch", "v_nobuild", "v_segv")}
    sources |= {fake(n).read_bytes() for n in ("v_pass", "mismatch", "segv", "hang", "nobuild")}
    sources |= {fake(n).read_bytes() for n in ("importerr", "cudaerr", "hangbuild", "asserts")}
    sources |= {fake(n).read_bytes() for n in ("calibrated", "v_calibrated", "faults")}
    sources |= {fake(n).read_bytes() for n in ("v_unstable", "aborts", "aborts_legacy")}
    sources |= {fake(n).read_bytes() for n in ("disagrees", "random", "faults_all")}
    assert len(builds) == len(sources) == 22
    dirs = collections.defaultdict(set)  # candidate -> build folders its label and variants got
    for _step, name, _, build_dir, *_ in log:
        dirs[name.split(".")[0]].add(build_dir)
    assert all(len(d) == 1 for d in dirs.values())
    # the build folder is keyed by the reference alone: every entry here shares one reference, so
    # one folder serves them all and a regenerated test never rebuilds what it already has
    assert len(set().union(*dirs.values())) == 1
    refbuilds = [line for line in log if line[0] == "refbuild"]
    assert len(refbuilds) == 1


def test_second_run_builds_nothing(batch):
    bundle, results, _, _ = batch
    before = len(fake_log(bundle))
    ids = ["good", "weak", "mismatch", "segv", "nobuild", "importerr"]  # in manifest order
    proc = run_py(bundle, "--out", "again.json", "--only", *ids, "--jobs", "3")
    assert proc.returncode == 0, proc.stderr
    again = json.loads((bundle / "again.json").read_text())["entries"]
    assert list(again) == ids
    new = fake_log(bundle)[before:]
    assert [line[0] for line in new if line[0] != "run"] == []  # build verdicts come from the cache
    for eid in ids:
        assert same(again[eid], results["entries"][eid]), eid
        assert again[eid]["build_cached"] is True and again[eid]["build_s"] == 0.0


def test_resume_skips_what_is_done(batch):
    bundle, results, _, _ = batch
    partial = json.loads(json.dumps(results))
    for eid in ("mismatch", "asserts", "noref"):
        del partial["entries"][eid]
    (bundle / "partial.json").write_text(json.dumps(partial))
    before = len(fake_log(bundle))
    proc = run_py(bundle, "--out", "partial.json", "--resume")
    assert proc.returncode == 0, proc.stderr
    resumed = json.loads((bundle / "partial.json").read_text())
    assert {line[1] for line in fake_log(bundle)[before:]} == {"mismatch.cu", "asserts.cu"}
    assert list(resumed["entries"]) == list(results["entries"])
    for eid, e in resumed["entries"].items():
        if eid in ("mismatch", "asserts", "noref"):
            assert same(e, results["entries"][eid]), eid
        else:
            assert e == results["entries"][eid], eid  # untouched, timings included
    assert resumed["started"] == results["started"]


def test_resume_goes_on_within_an_entry(batch):
    """A call cut short after the label and one wrong variant: the next call runs neither again
    and finishes the entry as one uninterrupted run would have."""
    bundle, results, _, _ = batch
    whole = results["entries"]["alternate"]
    sources = runner._digest(*(bundle / p for p in ("tests/alternate.py", "labels/alternate.cu")),
                             bundle / "references/ref.cpp")  # fmt: skip
    begun = {**whole, "variants": whole["variants"][:1], "_env": {"gpu": "", "torch": ""}}
    begun["_sources"] = sources
    partial = json.loads(json.dumps(results))
    del partial["entries"]["alternate"]
    partial["partial"] = {"alternate": begun}
    (bundle / "within.json").write_text(json.dumps(partial))
    before = len(fake_log(bundle))
    proc = run_py(bundle, "--out", "within.json", "--resume", "--only", "alternate")
    assert proc.returncode == 0, proc.stderr
    resumed = json.loads((bundle / "within.json").read_text())
    ran = {line[1] for line in fake_log(bundle)[before:] if line[0] == "run"}
    assert "alternate.cu" not in ran and "alternate.0.cu" not in ran
    assert "alternate.1.cu" in ran  # the op_swap the test kills, after the one it passed
    assert same(resumed["entries"]["alternate"], whole)
    assert resumed["partial"] == {}  # a finished entry leaves no partial record
    # begun on other bytes (the test was generated again since): the entry starts over
    stale = json.loads(json.dumps(partial))
    stale["partial"]["alternate"]["_sources"] = "0" * 20
    (bundle / "stale.json").write_text(json.dumps(stale))
    before = len(fake_log(bundle))
    proc = run_py(bundle, "--out", "stale.json", "--resume", "--only", "alternate")
    assert proc.returncode == 0, proc.stderr
    ran = {line[1] for line in fake_log(bundle)[before:] if line[0] == "run"}
    assert {"alternate.cu", "alternate.0.cu"} <= ran


def test_interrupted_run_keeps_what_it_did(tmp_path):
    """The stuck test comes first and shares the quick one's build folder: only builds hold
    that folder, so the quick one still runs and is recorded while the stuck one hangs."""
    quick = {"id": "quick", "label": fake("pass"), "variants": [("no_write", fake("v_mismatch"))]}
    entries = [{"id": "stuck", "label": fake("hang")}, quick]
    bundle = make_bundle(tmp_path / "b", FAKE / "fake_check.py", FAKE / "ref.cpp", entries)
    argv = [sys.executable, str(bundle / "run.py"), "--out", "results.json", "--gpu-jobs", "2"]
    proc = subprocess.Popen([*argv, "--run-timeout", "600"], cwd=bundle)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stuck = [line for line in fake_log(bundle) if line[:2] == ["run", "stuck.cu"]]
            out = runner._read_json(bundle / "results.json") or {}
            if stuck and "quick" in out.get("entries", {}):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the batch did not get going")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    out = json.loads((bundle / "results.json").read_text())
    assert list(out["entries"]) == ["quick"] and out["entries"]["quick"]["outcome"] == "pass"
    assert stuck and running(str(bundle / "tests" / "stuck.py")) == []  # it went with the runner


def test_one_runner_a_bundle_and_the_build_locks_a_killed_run_left_are_freed(tmp_path):
    """A device call cut short kills run.py mid-build and leaves torch's lock file in the build
    folder; the next run's build of that folder would wait on it forever. A runner holds the
    bundle's build folders alone, so it frees such locks, and a second runner is refused."""
    quick = {"id": "quick", "label": fake("pass"), "variants": [("no_write", fake("v_mismatch"))]}
    bundle = make_bundle(tmp_path / "b", FAKE / "fake_check.py", FAKE / "ref.cpp", [quick])
    left = [bundle / ".build" / "x" / "kminer_label_0123" / "lock", bundle / ".build" / "lock"]
    for lock in left:
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_text("")
    held = prebuild.hold_builds(bundle / ".build")
    try:
        assert not any(lock.exists() for lock in left)
        with pytest.raises(prebuild.BundleBusy):
            prebuild.hold_builds(bundle / ".build")
        proc = run_py(bundle, "--out", "results.json")
        assert proc.returncode == 2 and "another run.py is using" in proc.stderr
        assert not (bundle / "results.json").exists()
    finally:
        held.close()
    left[0].write_text("")
    proc = run_py(bundle, "--out", "results.json")  # the hold went with its holder
    assert proc.returncode == 0, proc.stderr
    assert "freed 1 build lock(s)" in proc.stderr and not left[0].exists()
    results = json.loads((bundle / "results.json").read_text())["entries"]
    assert (results["quick"]["outcome"], results["quick"]["kill_rate"]) == ("pass", 1.0)


def test_the_first_rounds_results_are_written_while_later_rounds_are_prebuilt(
    tmp_path, monkeypatch
):
    """Sources are prebuilt a round of entries at a time, and a round's tests start as soon as
    its sources are built: a call whose time runs out while building (a bundle of 25 mmcv
    entries took 529 s to prebuild on 8 cores) keeps the results of the rounds before."""
    entries = [
        {"id": f"e{i}", "label": fake("pass"), "variants": [("no_write", fake("v_mismatch"))]}
        for i in range(5)
    ]
    bundle = make_bundle(tmp_path / "b", FAKE / "fake_check.py", FAKE / "ref.cpp", entries)
    for test in (bundle / "tests").glob("*.py"):  # tests that would import prebuilt modules
        test.write_text(test.read_text() + "\n# reads KMINER_PREBUILT\n")
    out = bundle / "results.json"
    rounds, seen_before = [], []

    def slow_prebuild(files, store, jobs, timeout, compile_fn=None, heavy=frozenset()):
        rounds.append(sorted({f.stem.split(".")[0] for f in files if f.parent.name == "labels"}))
        if len(rounds) == 3:  # the last round waits for the first round's results on disk
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                done = (runner._read_json(out) or {}).get("entries", {})
                if {"e0", "e1"} <= set(done):
                    break
                time.sleep(0.1)
            seen_before.extend(sorted((runner._read_json(out) or {}).get("entries", {})))
        return {}

    monkeypatch.setattr(prebuild, "prebuild", slow_prebuild)
    monkeypatch.chdir(bundle)
    handler = signal.getsignal(signal.SIGTERM)  # main() takes SIGTERM: given back below
    try:
        rc = runner.main(
            ["--bundle", str(bundle), "--out", str(out), "--jobs", "2", "--gpu-jobs", "2"]
        )
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert rc == 0
    assert rounds == [["e0", "e1"], ["e2", "e3"], ["e4"]]
    assert {"e0", "e1"} <= set(seen_before)  # written before the last round was built
    done = json.loads(out.read_text())["entries"]
    assert list(done) == [f"e{i}" for i in range(5)]
    assert {e["outcome"] for e in done.values()} == {"pass"}


def test_verdicts():
    def proc(rc=1, timed_out=False, report=None, log=""):
        return runner.Proc(rc, timed_out, 1.0, report or {}, log)

    assert runner.verdict("run", proc(rc=None, timed_out=True), 3) == (
        "timeout",
        "run timed out after 3s",
    )
    # the stacks faulthandler printed before the limit say where the test was: its own frame,
    # and the innermost one when that lies elsewhere (a build lock waited on forever)
    dump = (
        "Timeout (0:02:42)!\nThread 0x00007f01 (most recent call first):\n"
        '  File "/usr/lib/python3/threading.py", line 355 in wait\n'
        "Thread 0x00007f00 (most recent call first):\n"
        '  File "/x/torch/utils/file_baton.py", line 42 in wait\n'
        '  File "/x/torch/utils/cpp_extension.py", line 2110 in _jit_compile\n'
        '  File "/b/tests/0123abcd.py", line 886 in _label_unfused\n'
        '  File "/b/tests/0123abcd.py", line 1200 in test_kernel\n'
    )
    assert runner.verdict("run", proc(rc=None, timed_out=True, log=dump), 180) == (
        "timeout",
        "run timed out after 180s (in _label_unfused at 0123abcd.py:886, inside wait at "
        "file_baton.py:42)",
    )
    assert runner.log_tail("pytest noise\n" + dump).startswith("Timeout (0:02:42)!")
    assert runner.verdict("run", proc(rc=-9), 3) == ("crash", "run killed by SIGKILL")
    assert runner.verdict("build", proc(rc=-11), 3) == ("crash", "build killed by SIGSEGV")
    misaligned = "E   RuntimeError: CUDA error: misaligned address"
    assert runner.verdict("run", proc(rc=0, report={"outcome": "pass"}, log=misaligned), 3) == (
        "crash",
        "RuntimeError: CUDA error: misaligned address",
    )
    # the build phase reads no CUDA error into the compiler's output
    assert runner.verdict("build", proc(rc=0, log="device-side assert"), 3) == ("pass", "")
    assert runner.verdict("run", proc(report={"outcome": "mismatch", "error": "case_1"}), 3) == (
        "mismatch",
        "case_1",
    )
    assert (
        runner.verdict("run", proc(report={"outcome": "pass"}, log="x\nAssertionError"), 3)[0]
        == "mismatch"
    )
    assert runner.verdict("run", proc(rc=2, log="ERROR collecting"), 3) == (
        "crash",
        "ERROR collecting",
    )
    assert runner.verdict("build", proc(rc=1, log="boom"), 3) == ("build_error", "boom")
    assert runner.verdict("run", proc(rc=0, report={"outcome": "nonsense"}), 3) == ("pass", "")


@pytest.mark.parametrize(
    "manifest, message",
    [
        ("not json", "unreadable manifest"),
        ({"id": "x"}, "not a list"),
        ([{"id": "x", "test": "t.py"}], "entry 0 lacks"),
        ([{"id": "x", "test": "../t.py", "label": "l.cu"}], "outside the bundle"),
        ([{"id": "x", "test": "t.py", "label": "/etc/passwd"}], "outside the bundle"),
        ([{"id": "x", "test": "t.py", "label": "l.cu", "variants": [{"kind": "k"}]}], "entry 0"),
        ([{"id": "x", "test": "t.py", "label": "l.cu"}] * 2, "duplicate"),
    ],
)
def test_bad_manifest(tmp_path, capsys, manifest, message):
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    (tmp_path / "manifest.json").write_text(text)
    assert runner.main(["--bundle", str(tmp_path), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "r.json").exists()


# ---------------------------------------------------------------- bundle: write and ingest


def _candidates(workdir: Path):
    """Candidates with their files in `workdir`: a (passes, 2 variants), b (mismatch), c (no
    reference), d (no test yet: not bundled), e (its label is gone: skipped)."""
    from miner.candidate import Candidate, Kernel, Provenance, Reference, Tests, Wrapper

    def cand(cid, label=None, ref=True, variants=(), test=True):
        for sub in ("labels", "tests", "refs", "variants"):
            (workdir / sub).mkdir(parents=True, exist_ok=True)
        wrapper = Wrapper(label_path=f"labels/{cid}.cu", label_hash=f"lh-{cid}")
        if label:
            shutil.copy(fake(label), workdir / wrapper.label_path)
        tests = Tests(path=f"tests/test_{cid}.py" if test else "", hash=f"th-{cid}")
        if test:
            shutil.copy(FAKE / "fake_check.py", workdir / tests.path)
        for n, (kind, name) in enumerate(variants):
            tests.variants.append(f"variants/{cid}_{n}.cu")
            tests.variant_kinds.append(kind)
            shutil.copy(fake(name), workdir / tests.variants[-1])
        reference = Reference(kind="cpp", path=f"refs/{cid}.cpp" if ref else "", hash=f"rh-{cid}")
        if ref:
            shutil.copy(FAKE / "ref.cpp", workdir / reference.path)
        kernel = Kernel(name="k", file="k.cu", line=1, start_line=1, end_line=2, source="")
        provenance = Provenance(repo_url="https://example.com/r", commit="0" * 40)
        return Candidate(
            id=cid,
            provenance=provenance,
            kernel=kernel,
            wrapper=wrapper,
            reference=reference,
            tests=tests,
        )

    return [
        cand("a", "pass", variants=[("off_by_one", "v_mismatch"), ("no_write", "v_nobuild")]),
        cand("b", "mismatch"),
        cand("c", "pass", ref=False),
        cand("d", "pass", test=False),
        cand("e", None),
    ]


def test_write_bundle_run_and_ingest(tmp_path):
    pytest.importorskip("pydantic")
    from miner.candidate import Reason, StageName, Status
    from testgen.bundle import ingest, write_bundle

    cands = _candidates(tmp_path / "work")
    info = write_bundle(tmp_path / "work", cands, tmp_path / "out" / "verify.tar.gz")
    assert info.ids == ["a", "b", "c"]
    assert info.skipped == {"e": "label missing: labels/e.cu"}
    blob = info.path.read_bytes()
    assert (
        write_bundle(
            tmp_path / "work", cands, tmp_path / "again" / "verify.tar.gz"
        ).path.read_bytes()
        == blob
    )
    with tarfile.open(info.path) as tar:
        names = sorted(m.name for m in tar.getmembers())
        run_py_member = tar.getmember("verify/run.py")
        assert run_py_member.mode == 0o755
        assert tar.extractfile(run_py_member).read() == RUNNER.read_bytes()
        tar.extractall(tmp_path / "box", filter="data")
    carried = ["verify/bin/bwrap"] if sandbox.bwrap_tool() else []  # bubblewrap for the GPU box
    assert names == [
        "verify/README.txt",
        "verify/batching.py",
        *carried,
        "verify/labels/a.cu",
        "verify/labels/b.cu",
        "verify/labels/c.cu",
        "verify/manifest.json",
        "verify/prebuild.py",
        "verify/references/a.cpp",
        "verify/references/b.cpp",
        "verify/run.py",
        "verify/sandbox.py",
        "verify/supervisor.py",
        "verify/tests/a.py",
        "verify/tests/b.py",
        "verify/tests/c.py",
        "verify/toolchain.py",
        "verify/variants/a.0.off_by_one.cu",
        "verify/variants/a.1.no_write.cu",
    ]
    box = tmp_path / "box" / "verify"
    manifest = json.loads((box / "manifest.json").read_text())
    assert manifest[0] == {
        "id": "a",
        "test": "tests/a.py",
        "label": "labels/a.cu",
        "reference": "references/a.cpp",
        "variants": [
            {"kind": "off_by_one", "path": "variants/a.0.off_by_one.cu"},
            {"kind": "no_write", "path": "variants/a.1.no_write.cu"},
        ],
        "min_cases": 5,
        "min_shapes": 3,
    }
    assert manifest[2]["reference"] is None
    assert "python run.py" in (box / "README.txt").read_text()

    proc = run_py(box, "--out", str(tmp_path / "results.json"), "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    done = ingest(tmp_path / "results.json", cands)
    assert [c.id for c in done] == ["a", "b", "c"]
    a, b, c = (x.stage(StageName.VERIFY) for x in done)
    assert (a.status, a.reason, a.detail) == (Status.OK, None, "")
    assert a.metrics == {
        "outcome": "pass",
        "kill_rate": 1.0,
        "kernel_time_us": 12.5,
        "gpu": "FakeGPU 80GB",
        "torch": "0.0.0+fake",
        "cuda": "12.9",
        "nvcc": toolchain.nvcc_version(),  # the release of the nvcc on PATH here ('' without one)
        "cases": FAKE_CASES,
        "valid_cases": 5,
        "valid_shapes": 3,
        "variants": [
            {
                "kind": "off_by_one",
                "outcome": "mismatch",
                "detail": "FAILED ::test_fake - AssertionError: case_1 differs from the reference",
            },
            {
                "kind": "no_write",
                "outcome": "invalid",
                "detail": "label.cu(3): error: expected a ';'",
            },
        ],
    }
    assert a.seconds > 0 and len(a.key) == 16
    assert (b.status, b.reason, b.metrics["outcome"]) == (Status.ERROR, Reason.MISMATCH, "mismatch")
    assert "differs from the reference" in b.detail
    assert (c.status, c.reason, c.metrics["kill_rate"]) == (Status.ERROR, Reason.NO_REFERENCE, None)
    assert cands[3].stage(StageName.VERIFY) is None and cands[4].stage(StageName.VERIFY) is None


@pytest.mark.parametrize("outcome", runner.OUTCOMES)
def test_ingest_maps_every_outcome(tmp_path, outcome):
    pytest.importorskip("pydantic")
    from miner.candidate import Reason, StageName, Status
    from testgen.bundle import ingest

    (cand,) = _candidates(tmp_path / "work")[1:2]
    invalid = {"id": "case_0", "shape": [[3]], "ok": None, "note": "invalid: reference refused"}
    valid = {"id": "case_1", "shape": [[3]], "ok": outcome == "pass"}
    cases = [invalid, valid, dict(valid, id="case_2")]
    entry = {"outcome": outcome, "cases": cases, "kill_rate": None, "detail": "why", "build_s": 1.5}
    (tmp_path / "r.json").write_text(json.dumps({"gpu": "H100", "entries": {"b": entry}}))
    (done,) = ingest(tmp_path / "r.json", [cand])
    result = done.stage(StageName.VERIFY)
    assert result.status == (Status.OK if outcome == "pass" else Status.ERROR)
    assert result.reason == (None if outcome == "pass" else Reason(outcome))
    assert result.metrics["outcome"] == outcome and result.metrics["gpu"] == "H100"
    assert result.metrics["torch"] == "" and result.seconds == 1.5 and result.detail == "why"
    # a case the reference refused is not counted as one the kernel was checked on
    assert (result.metrics["valid_cases"], result.metrics["valid_shapes"]) == (2, 1)


def test_ingest_reports_unknown_ids_and_rejects_bad_files(tmp_path, caplog):
    pytest.importorskip("pydantic")
    from testgen.bundle import ingest

    cands = _candidates(tmp_path / "work")
    good = {"outcome": "pass", "cases": []}
    (tmp_path / "r.json").write_text(json.dumps({"entries": {"a": good, "zz": good}}))
    with caplog.at_level("WARNING"):
        assert [c.id for c in ingest(tmp_path / "r.json", cands)] == ["a"]
    assert "zz" in caplog.text
    bad = [
        "{not json",
        json.dumps([1, 2]),
        json.dumps({"entries": {"a": "pass"}}),
        json.dumps({"entries": {"a": {"outcome": "exploded"}}}),
        json.dumps({"entries": {"a": {"outcome": "pass", "kill_rate": "high"}}}),
        json.dumps({"entries": {"a": {"outcome": "pass", "cases": {}}}}),
    ]
    for text in bad:
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ValueError) as err:
            ingest(tmp_path / "bad.json", cands)
        assert "\n" not in str(err.value) and "bad.json" in str(err.value)
    with pytest.raises(ValueError, match="No such file"):
        ingest(tmp_path / "missing.json", cands)


# ---------------------------------------------------------------- real extensions


@pytest.mark.slow
def test_cpu_extensions_through_the_runner(tmp_path):
    """The contract with real torch extensions, on the CPU: a label that passes and kills its
    wrong variant, and the wrong one as a label; both share one build folder and one reference."""
    entries = [
        {
            "id": "a",
            "label": CUDA / "cpu_good.cpp",
            "group": "cpu",
            "variants": [("op_swap", CUDA / "cpu_wrong.cpp")],
        },
        {"id": "b", "label": CUDA / "cpu_wrong.cpp", "group": "cpu"},
    ]
    bundle = make_bundle(tmp_path / "b", CUDA / "affine_check.py", CUDA / "ref.cpp", entries)
    proc = run_py(bundle, "--out", "results.json", "--jobs", "2", timeout=1200)
    assert proc.returncode == 0, proc.stderr
    entries = json.loads((bundle / "results.json").read_text())["entries"]
    a, b = entries["a"], entries["b"]
    assert (a["outcome"], a["kill_rate"], a["variants"][0]["outcome"]) == ("pass", 1.0, "mismatch")
    assert [c["ok"] for c in a["cases"]] == [True, True] and a["kernel_time_us"] > 0
    assert set(a["cases"][0]) == {"id", "shape", "dtype", "max_abs", "max_rel", "ok"}
    assert b["outcome"] == "mismatch" and b["cases"][0]["max_abs"] == pytest.approx(1.0)
    (build_dir,) = [p for p in (bundle / ".build").iterdir() if p.is_dir()]  # and the hold
    modules = sorted(p.name.rsplit("_", 1)[0] for p in build_dir.glob("kminer_*"))
    assert modules == ["kminer_label", "kminer_label", "kminer_reference"]  # reference built once


@pytest.mark.slow
def test_a_build_lock_left_in_a_real_build_folder_does_not_stall_the_next_run(tmp_path):
    """torch's own lock file, in the folders of real CPU extensions (each load of a module takes
    it, the run phase's too): as a run killed mid-build leaves it, the next run still passes."""
    wrong = [("op_swap", CUDA / "cpu_wrong.cpp")]
    entries = [{"id": "a", "label": CUDA / "cpu_good.cpp", "variants": wrong}]
    bundle = make_bundle(tmp_path / "b", CUDA / "affine_check.py", CUDA / "ref.cpp", entries)
    proc = run_py(bundle, "--out", "first.json", "--jobs", "2", timeout=1200)
    assert proc.returncode == 0, proc.stderr
    folders = [p for p in (bundle / ".build").rglob("kminer_*") if (p / "build.ninja").is_file()]
    assert len(folders) == 3  # the label's, its wrong variant's and the reference's
    for folder in folders:
        (folder / "lock").write_text("")
    proc = run_py(bundle, "--out", "again.json", "--run-timeout", "120", timeout=600)
    assert proc.returncode == 0, proc.stderr
    again = json.loads((bundle / "again.json").read_text())["entries"]["a"]
    assert (again["outcome"], again["kill_rate"]) == ("pass", 1.0), again["detail"]
    assert again["build_cached"] is True


@pytest.mark.gpu
def test_gpu_crash_hang_and_pass(tmp_path):
    """Real CUDA labels: one that is right (and kills its wrong variant), one that writes to an
    illegal address, one that never ends. The batch finishes, and a rerun rebuilds nothing."""
    entries = [
        {
            "id": "good",
            "label": CUDA / "good.cu",
            "variants": [("op_swap", CUDA / "wrong.cu"), ("no_write", CUDA / "broken.cu")],
        },
        {"id": "oob", "label": CUDA / "oob.cu"},
        {"id": "spin", "label": CUDA / "spin.cu"},
    ]
    bundle = make_bundle(tmp_path / "b", CUDA / "affine_check.py", CUDA / "ref.cpp", entries)
    args = ["--build-timeout", "900", "--run-timeout", "60"]
    proc = run_py(bundle, "--out", "results.json", *args, timeout=1500)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((bundle / "results.json").read_text())
    good, oob, spin = (results["entries"][k] for k in ("good", "oob", "spin"))
    assert good["outcome"] == "pass", good["log_tail"]
    assert good["kill_rate"] == 1.0
    assert [(v["kind"], v["outcome"]) for v in good["variants"]] == [
        ("op_swap", "mismatch"),
        ("no_write", "invalid"),
    ]
    assert all(c["ok"] for c in good["cases"]) and good["kernel_time_us"] > 0
    assert oob["outcome"] == "crash", oob["log_tail"]
    assert "illegal memory access" in oob["detail"].lower()
    assert (spin["outcome"], spin["phase"]) == ("timeout", "run"), spin["log_tail"]
    assert results["gpu"] and results["cuda"] and results["torch"]
    again = run_py(bundle, "--out", "again.json", "--only", "good", *args, timeout=900)
    assert again.returncode == 0, again.stderr
    rerun = json.loads((bundle / "again.json").read_text())["entries"]["good"]
    assert (rerun["outcome"], rerun["build_cached"], rerun["kill_rate"]) == ("pass", True, 1.0)


def _template_functions(*names: str) -> dict:
    """Functions of the generated test's template (plain Python between its Jinja fields),
    run in a namespace of their own."""
    text = (ROOT / "prompts" / "test_code.py.j2").read_text()
    scope: dict = {}
    exec("import torch\nDEVICE = 'cuda'\n", scope)
    for name in names:
        start = text.index(f"\ndef {name}(")
        end = text.index("\ndef ", start + 1)
        exec(text[start:end], scope)
    return scope


@pytest.mark.gpu
def test_poison_fills_the_free_blocks_beside_live_tensors():
    """The caching allocator hands out the smallest free block that fits: a leftover beside
    live tensors, which holds an earlier output (a kernel that never writes its own would pass
    with the last run's values). After _poison, a new allocation holds the poison byte."""
    import torch

    scope = _template_functions("_poison", "_free_blocks")
    live = torch.arange(64.0, device="cuda")
    stale = torch.full((64,), 7, dtype=torch.int64, device="cuda")  # beside `live`
    after = torch.ones(64, device="cuda")
    del stale
    scope["_poison"]([64 * 8, 3 << 20], 0x5A)
    fresh = torch.empty(64, dtype=torch.int64, device="cuda")
    big = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")  # a new segment's worth
    assert bool((fresh.view(torch.uint8) == 0x5A).all()), fresh[:4].tolist()
    assert bool((big == 0x5A).all())
    assert live.sum().item() == 2016.0 and after.sum().item() == 64.0  # live tensors untouched


def test_a_label_refusing_the_width_of_integer_tensors_gets_the_same_values_at_its_width():
    """A case drafted from a CPU side that reads int64 indices (torch-points-kernels'
    knn_interpolate, reached from other Python than its CUDA op) met a label that checks int32
    (three_interpolate): on the H100 every case was `invalid`, and the test had none. The same
    values at the width the label's check names are the same input."""
    import re

    import torch

    scope = _template_functions("_ints_retyped")
    scope["re"] = re
    retyped = scope["_ints_retyped"]
    idx, feats = torch.tensor([[0, 2, 1]]), torch.randn(1, 3)
    error = RuntimeError("expected scalar type Int but found Long")
    narrowed = retyped([feats, idx, 3], error)
    assert narrowed[1].dtype == torch.int32 and narrowed[1].tolist() == idx.tolist()
    assert narrowed[0] is feats and narrowed[2] == 3
    widened = retyped([idx.int()], RuntimeError("expected scalar type Long but found Int"))
    assert widened[0].dtype == torch.int64
    assert retyped([feats, idx], RuntimeError("expected scalar type Float but found Long")) is None
    assert retyped([feats], error) is None  # no tensor of the refused width
    assert retyped([torch.tensor([2**40])], error) is None  # a value int32 cannot hold


def test_a_test_ended_by_a_signal_keeps_where_it_died():
    """pyg-lib's scatter tests died of SIGSEGV on the H100 and their log tails held only
    pytest's outermost frames: faulthandler prints the innermost first."""
    from testgen.standalone.runner import LOG_TAIL, log_tail

    frames = "".join(f'  File "/x/_pytest/f{i}.py", line {i} in f{i}\n' for i in range(200))
    log = (
        "collected 1 item\nFatal Python error: Segmentation fault\n\n"
        "Current thread 0x7f (most recent call first):\n"
        '  File "/b/tests/t.py", line 1401 in _label_call\n' + frames
    )
    kept = log_tail(log)
    assert kept.startswith("Current thread") and "line 1401 in _label_call" in kept
    assert len(kept) == LOG_TAIL
    assert log_tail("x" * 5000 + "1 failed") == ("x" * 5000 + "1 failed")[-LOG_TAIL:]


def test_a_label_refusing_a_strided_tensor_gets_the_same_values_laid_out_contiguously():
    """pyg-lib's tests pass transposed views to spline_weighting on purpose (its autograd layer
    makes them contiguous before the CUDA function, which checks `x.is_contiguous()`); the
    recorded call reached the label strided and the test crashed on the H100 ("x must be
    contiguous") for a correct kernel."""
    import re
    import types

    import torch

    scope = _template_functions(
        "_ints_retyped", "_made_contiguous", "_strided", "_on_device", "_label_call"
    )
    scope.update(re=re, DEVICE="cpu", FUNCTION="weighting")

    def weighting(x, w):
        if not x.is_contiguous():
            raise RuntimeError("x must be contiguous")
        return x @ w

    label = types.SimpleNamespace(weighting=weighting)
    x, w = torch.randn(4, 3).t(), torch.randn(4, 2)
    returned, mine, args = scope["_label_call"](label, [x, w], [x.clone(), w.clone()])
    assert torch.allclose(returned, x @ w) and mine[0].is_contiguous() and args[0].is_contiguous()
    assert torch.equal(args[0], x)  # the same values
    made = scope["_made_contiguous"]
    assert made([x.contiguous(), w], RuntimeError("x must be contiguous")) is None  # nothing to do
    assert made([x, w], RuntimeError("index out of range")) is None  # another refusal stands


def test_the_reference_takes_the_layout_the_labels_check_asked_for():
    """pyg-lib's CPU spline_weighting reads the data_ptr of what it is given (its autograd layer
    made it contiguous): handed the recorded transposed view while the label got it laid out
    contiguously, it computed on other values and the correct kernel failed 2 of 16 cases."""
    import types

    import torch

    scope = _template_functions("_strided", "_upcast", "_reference_laid_out")
    scope.update(_reference=lambda reference, args: ([reference.reference(*args)], ""))

    def raw(x):  # reads memory in storage order, as C++ on data_ptr does
        return torch.as_strided(x, x.shape, (x.shape[1], 1)) * 2

    ref = types.SimpleNamespace(reference=raw)
    x = torch.arange(12.0).reshape(3, 4).t()
    again = scope["_reference_laid_out"](ref, [x], [x.contiguous()], "float32")
    assert again is not None and torch.equal(again[1][0][0], x * 2)
    assert not torch.equal(raw(x), x * 2)  # the strided view would have been read wrong
    assert scope["_reference_laid_out"](ref, [x.contiguous()], [x.contiguous()], "float32") is None
    assert scope["_reference_laid_out"](ref, [x], [x], "float32") is None  # no retry: as is


def test_the_kernels_timing_runs_at_the_width_its_cases_ran():
    """On the H100 torch-points-kernels' three_interpolate ran its cases at the width it checks,
    then `crash` came from the timing call, which still passed the drafted int64 indices."""
    import re
    import statistics
    import types

    import torch

    scope = _template_functions(
        "_ints_retyped", "_on_device", "_label_call", "_prepare", "_kernel_time_us"
    )
    scope.update(re=re, statistics=statistics, DEVICE="cpu", FUNCTION="interpolate", LARGE=1000)
    seen = []

    def interpolate(features, idx):
        if idx.dtype != torch.int32:
            raise RuntimeError("expected scalar type Int but found Long")
        seen.append(idx.dtype)
        return features[idx.long()]

    label = types.SimpleNamespace(interpolate=interpolate)
    base = [[torch.randn(4), torch.tensor([0, 3, 1])]]
    case = {"id": "generated_0", "base": 0, "dtype": None, "edge": None}
    scope["_kernel_time_us"](label, base, case, reps=2)  # (no CUDA events: no time on the CPU)
    assert seen and set(seen) == {torch.int32}


def test_cases_the_reference_ends_the_process_on_name_the_outcome():
    """pyg-lib's CPU scatter faulted on the recorded calls its op's dispatcher broadcasts before
    the backend: those cases are left out (the isolating run names them) and, where too few are
    left, the outcome says the reference took them in another form, not that the kernel crashed."""
    from testgen.standalone.runner import _mostly_left_out, outside_cases

    note = (
        "invalid: outside the op's contract: the repository's reference ended the process on "
        "this input (run killed by SIGSEGV)"
    )
    cases = [{"id": f"recorded_{i}", "ok": None, "note": note} for i in range(3)]
    cases.append({"id": "recorded_3", "ok": True, "note": ""})
    res = {"outcome": "weak_test", "cases": cases}
    assert _mostly_left_out(res)
    assert res["outcome"] == "reference_disagrees"
    assert res["detail"].startswith("the repository's reference ends the process on 3 of the 4")
    assert set(outside_cases(cases)) == {"recorded_0", "recorded_1", "recorded_2"}


def test_extensions_load_with_the_systems_cxx_runtime_preloaded(monkeypatch):
    """On the H100 box an extension took its C++ runtime from torch's own libraries and any
    TORCH_CHECK that fired in it ended the process (SIGSEGV); with libstdc++ preloaded it raised
    RuntimeError. Tests and batch builds get it in their environment where torch imports with
    it; a user's own LD_PRELOAD, or KMINER_PRELOAD_CXX_RUNTIME=0, leaves it out."""
    import subprocess
    import sys

    from miner import toolchain

    toolchain.preloaded_cxx_runtime.cache_clear()
    env = toolchain.extension_env()
    assert env["LD_PRELOAD"].startswith("libstdc++.so")
    probe = "import torch; print(open('/proc/self/maps').read())"
    done = subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0 and "libstdc++.so" in done.stdout
    for var, value in (("KMINER_PRELOAD_CXX_RUNTIME", "0"), ("LD_PRELOAD", "libmine.so")):
        with monkeypatch.context() as m:
            m.setenv(var, value)
            toolchain.preloaded_cxx_runtime.cache_clear()
            assert "LD_PRELOAD" not in toolchain.extension_env()
    toolchain.preloaded_cxx_runtime.cache_clear()
