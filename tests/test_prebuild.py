"""Batched builds of a bundle's sources (testgen/prebuild.py).

Fast tests drive the batching with a stand-in compiler that fails the way nvcc does (an error
line naming a member's `#line` file, or an error nobody can be blamed for); the `slow` test
builds real CPU extensions through run.py and checks that the tests import what was batched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from test_testgen import affine_recorded, candidate, write_label

from testgen.standalone import prebuild

LABEL = """#include <torch/extension.h>
// kminer-label-body-begin
%s
void kminer_bind(pybind11::module_& m) { m.def("f", &f); }
// kminer-label-body-end
#ifndef KMINER_BATCH
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { kminer_bind(m); }
#endif
"""


class FakeCompiler:
    """Fails a batch that holds a member whose text says BROKEN (blamed by its #line file) or
    HIDDEN (an error in no member's file); records every batch it was asked for."""

    def __init__(self):
        self.batches: list[list[str]] = []
        self.threads: list[int] = []

    def __call__(self, members, suffix, folder, timeout, threads=1):
        self.batches.append([cid for cid, _ in members])
        self.threads.append(threads)
        folder.mkdir(parents=True, exist_ok=True)
        errors = []
        for cid, text in members:
            if b"BROKEN" in text:
                errors.append(f'kminer_{cid}.cu(3): error: identifier "BROKEN" is undefined')
            if b"HIDDEN" in text:
                errors.append("/usr/bin/ld: undefined reference to `hidden'")
        if not errors:
            (folder / f"{folder.name}.so").write_bytes(b"")
        log = "\n".join(errors) + ("\nerror: ld returned 1" if errors else "")
        return prebuild.Built(not errors, log, 2.0 * len(members)), {}


def sources(tmp_path: Path, bodies: dict[str, str]) -> list[Path]:
    paths = []
    for name, body in bodies.items():
        path = tmp_path / name
        path.write_text(LABEL % body if body is not None else "int main() {}\n")
        paths.append(path)
    return paths


def test_batches_write_a_record_per_source_and_reuse_them(tmp_path):
    files = sources(tmp_path, {f"l{i}.cu": f"int f() {{ return {i}; }}" for i in range(5)})
    files += sources(tmp_path, {"r.cpp": "int f() { return 9; }"})
    fake = FakeCompiler()
    state = prebuild.prebuild(files, tmp_path / "store", jobs=2, timeout=60, compile_fn=fake)
    assert set(state.values()) == {"built"} and len(state) == 6
    # .cu and .cpp never share a batch; 5 .cu over 2 jobs: batches of 3 and 2
    assert sorted(len(b) for b in fake.batches) == [1, 2, 3]
    rec = prebuild.prebuilt_module(tmp_path / "store", files[0])
    assert rec["sub"] == f"c_d{prebuild.digest(files[0].read_bytes())}"
    assert (tmp_path / "store" / rec["so"]).is_file() and not Path(rec["so"]).is_absolute()
    assert rec["seconds"] == 2.0
    again = FakeCompiler()
    assert set(prebuild.prebuild(files, tmp_path / "store", 2, 60, compile_fn=again).values()) == {
        "cached"
    }
    assert again.batches == []  # every source already has its record


def test_heavy_sources_get_a_batch_each_built_first(tmp_path):
    files = sources(tmp_path, {f"l{i}.cu": f"int f() {{ return {i}; }}" for i in range(6)})
    heavy = set(files[4:])
    fake = FakeCompiler()
    state = prebuild.prebuild(files, tmp_path / "store", 1, 60, compile_fn=fake, heavy=heavy)
    assert set(state.values()) == {"built"}
    keys = [f"d{prebuild.digest(f.read_bytes())}" for f in files]
    # one worker runs them in order: each heavy source alone, then the light ones together
    assert fake.batches == [[keys[4]], [keys[5]], sorted(keys[:4])]
    assert fake.threads == [1, 1, 1]  # one job: no core to share out
    fake = FakeCompiler()
    prebuild.prebuild(files, tmp_path / "store8", 8, 60, compile_fn=fake, heavy=heavy)
    # eight jobs: each heavy build's nvcc optimizes on four threads, the light batches on one
    heavy_keys = {keys[4], keys[5]}
    assert sorted(
        t for t, b in zip(fake.threads, fake.batches, strict=True) if b[0] in heavy_keys
    ) == [4, 4]
    assert {
        t for t, b in zip(fake.threads, fake.batches, strict=True) if b[0] not in heavy_keys
    } == {1}


def test_blamed_member_leaves_the_batch_and_the_rest_is_rebuilt(tmp_path):
    files = sources(
        tmp_path,
        {"a.cu": "int f() { return 1; }", "b.cu": "int f() { BROKEN; }", "c.cu": "int f();"},
    )
    fake = FakeCompiler()
    state = prebuild.prebuild(files, tmp_path / "store", jobs=1, timeout=60, compile_fn=fake)
    keys = [prebuild.digest(f.read_bytes()) for f in files]
    assert [state[k] for k in keys] == ["built", "alone", "built"]
    assert len(fake.batches) == 2 and len(fake.batches[1]) == 2
    assert prebuild.prebuilt_module(tmp_path / "store", files[1]) is None


def test_unblamed_failure_splits_the_batch(tmp_path):
    bodies = {f"{n}.cu": f"int f() {{ return {i}; }}" for i, n in enumerate("abcd")}
    bodies["d.cu"] = "int f() { HIDDEN; }"
    files = sources(tmp_path, bodies)
    fake = FakeCompiler()
    state = prebuild.prebuild(files, tmp_path / "store", jobs=1, timeout=60, compile_fn=fake)
    keys = [prebuild.digest(f.read_bytes()) for f in files]
    assert [state[k] for k in keys] == ["built", "built", "built", "alone"]
    assert [len(b) for b in fake.batches] == [4, 2, 2, 1, 1]


def test_sources_without_body_markers_are_built_alone(tmp_path):
    files = sources(tmp_path, {"plain.cu": None, "ok.cu": "int f() { return 1; }"})
    fake = FakeCompiler()
    state = prebuild.prebuild(files, tmp_path / "store", jobs=1, timeout=60, compile_fn=fake)
    assert state[prebuild.digest(files[0].read_bytes())] == "alone"
    assert fake.batches == [[f"d{prebuild.digest(files[1].read_bytes())}"]]


def test_timed_out_batch_gives_no_record_and_is_not_split(tmp_path):
    files = sources(tmp_path, {f"{n}.cu": f"int f() {{ return {i}; }}" for i, n in enumerate("ab")})
    calls = []

    def slow(members, suffix, folder, timeout):
        calls.append(len(members))
        return prebuild.Built(False, f"batch build timed out after {timeout:g}s", timeout), {}

    state = prebuild.prebuild(files, tmp_path / "store", jobs=1, timeout=5, compile_fn=slow)
    assert set(state.values()) == {"alone"} and calls == [2]


CPU_LABEL = """// a CPU stand-in of a label, in kminer's label layout
#include <torch/extension.h>
// kminer-label-body-begin
void AffineForwardCUDAKernelLauncher(at::Tensor out, const at::Tensor in, const float b,
                                     const float a, const int n) {
  AT_DISPATCH_FLOATING_TYPES(in.scalar_type(), "affine", [&] {
    auto* o = out.data_ptr<scalar_t>();
    auto* i = in.data_ptr<scalar_t>();
    for (int k = 0; k < n; ++k) o[k] = a * i[k] + b%s;
  });
}
void kminer_bind(pybind11::module_& m) {
  m.def("AffineForwardCUDAKernelLauncher", &AffineForwardCUDAKernelLauncher);
}
// kminer-label-body-end
#ifndef KMINER_BATCH
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { kminer_bind(m); }
#endif
"""


@pytest.mark.slow
def test_run_py_batches_builds_and_tests_import_them(refrepo, tmp_path):
    """A real bundle on CPU: label, a wrong variant, a variant that does not compile and the
    reference. The three that compile are built as batched extensions; the tests import them
    (no build of their own), the wrong variant is killed, the broken one is invalid."""
    from testgen.bundle import write_bundle
    from testgen.generate import generate_for

    work = tmp_path / "work"
    work.mkdir()
    cand = candidate(refrepo, "affine_forward_cuda_kernel")
    write_label(refrepo, cand, work)
    generate_for(cand, refrepo[3], affine_recorded(), work)
    (work / "labels" / "cpu.cpp").write_text(CPU_LABEL % "")
    (work / "variants").mkdir(exist_ok=True)
    (work / "variants" / "wrong.cpp").write_text(CPU_LABEL % " + (k == n - 1 ? 1e-3 : 0)")
    (work / "variants" / "broken.cpp").write_text(CPU_LABEL % " + undefined_name")
    cand.wrapper.label_path = "labels/cpu.cpp"
    cand.tests.variants = ["variants/wrong.cpp", "variants/broken.cpp"]
    cand.tests.variant_kinds = ["op_swap", "no_write"]
    info = write_bundle(work, [cand], tmp_path / "b.tar.gz")
    with tarfile.open(info.path) as tar:
        tar.extractall(tmp_path, filter="data")
    bundle = tmp_path / "b"
    proc = subprocess.run(
        [sys.executable, "run.py", "--out", "results.json", "--jobs", "2"],
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, "MAX_JOBS": "2"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "prebuilt 3 of 4 sources" in proc.stderr
    entry = json.loads((bundle / "results.json").read_text())["entries"][cand.id]
    assert entry["outcome"] == "pass", entry["log_tail"]
    assert [(v["kind"], v["outcome"]) for v in entry["variants"]] == [
        ("op_swap", "mismatch"),
        ("no_write", "invalid"),
    ]
    assert entry["kill_rate"] == 1.0 and len(entry["cases"]) == cand.tests.num_cases
    # the label's test built nothing of its own: only the broken variant has a build folder
    built = sorted(p.name for p in (bundle / ".build").glob("*/kminer_label_*"))
    assert len(built) == 1, built
    stores = list((bundle / ".build").glob("prebuilt-*"))
    assert len(stores) == 1 and len(list(stores[0].glob("*.json"))) == 3


def test_a_heavy_entry_has_all_its_variants_prebuilt_each_alone(tmp_path, monkeypatch):
    """causal-conv1d's backward label takes minutes of nvcc: the alternates its test would
    build one after another (when the first of a kind survives) are built up front, side by
    side; a light entry's alternates still wait for their test, and so do those of a label so
    heavy that all its variants side by side would outlast the call."""
    import argparse

    from testgen.standalone import runner

    asked = {}

    def fake(files, store, jobs, timeout, compile_fn=None, heavy=frozenset()):
        asked.update(files=[f.name for f in files], heavy=sorted(f.name for f in heavy))
        return {}

    monkeypatch.setattr(prebuild, "prebuild", fake)
    entries = []
    for cid, seconds in (("slow", 132.4), ("quick", 8.7), ("slowest", 365.2)):
        (tmp_path / f"{cid}.py").write_text("KMINER_PREBUILT\n")
        names = [f"{cid}.cu", f"{cid}_ref.cpp"] + [f"{cid}.{n}.cu" for n in range(3)]
        for name in names:
            (tmp_path / name).write_text("//\n")
        variants = [{"kind": k, "path": f"{cid}.{n}.cu"} for n, k in enumerate("aab")]
        entry = {"id": cid, "test": f"{cid}.py", "label": f"{cid}.cu", "variants": variants}
        entries.append(entry | {"reference": f"{cid}_ref.cpp", "build_s": seconds})
    args = argparse.Namespace(jobs=4, gpu_jobs=1, rebuild=False, build_timeout=60.0)
    runner.Runner(tmp_path, args, [None]).prebuild(entries)
    # mamba's selective_scan_bwd (365 s): all its variants side by side outlast a device call,
    # so only the first of each kind is built up front, still each alone
    assert asked["heavy"] == [
        "slow.0.cu", "slow.1.cu", "slow.2.cu", "slow.cu", "slowest.0.cu", "slowest.2.cu",
        "slowest.cu",
    ]  # fmt: skip
    assert "slow.1.cu" in asked["files"] and "quick.1.cu" not in asked["files"]
    assert "slowest.1.cu" not in asked["files"]
    assert {"quick.cu", "quick.0.cu", "quick.2.cu", "quick_ref.cpp"} <= set(asked["files"])
