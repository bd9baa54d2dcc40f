"""Inputs mined from a repository's own tests, recorded in the sandbox."""

import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import slow_package, write_tree

from miner import sandbox
from testgen.inputs import RecordedCall, record_file, record_repo_calls, repo_test_files

FIXTURE = Path(__file__).parent / "fixtures" / "recrepo"


def test_recorder_captures_extension_calls_with_stubs_for_missing_imports(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo)
    os.environ["KMINER_TEST_SECRET"] = "sk-do-not-leak"
    try:
        monkeypatch.chdir(tmp_path)  # relative paths, as a CLI user gives them
        calls = record_repo_calls(Path("repo"), Path("cache"))
    finally:
        del os.environ["KMINER_TEST_SECRET"]
    scale = calls["scale_forward"]
    # both parametrized shapes, and the second call of each test: assertions were disarmed
    assert [tuple(c.args[0].shape) for c in scale] == [(3,), (3,), (2, 5), (2, 5)]
    assert [c.kwargs["factor"] for c in scale] == [2.0, -1.0, 2.0, -1.0]
    assert scale[2].args[0].flatten().tolist() == [float(i) for i in range(10)]
    assert scale[0].test_file == "tests/test_scale.py"
    # the secret of this process never reached the repository's code
    counted = [c.args[0].tolist() for c in calls["count_positive"]]
    assert counted == [[1.0, -1.0, 2.0], [0.0]]
    assert scale[0].bind(["x", "out", "factor"])["factor"] == 2.0
    assert scale[0].bind(["x", "out"]) is None


def test_recording_is_cached_per_test_file(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo)
    cache = tmp_path / "cache"
    record_repo_calls(repo, cache)
    stamps = {p: p.stat().st_mtime_ns for p in cache.iterdir()}
    again = record_repo_calls(repo, cache, wanted={"scale_forward"})
    assert {p: p.stat().st_mtime_ns for p in cache.iterdir()} == stamps
    assert len(again["scale_forward"]) == 4
    assert repo_test_files(repo) == [repo / "tests" / "test_scale.py"]


def test_a_recording_that_crashed_is_not_cached(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    test_file = repo / "tests" / "test_dies.py"
    test_file.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    cache = tmp_path / "cache"
    assert record_file(repo, test_file, cache) == ([], [], {})
    assert list(cache.iterdir()) == []  # nothing remembered: the next run records it again
    test_file.write_text("def test_nothing():\n    pass\n")
    assert record_file(repo, test_file, cache) == ([], [], {})
    assert [p.suffix for p in cache.iterdir()] == [".pt"]  # a file with no calls is cached


def test_sandbox_kills_a_hang_and_reports_a_crash(tmp_path):
    import sys

    hang = sandbox.run([sys.executable, "-c", "import time; time.sleep(60)"], sandbox.Limits(1))
    assert hang.timed_out and hang.returncode is None and hang.seconds < 30
    crash = sandbox.run(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
        sandbox.Limits(30),
    )
    assert crash.returncode == -11 and not crash.timed_out
    where = sandbox.run([sys.executable, "-c", "import os; print(os.getcwd())"], sandbox.Limits(30))
    assert "kminer-run-" in where.stdout and where.stdout.strip().endswith("/home")


def test_bind_rejects_calls_that_do_not_fit():
    call = RecordedCall("f", [1, 2], {"c": 3})
    assert call.bind(["a", "b", "c"]) == {"a": 1, "b": 2, "c": 3}
    assert call.bind(["a", "b"]) is None
    assert call.bind(["a", "c", "b"]) is None  # c given twice


GPU_FIXTURE = Path(__file__).parent / "fixtures" / "recordrepo"


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory):
    """The fixture repository that needs a GPU, data files and custom operators, recorded once:
    (repo, cache, calls)."""
    tmp = tmp_path_factory.mktemp("recordrepo")
    repo = tmp / "repo"
    shutil.copytree(GPU_FIXTURE, repo)
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    calls = record_repo_calls(repo, tmp / "cache")
    assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == before  # nothing written
    return repo, tmp / "cache", calls


