"""The repository's extension built for the CPU runs behind the recorder: a test that feeds one
call's result into the next (a forward's `count` into its backward, through autograd) records
both calls."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from miner import toolchain
from testgen.cpu_twin import Extension, _flags, capture, cpu_extensions
from testgen.inputs import record_repo_calls

FIXTURE = Path(__file__).parent / "fixtures" / "bwdrepo"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("twin")
    repo = root / "repo"
    shutil.copytree(FIXTURE, repo)
    return repo, cpu_extensions(repo, root / "cpu_twin", {"pool_forward"}), root


def test_setup_py_is_read_by_running_it():
    """The C++ sources of the extension as setup.py computes them (the .cu left out); a script
    that only describes its extension when CUDA is there is run with CUDA pretended."""
    (ext,) = capture(FIXTURE)
    assert ext.name == "pool_ext"
    assert ext.sources == ("src/pool.cpp", "src/cpu/pool_cpu.cpp")
    legacy = capture(FIXTURE.parent / "legacyrepo")
    assert [(e.name, e.sources) for e in legacy] == [
        ("_ext", ("src/vision.cpp", "src/cpu/scale_cpu.cpp"))
    ]
    described = {
        "name": "pkg._C",
        "sources": ["a.cpp", "b.cu"],
        "include_dirs": ["inc"],
        "define_macros": [["WITH_CUDA", None], ["N", "4"]],
        "undef_macros": ["NDEBUG"],
        "cxx_args": ["-O3", "-DAT_PARALLEL_OPENMP", "-fopenmp", "-march=native"],
    }
    ext = Extension.from_setup(described)
    assert ext.sources == ("a.cpp",)
    assert ext.defines == ("-DWITH_CUDA", "-DN=4", "-UNDEBUG")
    assert ext.cxx_args == ("-DAT_PARALLEL_OPENMP", "-fopenmp")
    # mmcv asks for C++14, which today's torch headers refuse: torch's standard wins
    old = Extension("pkg._C", ("a.cpp",), (), (), ("-std=c++14",))
    ours = f"-std={toolchain.cxx_standard()}"
    assert [a for a in _flags(FIXTURE, old) if a.startswith("-std=")] == [ours]
    newer = Extension("pkg._C", ("a.cpp",), (), (), ("-std=c++26",))
    assert [a for a in _flags(FIXTURE, newer) if a.startswith("-std=")] == [ours, "-std=c++26"]


@pytest.mark.slow
def test_the_cuda_launchers_the_module_lacks_are_stubs(built):
    _, modules, _ = built
    assert set(modules) == {"pool_ext"}
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(modules["pool_ext"])], capture_output=True, text=True
    ).stdout
    assert "pool_forward_cuda" in symbols and "pool_backward_cuda" in symbols  # the stubs
    assert "PyInit_pool_ext" in symbols


@pytest.mark.slow
def test_calls_fed_by_an_earlier_result_record_with_the_module_behind(built):
    repo, modules, root = built
    without = record_repo_calls(repo, root / "plain")
    assert "pool_backward" not in without  # the forward returned None: gradcheck stopped
    recorded = record_repo_calls(repo, root / "with", built=modules)
    forward, backward = recorded["pool_forward"], recorded["pool_backward"]
    assert [tuple(c.args[0].shape) for c in forward] == [(3, 8), (4, 10), (2, 33)]
    assert len(backward) == 3
    for fwd, bwd in zip(forward, backward, strict=True):
        grad_output, x, count, kernel = bwd.args
        assert torch.equal(x, fwd.args[0]) and kernel == fwd.args[1]
        out_w = fwd.args[0].shape[1] // kernel
        assert count.shape == grad_output.shape == (fwd.args[0].shape[0], out_w)
        assert torch.all(count == kernel)  # the CPU forward's real second output


@pytest.mark.slow
def test_a_script_finds_the_helper_beside_it_after_pytest_stubbed_it(built):
    """`from pool_helpers import rows` in a script of a package (lietorch/run_tests.py) whose
    test functions take a parameter pytest cannot fill: pytest's collection stubbed the helper
    (the package's parent is on its path, not the package); the script run that follows
    imports the real one from beside the script."""
    _, modules, root = built
    repo = root / "script-repo"
    shutil.copytree(FIXTURE, repo)
    (repo / "checks").mkdir()
    (repo / "checks" / "__init__.py").write_text("")
    (repo / "checks" / "pool_helpers.py").write_text(
        "import torch\n\ndef rows(n):\n    return torch.arange(n * 6.0).view(n, 6)\n"
    )
    (repo / "checks" / "pool_tests.py").write_text(
        "from pool_helpers import rows\nimport pool_ext\n\n"
        "def test_rows(n):\n    pool_ext.pool_forward(rows(n), 3)\n\n"
        "if __name__ == '__main__':\n    test_rows(5)\n"
    )
    recorded = record_repo_calls(repo, root / "script", built=modules)
    shapes = [tuple(c.args[0].shape) for c in recorded["pool_forward"]]
    assert (5, 6) in shapes


@pytest.mark.slow
def test_a_rerun_on_the_same_snapshot_neither_runs_setup_py_nor_compiles(built, monkeypatch):
    import testgen.cpu_twin as cpu_twin

    repo, modules, root = built

    def refuse(*args, **kwargs):
        raise AssertionError("setup.py run or a source compiled again")

    monkeypatch.setattr(cpu_twin, "capture", refuse)
    monkeypatch.setattr(cpu_twin, "build", refuse)
    assert cpu_extensions(repo, root / "cpu_twin", {"pool_forward"}) == modules


@pytest.mark.slow
def test_a_cuda_named_op_runs_its_cpu_twin_the_cpu_build_binds(tmp_path):
    """torchsparse: on CUDA tensors the package calls `hash_cuda`; its setup.py builds for the
    CPU only `hash_cpu` (same arguments). The CPU build is made for `double_cuda` too, and the
    recorder runs `double_cpu` in its place, so the next call gets a real result."""
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "setup.py").write_text(
        "from setuptools import setup\n"
        "from torch.utils.cpp_extension import CppExtension\n"
        "setup(name='mini', ext_modules=[CppExtension('mini_ext', ['mini.cpp'])])\n"
    )
    (repo / "mini.cpp").write_text(
        "#include <torch/extension.h>\n"
        "torch::Tensor double_cpu(torch::Tensor x) { return x * 2; }\n"
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("double_cpu", &double_cpu); }\n'
    )
    (repo / "tests" / "test_mini.py").write_text(
        "import torch\nimport mini_ext\n\n"
        "def test_twice():\n"
        "    y = mini_ext.double_cuda(torch.arange(4.0, device='cuda'))\n"
        "    mini_ext.double_cuda(y + 1)\n"
    )
    modules = cpu_extensions(repo, tmp_path / "cpu_twin", {"double_cuda"})
    assert set(modules) == {"mini_ext"}
    calls = record_repo_calls(repo, tmp_path / "recorded", built=modules)["double_cuda"]
    assert [c.args[0].tolist() for c in calls] == [[0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 5.0, 7.0]]


def test_what_setup_py_writes_into_the_repository_is_skipped(tmp_path):
    """detectron2's setup.py links its configs into its package before it calls `setup()`,
    PyTorch-Encoding's writes `encoding/version.py`; in the read-only sandbox that raised, and
    no extension was described (no CPU twin, no recorded backward). The refused writes are
    skipped and the description goes on."""
    from conftest import write_tree

    repo = write_tree(
        tmp_path / "repo",
        {
            "setup.py": "import os, shutil\nfrom setuptools import setup\n"
            "from torch.utils.cpp_extension import CppExtension\n"
            "here = os.path.dirname(os.path.realpath(__file__))\n"
            "os.makedirs(os.path.join(here, 'pkg', 'made'), exist_ok=True)\n"
            "os.symlink(os.path.join(here, 'configs'), os.path.join(here, 'pkg', 'configs'))\n"
            "with open(os.path.join(here, 'pkg', 'version.py'), 'w') as f:\n"
            "    f.write('__version__ = 1')\n"
            "shutil.copy(os.path.join(here, 'setup.py'), os.path.join(here, 'pkg', 'x.py'))\n"
            "setup(name='pkg', ext_modules=[CppExtension('pkg._C', ['pkg/op.cpp'])])\n",
            "pkg/__init__.py": "",
            "pkg/op.cpp": "// op\n",
            "configs/a.yaml": "a: 1\n",
        },
    )
    (ext,) = capture(repo)
    assert (ext.name, ext.sources) == ("pkg._C", ("pkg/op.cpp",))
    assert not (repo / "pkg" / "configs").exists() and not (repo / "pkg" / "made").exists()
    assert not (repo / "pkg" / "version.py").exists()


def test_a_module_setup_py_imports_and_this_machine_lacks_is_a_stub(tmp_path):
    """mmcv's setup.py imports `pkg_resources`, which today's setuptools no longer ships: the
    script stopped before it described its extension. A lacking module is a stub; one whose
    import has its own fallback still fails, so the fallback runs."""
    from conftest import write_tree

    repo = write_tree(
        tmp_path / "repo",
        {
            "setup.py": "from setuptools import setup\n"
            "from torch.utils.cpp_extension import CppExtension\n"
            "from kminer_absent_pkg import get_distribution\n"
            "version = get_distribution('mmcv')\n"
            "try:\n    import kminer_absent_other\n    flag = 'stub'\n"
            "except ImportError:\n    flag = 'fallback'\n"
            "setup(name='pkg', ext_modules=[CppExtension('pkg._C', ['pkg/op.cpp'],\n"
            "      define_macros=[('IMPORTED', flag)])])\n",
            "pkg/__init__.py": "",
            "pkg/op.cpp": "// op\n",
        },
    )
    (ext,) = capture(repo)
    assert (ext.name, ext.sources, ext.defines) == (
        "pkg._C",
        ("pkg/op.cpp",),
        ("-DIMPORTED=fallback",),
    )


def test_an_extension_over_the_budget_keeps_its_module_and_cpu_implementations(tmp_path):
    """A hundred sources in one extension (mmcv): kept are the one that defines the module,
    the CPU implementations of the ops at hand, each with the same-named source that
    dispatches to it; the rest (a CUDA-only op's glue, another op's CPU code) is cut."""
    from conftest import write_tree

    from testgen.cpu_twin import trimmed

    files = {
        "csrc/pybind.cpp": 'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("a", &a); }\n',
        "csrc/roi_pool.cpp": "void roi_pool_forward() {}\n",
        "csrc/cpu/roi_pool.cpp": "void roi_pool_forward_cpu() {}\n",
        "csrc/nms.cpp": "void nms() {}\n",
        "csrc/cpu/nms.cpp": "void nms_cpu() {}\n",
        "csrc/cuda_only.cpp": "void roi_pool_forward_launcher() {}\n",
        "csrc/knn_cpu.cpp": "void roi_pool_forward_helper() {}\n",
    }
    repo = write_tree(tmp_path / "repo", files)
    ext = Extension("pkg._ext", tuple(sorted(files)), (), (), ())
    kept = trimmed(repo, ext, {"roi_pool_forward"}, 5)
    assert kept is not None and kept.name == "pkg._ext"
    assert set(kept.sources) == {
        "csrc/pybind.cpp", "csrc/cpu/roi_pool.cpp", "csrc/roi_pool.cpp", "csrc/knn_cpu.cpp"
    }  # fmt: skip
    tight = trimmed(repo, ext, {"roi_pool_forward"}, 2)  # a pair that does not fit: skipped
    assert tight is not None and tight.sources == ("csrc/pybind.cpp", "csrc/knn_cpu.cpp")
    no_module = Extension("pkg._ext", ("csrc/cpu/nms.cpp", "csrc/nms.cpp"), (), (), ())
    assert trimmed(repo, no_module, None, 5) is None  # nothing binds what would be built


@pytest.mark.slow
def test_a_source_whose_pragma_needs_what_the_repository_never_defines_builds_as_torch_builds_it(
    tmp_path,
):
    """PyTorch-Encoding's roi_align_cpu.cpp has `#pragma omp parallel for
    num_threads(engine::OpenMP::Get()->...)` and nothing defines `engine`: torch's build (no
    -fopenmp in its setup.py) ignores the pragma. With -fopenmp always on, the source was left
    out of the CPU build, and its functions were stubs that raise."""
    from conftest import write_tree

    from testgen.cpu_twin import build

    repo = write_tree(
        tmp_path / "repo",
        {
            "pkg/op.cpp": "#include <torch/extension.h>\n"
            "at::Tensor twice(at::Tensor x) {\n  auto y = x.clone();\n"
            "  float* p = y.data_ptr<float>();\n"
            "#pragma omp parallel for num_threads(engine::OpenMP::Get()->Count())\n"
            "  for (int i = 0; i < y.numel(); ++i) p[i] *= 2;\n  return y;\n}\n"
            'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }\n',
        },
    )
    ext = Extension("pkg._C", ("pkg/op.cpp",), (), (), ())
    module = build(repo, ext, tmp_path / "out")
    assert module is not None
    check = "import importlib.util as u, sys, torch\n" \
        "s = u.spec_from_file_location('_C', sys.argv[1]); m = u.module_from_spec(s)\n" \
        "s.loader.exec_module(m); print(m.twice(torch.ones(3)).tolist())\n"  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", check, str(module)], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "[2.0, 2.0, 2.0]", out.stderr[-500:]
