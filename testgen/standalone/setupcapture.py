"""Read the extensions a repository's setup.py would build, without building them.

Where a repository compiles its C++ (which sources, include folders, macros) is written in its
setup.py, often computed: globs, environment switches, a CPU and a CUDA flavour of each module.
Reading the text misses most of that; running the script finds it exactly. So this script runs
setup.py (repository code: only inside `miner.sandbox.run`) with `setup()` and torch's
`CppExtension`/`CUDAExtension` replaced by recorders, and writes what they were given as JSON.
With `--cuda`, CUDA is pretended (`torch.cuda.is_available()`, `CUDA_HOME`, `FORCE_CUDA=1`) for
scripts that refuse to describe anything without it.

Usage (what `testgen.cpu_twin.capture` runs): python setupcapture.py REPO OUT.json [--cuda]
Standard library and torch only (and its sibling recorder.py, for the repository's view).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import runpy
import sys

try:  # beside this script in the sandbox; as kminer's modules when imported (tests)
    from testgen.standalone.recorder import _guarded, _repository_view, _StubModule
except ImportError:
    from recorder import _guarded, _repository_view, _StubModule


class _Missing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A module setup.py imports and this machine lacks is an inert stub, as in the recorder:
    mmcv's `from pkg_resources import ...` (gone from today's setuptools) stopped the script
    before it described a single extension. An import with its own fallback still fails."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, fullname, path, target=None):
        frame = sys._getframe(1)
        while frame is not None:
            name = frame.f_code.co_filename
            if not name.startswith("<frozen") and "importlib" not in name:
                break
            frame = frame.f_back
        if frame is None:
            return None
        where = os.path.realpath(frame.f_code.co_filename)
        if not where.startswith(self.roots) or _guarded(where, frame.f_lineno):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        return None


class _SetupCalled(Exception):
    """Raised by the recording `setup()`: nothing after it matters."""


def _described(kind: str, name, sources=(), *args, **kwargs) -> dict:
    compile_args = kwargs.get("extra_compile_args") or {}
    cxx = compile_args.get("cxx", []) if isinstance(compile_args, dict) else list(compile_args)
    return {
        "name": str(name),
        "kind": kind,
        "sources": [str(s) for s in (sources or kwargs.get("sources") or ())],
        "include_dirs": [str(d) for d in kwargs.get("include_dirs") or ()],
        "define_macros": [[str(k), None if v is None else str(v)] for k, v in
                          kwargs.get("define_macros") or ()],
        "undef_macros": [str(m) for m in kwargs.get("undef_macros") or ()],
        "cxx_args": [str(a) for a in cxx],
    }  # fmt: skip


def _writes_may_fail() -> None:
    """What setup.py writes into the repository (detectron2 links its configs into its package
    before it calls `setup()`) is refused by the read-only sandbox: the write is skipped, and
    the script goes on to describe its extensions."""
    import errno
    import shutil

    refused = {errno.EROFS, errno.EACCES, errno.EPERM}
    skipped = [0]

    def tolerant(fn):
        def call(*args, **kwargs):
            before = skipped[0]
            try:
                return fn(*args, **kwargs)
            except OSError as exc:  # (or what a skipped inner write left missing: shutil.copy)
                if exc.errno not in refused and skipped[0] == before:
                    raise
                skipped[0] += 1
                print(f"kminer-setup: skipped {fn.__name__}: {exc}", file=sys.stderr)
                return None

        return call

    import builtins
    import io

    real_open = builtins.open

    def open_for_writing(file, mode="r", *args, **kwargs):
        try:
            return real_open(file, mode, *args, **kwargs)
        except OSError as exc:  # a version file written beside the package (PyTorch-Encoding's
            if exc.errno not in refused or not set(mode) & set("wax+"):  # encoding/version.py)
                raise
            skipped[0] += 1
            print(f"kminer-setup: skipped writing {file}: {exc}", file=sys.stderr)
            return io.BytesIO() if "b" in mode else io.StringIO()

    builtins.open = io.open = open_for_writing
    for module, names in (
        (os, ("symlink", "link", "mkdir", "makedirs", "remove", "unlink", "rename", "replace")),
        (shutil, ("copy", "copy2", "copyfile", "copytree", "rmtree", "move")),
    ):
        for name in names:
            setattr(module, name, tolerant(getattr(module, name)))


def _patch(cuda: bool) -> list:
    import setuptools
    import torch
    import torch.utils.cpp_extension as ce

    found: list = []

    def extension(kind):
        def make(name, sources=(), *args, **kwargs):
            desc = _described(kind, name, sources, *args, **kwargs)
            found.append(desc)
            return desc

        return make

    def setup(*args, **kwargs):
        raise _SetupCalled()

    ce.CppExtension = extension("cpp")
    ce.CUDAExtension = extension("cuda")
    setuptools.setup = setup
    try:
        import distutils.core

        distutils.core.setup = setup
    except ImportError:
        pass
    _writes_may_fail()
    if cuda:
        torch.cuda.is_available = lambda: True
        ce.CUDA_HOME = ce.CUDA_HOME or os.environ.get("CUDA_HOME") or "/usr/local/cuda"
        os.environ["FORCE_CUDA"] = "1"
    return found


def _relative(path: str, view: str, repo: str) -> str | None:
    """A path setup.py named (relative to its folder, or absolute inside the view of
    symlinks) as a path relative to the repository; None for one outside it."""
    full = os.path.realpath(os.path.join(view, path))
    if full == repo or full.startswith(repo + os.sep):
        return os.path.relpath(full, repo)
    return None


def main(argv: list[str]) -> int:
    repo, out = os.path.realpath(argv[0]), argv[1]
    cuda = "--cuda" in argv[2:]
    found = _patch(cuda)
    with _repository_view(repo) as view:  # setup.py may write beside itself: into the view
        sys.path.insert(0, view)
        sys.meta_path.append(_Missing((repo + os.sep, os.path.realpath(view) + os.sep)))
        sys.argv = [os.path.join(view, "setup.py"), "build_ext"]
        try:
            runpy.run_path(os.path.join(view, "setup.py"), run_name="__main__")
        except _SetupCalled:
            pass
        except BaseException as exc:  # whatever it described before failing counts
            print(f"kminer-setup: setup.py stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
        for ext in found:
            ext["sources"] = [p for s in ext["sources"] if (p := _relative(s, view, repo))]
            dirs = ext["include_dirs"]
            ext["include_dirs"] = [p for d in dirs if (p := _relative(d, view, repo))]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(found, f)
    print(f"kminer-setup: {len(found)} extensions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