@pytest.fixture
def gpu_repo_calls(gpu_repo):
    return gpu_repo[2]


def _values(call: RecordedCall) -> list:
    return [a.tolist() if hasattr(a, "tolist") else a for a in call.args]


def test_recorded_test_reads_data_files_by_repository_relative_paths(gpu_repo_calls):
    (call,) = gpu_repo_calls["table_forward"]
    assert call.test_file == "tests/test_data.py"
    assert _values(call) == [[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]]


def test_cuda_only_tests_record_with_cpu_tensors(gpu_repo_calls):
    calls = gpu_repo_calls["gpu_only_forward"]
    # the wrapper took its CUDA path (x.is_cuda, x.device.type == "cuda", x.get_device() == 0);
    # the cases on "cuda", "cuda:0" and torch.device("cuda") made the same calls: kept once;
    # the CPU tensor took the PyTorch path: no call
    shapes = {(tuple(c.args[0].shape), c.args[0].dtype) for c in calls}
    assert shapes == {
        ((2, 3), torch.float32),
        ((4,), torch.float64),
        ((1, 2), torch.float32),
        ((3, 2), torch.float64),  # `Variable(torch.cuda.DoubleTensor(3, 2))`, torch 0.3's way
    }
    for call in calls:
        x, out, index = call.args
        assert x.device.type == out.device.type == "cpu" and out.shape == x.shape
        assert index == 0
    values = {tuple(map(tuple, c.args[0].tolist())) for c in calls if c.args[0].dim() == 2}
    assert ((0.0, 1.0, 2.0), (3.0, 4.0, 5.0)) in values
    assert [1.0] * 4 in [c.args[0].tolist() for c in calls]


def test_torch_ops_of_the_repository_record(gpu_repo_calls):
    calls = gpu_repo_calls["segment_sum"]  # torch.ops.gpuops.segment_sum(src, indptr, None)
    assert [_values(c) for c in calls] == [
        [[1.0, 2.0, 3.0, 4.0], [0, 1, 4], None],
        [[[1.0, 2.0], [3.0, 4.0]], [0, 2], None],
    ]
    assert calls[0].args[1].dtype == torch.int64
    assert calls[0].test_file == "tests/test_ops.py"
    # an operator its C++ registers under a namespace that is no package of the repository
    (maxed,) = gpu_repo_calls["segment_max"]  # torch.ops.segops.segment_max(src, indptr)
    assert _values(maxed) == [[1.0, 2.0, 3.0, 4.0], [0, 1, 4]]


def test_unknown_torch_backends_and_guarded_imports_do_not_stop_a_file(gpu_repo_calls):
    checked = {c.test_file: _values(c) for c in gpu_repo_calls["checked_forward"]}
    # test_backends.py sets torch.backends.cnnl.allow_tf32 at import; test_ops.py falls back
    # from a missing package to torch's gradcheck; the call inside pytest.raises is not kept
    assert checked == {"tests/test_backends.py": [[7.0, 7.0]], "tests/test_ops.py": [[1.0] * 3]}


def test_wanted_functions_select_tests_through_their_wrappers(gpu_repo):
    repo, cache, _ = gpu_repo  # recorded already: from the cache
    # test_cuda.py never says gpu_only_forward, only on_gpu: the wrapper that calls it
    calls = record_repo_calls(repo, cache, wanted={"gpu_only_forward"})
    assert {c.test_file for c in calls["gpu_only_forward"]} == {"tests/test_cuda.py"}


def test_an_extension_named_like_its_source_folder_records(gpu_repo_calls):
    """setup.py builds `extension_type("gpuops.backend", ...)` from the C++ folder
    gpuops/backend/: importing it gives the recorder, not that folder as a namespace package."""
    (call,) = gpu_repo_calls["to_dense_forward"]
    assert _values(call) == [[[0, 1], [1, 0]], [[2.0], [3.0]]]


def test_test_functions_that_only_the_main_block_can_call_run_as_a_script(gpu_repo_calls):
    """`def test_scaled(kind, device="cuda")` and `for kind in ...: test_scaled(kind)` under
    `__main__`: pytest runs nothing (no fixture `kind`), so the file runs as a script."""
    calls = gpu_repo_calls["scaled_forward"]
    assert [(c.args[0].dtype, c.args[1]) for c in calls] == [
        (torch.float32, 3.0),
        (torch.float64, 3.0),
    ]
    assert {c.test_file for c in calls} == {"tests/group_tests.py"}


def test_a_recorded_tensor_keeps_its_memory_layout(gpu_repo_calls):
    """The same values channel-first and channel-last (a kernel chosen by `x.stride(1) == 1`)
    are two calls, each with its layout; the sliced channel-last view is kept dense."""
    strides = sorted(c.args[0].stride() for c in gpu_repo_calls["layout_forward"])
    assert strides == [(12, 1, 3), (12, 4, 1)]
    assert all(
        c.args[0].tolist() == gpu_repo_calls["layout_forward"][0].args[0].tolist()
        for c in gpu_repo_calls["layout_forward"]
    )


def test_a_test_folder_named_like_a_missing_package_does_not_shadow_its_stub(gpu_repo_calls):
    """mamba's tests/ops/triton/ is on sys.path while its tests run: `import triton` found
    that folder (no `__version__`) and every test file failed at collection. The stub answers
    instead, and module-level code that orders a stub's attributes goes on."""
    (call,) = gpu_repo_calls["tuned_forward"]
    assert call.test_file == "tests/kernels/test_tuned.py" and _values(call) == [[0, 1, 2, 3]]


def test_a_test_past_its_share_is_cut_and_its_calls_kept():
    """A test looping 10000 times over an op (a race-condition check) must not eat the file's
    recording time: it is interrupted, with an exception its own `except Exception` cannot
    swallow."""
    import contextlib
    import time

    from testgen.standalone import recorder

    started = time.monotonic()
    with pytest.raises(recorder._OutOfTime):
        recorder._cut_after(0.2)
        while True:
            with contextlib.suppress(Exception):  # a test's own guard does not stop the cut
                time.sleep(0.01)
    recorder._cut_after(0)
    assert time.monotonic() - started < 5


def test_a_cut_waits_for_the_import_it_comes_in(tmp_path, monkeypatch):
    """A test file cut off while a package imports its submodules would leave that package
    half made for every file recorded after it in the process (sympy without `printing`,
    imported by torch on a first backward): the cut comes once the import is done."""
    import importlib
    import sys

    from testgen.standalone import recorder

    slow_package(tmp_path, "slowrec_kminer", 0.6)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(recorder._OutOfTime):
        recorder._cut_after(0.2)
        importlib.import_module("slowrec_kminer")
        while True:
            pass
    recorder._cut_after(0)
    assert sys.modules["slowrec_kminer"].second.VALUE == 7


def test_the_save_budget_is_shared_by_every_function(monkeypatch):
    """Many small forward calls must not crowd out an op's only large calls and its reference's
    calls: the budget is taken in rounds, the k-th smallest call of each function in turn."""
    from testgen.standalone import record_log

    small = [("fwd", [torch.zeros(10)], {}) for _ in range(50)]  # 40 bytes each
    large = [("update", [torch.zeros(200)], {}) for _ in range(2)]  # 800 bytes each
    calls = small + large
    ref = ("ops.py", "update_ref", [torch.zeros(200)], {}, [torch.zeros(200)], [50], [])
    monkeypatch.setattr(record_log, "SAVE_BUDGET", 4000)
    kept, refs = record_log._within_budget(calls, [ref])
    functions = [c[0] for c in kept]
    assert functions.count("update") >= 1 and functions.count("fwd") >= 10
    # the reference is kept with its partner, renumbered to its place among the kept calls
    assert len(refs) == 1 and kept[refs[0][5][0]][0] == "update"
    assert sum(record_log._bytes(c) for c in kept) + record_log._bytes(refs[0][:5]) <= 4000


def test_examples_give_the_calls_no_test_makes(gpu_repo, tmp_path):
    """A repository's example scripts are the second source: they run statement by statement
    (a failing one does not stop the rest), with the package's plain values and its compiled
    submodule answering as attributes, for the ops its tests never call."""
    from testgen.inputs import repo_example_files

    repo = gpu_repo[0]
    assert [p.relative_to(repo).as_posix() for p in repo_example_files(repo)] == [
        "examples/demo.py"
    ]
    calls = record_repo_calls(repo, tmp_path / "cache", {"only_in_example", "segment_sum"})
    (call,) = calls["only_in_example"]
    assert call.test_file == "examples/demo.py"
    assert call.args[0].shape == (2, 3) and call.args[1] == 2
    # an op the tests call is not recorded again from the examples
    assert all(c.test_file.startswith("tests/") for c in calls.get("segment_sum", []))


def test_what_a_package_init_imports_is_imported_for_its_side_effects(tmp_path):
    """pytorch_sparse's `__init__` imports `diag.py`, which ends with
    `SparseTensor.set_diag = ...`: the recorder never runs `__init__`, so a test calling
    `mat.set_diag(...)` failed before any extension call. The submodules `__init__` imports
    are imported before the tests run, and the call is recorded."""
    repo = write_tree(
        tmp_path / "repo",
        {
            "boxlib/__init__.py": "import framework_that_is_not_installed  # noqa\n"
            "from .core import Box  # noqa\nfrom .scaling import scale_box  # noqa\n",
            "boxlib/core.py": "class Box:\n    def __init__(self, x):\n        self.x = x\n",
            "boxlib/scaling.py": "from boxlib import _ext\nfrom boxlib.core import Box\n\n\n"
            "def scale_box(self, factor):\n    return _ext.scale_forward(self.x, factor)\n\n\n"
            "Box.scale = scale_box\n",
            "tests/test_box.py": "import torch\nfrom boxlib.core import Box\n\n\n"
            "def test_scale():\n    Box(torch.ones(3)).scale(2.0)\n",
        },
    )
    calls = record_repo_calls(repo, tmp_path / "cache")
    assert [(c.args[0].tolist(), c.args[1]) for c in calls["scale_forward"]] == [([1.0] * 3, 2.0)]


def test_the_calls_a_package_init_makes_run_before_the_tests(tmp_path):
    """torchsparse's `__init__` runs `backends.init()`, which sets the globals its convolution
    reads (`backends.hash_rsv_ratio`); the recorder never runs `__init__`, so every test of
    the convolution failed on a missing attribute before reaching the extension. The top-level
    calls of `__init__` now run (names resolved through the package), and the call is
    recorded with the value `init()` set."""
    repo = write_tree(
        tmp_path / "repo",
        {
            "sparselib/__init__.py": "import sparselib.backends as backends\n"
            "from .ops import reserve  # noqa\n\nbackends.init()\n",
            "sparselib/backends.py": "import torch\n\n\ndef init():\n    global ratio\n"
            "    capability = torch.cuda.get_device_capability()\n"
            "    ratio = 2 if capability[0] >= 8 else 1\n",
            "sparselib/ops.py": "import sparselib\nimport sparselib.backend\n\n\n"
            "def reserve(coords):\n"
            "    size = int(sparselib.backends.ratio * coords.shape[0])\n"
            "    return sparselib.backend.reserve_forward(coords, size)\n",
            "tests/test_reserve.py": "import torch\nfrom sparselib import reserve\n\n\n"
            "def test_reserve():\n"
            "    reserve(torch.zeros(5, 4, dtype=torch.int32, device='cuda'))\n",
        },
    )
    calls = record_repo_calls(repo, tmp_path / "cache")
    assert [c.args[1] for c in calls["reserve_forward"]] == [10]


def test_an_op_a_package_init_defines_itself_records(tmp_path):
    """A small package defines its ops in `__init__` itself; the recorder never runs
    `__init__`, so `from boxlib import inside` gave a stub and nothing was recorded. The
    imports and definitions of `__init__` now run, each on its own, when such a name is first
    asked for (a framework import that fails is left out)."""
    repo = write_tree(
        tmp_path / "repo",
        {
            "boxlib/__init__.py": "import framework_that_is_not_installed  # noqa\n"
            "import torch\nimport box_ext as ext\n\nSCALE = 2\n\n\n"
            "def inside(points, boxes):\n"
            "    out = points.new_zeros(points.shape[0], dtype=torch.int)\n"
            "    ext.inside_forward(boxes, points * SCALE, out)\n    return out\n",
            "setup.py": "from torch.utils.cpp_extension import CUDAExtension\n"
            "CUDAExtension(name='box_ext', sources=['box.cu'])\n",
            "tests/test_inside.py": "import torch\nfrom boxlib import inside\n\n\n"
            "def test_inside():\n    inside(torch.ones(3, 2).cuda(), torch.zeros(1, 4).cuda())\n",
        },
    )
    calls = record_repo_calls(repo, tmp_path / "cache")
    (call,) = calls["inside_forward"]
    assert call.args[1].tolist() == [[2.0, 2.0]] * 3 and call.args[2].dtype == torch.int32


def test_a_check_script_beside_a_package_in_a_source_folder_records(tmp_path):
    """Pytorch-Correlation-extension keeps its package in `Correlation_Module/` (setup.py's
    `package_dir`), binds a top-level extension, and has no tests: only a top-level `check.py`
    whose parser requires `direction` in {forward, backward}. The package is found in its
    folder, the script counts as an example by its name, and its command line is the
    positional argument's choices: both directions run and record."""
    from testgen.inputs import repo_example_files

    repo = write_tree(
        tmp_path / "repo",
        {
            "setup.py": "from setuptools import setup\nfrom torch.utils.cpp_extension import "
            "CppExtension\nsetup(name='corr', ext_modules=[CppExtension('corr_backend', "
            "['Module/corr.cpp'])], package_dir={'': 'Module'}, packages=['corrlib'])\n",
            "Module/corr.cpp": "// the op\n",
            "Module/corrlib/__init__.py": "from .ops import correlate  # noqa\n",
            "Module/corrlib/ops.py": "import corr_backend\n\n\ndef correlate(a, b, back=False):\n"
            "    if back:\n        return corr_backend.backward(a, b)\n"
            "    return corr_backend.forward(a, b)\n",
            "check.py": "import argparse\nimport torch\nfrom corrlib import correlate\n\n"
            "parser = argparse.ArgumentParser()\n"
            "parser.add_argument('direction', choices=['forward', 'backward'], nargs='+')\n"
            "parser.add_argument('-c', '--channels', type=int, default=3)\n\n\n"
            "def main():\n    args = parser.parse_args()\n"
            "    x = torch.ones(1, args.channels, 4, 4)\n"
            "    for d in args.direction:\n        correlate(x, x, back=d == 'backward')\n\n\n"
            "if __name__ == '__main__':\n    main()\n",
            "tools/helpers.py": "X = 1\n",
        },
    )
    assert [p.name for p in repo_example_files(repo)] == ["check.py"]
    calls = record_repo_calls(repo, tmp_path / "cache", {"forward", "backward"})
    assert [c.args[0].shape for c in calls["forward"]] == [(1, 3, 4, 4)]
    assert [c.test_file for c in calls["backward"]] == ["check.py"]


OBJECT_REPO = {
    "objpkg/__init__.py": "",
    "objpkg/table.py": "from . import _ext\n\n\n"
    "class Table:\n    def __init__(self):\n        self.t = _ext.Table()\n\n"
    "    def add(self, keys):\n        self.t.insert(keys)\n\n\n"
    "def lookup(table, queries):\n    return _ext.lookup(table.t, queries)\n\n\n"
    "def from_keys(keys):\n    table, n = _ext.make_table(keys)\n    return table\n",
    "tests/test_table.py": "import torch\nfrom objpkg.table import Table, from_keys, lookup\n"
    "from objpkg import _ext\n\n\n"
    "def test_lookup():\n    t = Table()\n    t.add(torch.tensor([3, 5]))\n"
    "    lookup(t, torch.tensor([5, 9]))\n    t.add(torch.tensor([9]))\n"
    "    lookup(t, torch.tensor([5, 9]))\n"
    "    other = Table()\n    other.add(torch.tensor([1]))\n\n\n"
    "def test_made_by_a_function():\n    _ext.only_on_cuda(torch.tensor([1.0]))\n"
    "    made = from_keys(torch.tensor([4]))\n"
    "    _ext.lookup(made, torch.tensor([4, 6]))\n",
}
# the extension as the CPU build would run it: a module of the same name, with a class
OBJECT_EXT = (
    "import torch\n\n\nclass Table:\n    def __init__(self):\n        self.keys = []\n\n"
    "    def insert(self, keys):\n        self.keys += keys.tolist()\n\n\n"
    "def lookup(table, queries):\n"
    "    return torch.tensor([q in table.keys for q in queries.tolist()])\n\n\n"
    "def make_table(keys):\n    t = Table()\n    t.insert(keys)\n    return t, len(t.keys)\n"
)


def test_an_object_an_op_takes_is_recorded_as_the_steps_that_made_it(tmp_path):
    """SparseConvNet's ops take a `Metadata_2` that earlier calls filled; MinkowskiEngine's a
    coordinate manager filled by its methods. The call keeps the steps that remake the object
    as it was then: its making, and every earlier call or method call that took it."""
    repo = write_tree(tmp_path / "repo", OBJECT_REPO)
    (tmp_path / "ext.py").write_text(OBJECT_EXT)
    built = {"objpkg._ext": tmp_path / "ext.py"}
    calls = record_repo_calls(repo, tmp_path / "cache", built=built)
    first, second, made = calls["lookup"]
    assert first.args[0] == "<object Table>" and first.args[1].tolist() == [5, 9]
    assert first.objects == {0: {"kminer_object": "Table", "made_by": 0, "path": []}}
    assert [(name, len(args)) for name, args, _ in first.setup] == [
        ("Table", 0),
        ("Table.insert", 2),
    ]
    assert first.setup[1][1][1].tolist() == [3, 5]
    # the second lookup sees the table after one more insert; the other table is not its setup
    assert [name for name, _, _ in second.setup] == [
        "Table",
        "Table.insert",
        "lookup",
        "Table.insert",
    ]
    assert second.setup[3][1][1].tolist() == [9]
    marker = second.setup[1][1][0]
    assert marker["kminer_object"] == "Table" and second.setup[marker["made_by"]][0] == "Table"
    # an object a function returned inside a tuple: its step, and where in the result it is
    assert made.objects[0]["path"] == [0]
    assert [name for name, _, _ in made.setup] == ["make_table"]
    assert made.setup[0][1][0].tolist() == [4]
    # a function the CPU build lacks is recorded, returns None, and the test goes on
    assert [c.args[0].tolist() for c in calls["only_on_cuda"]] == [[1.0]]


def test_a_call_too_large_to_record_is_counted_and_named_in_the_reason(tmp_path):
    """A test at production size (Swin's window ops on 192 x 56 x 56 x 96) makes calls the
    recorder does not keep; the op then has no calls, and its reason must say why instead of
    claiming that nothing calls it."""
    from testgen.generate import _too_big
    from testgen.standalone.record_log import MAX_ELEMENTS

    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo)
    side = 2100  # a square: its rows cannot be cut either (record_rows)
    big = side * side
    assert big > MAX_ELEMENTS
    (repo / "tests" / "test_big.py").write_text(
        "import torch\nfrom toyops.ops import scale\n\n\n"
        f"def test_big():\n    scale(torch.ones({side}, {side}), 3.0)\n"
        "    scale(torch.ones(4), 5.0)\n"
    )
    calls = record_repo_calls(repo, tmp_path / "cache")
    assert calls.too_big == {"scale_forward": big}
    kept = [c.kwargs.get("factor") for c in calls["scale_forward"]]
    assert 5.0 in kept and 3.0 not in kept  # the small call of the same test is kept
    view = calls.for_source("toyops/scale.cu", ["toyops/scale.cu"], set())
    assert view.too_big == calls.too_big
    why = _too_big(calls, ["scale_forward"], [])
    assert why.startswith("the repository's tests call it only with tensors too large to record")
    assert f"{big / 1e6:.1f} M elements" in why
    assert _too_big(calls, ["scale_forward"], calls["scale_forward"]) == ""  # some were kept
    assert _too_big(calls, ["count_positive"], []) == ""
