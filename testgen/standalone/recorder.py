"""Record the arguments a repository's own Python tests pass to its compiled extension.

The best inputs for a kernel are the ones its authors test it with: valid shapes, valid index
ranges, meaningful boxes. Their tests call the extension through Python wrappers we cannot build
here, so this script runs them (repository code: only ever inside `miner.sandbox.run`, a
subprocess in a temp dir with a timeout) with every compiled module of the repository replaced by a
recorder that snapshots each call's arguments. What the tests need and this machine lacks is faked:

- imports the repository needs (mmengine, cv2, ...) become inert stubs; a stub's
  `is_<device>_available()` says True for CUDA only;
- top-level packages load without running their `__init__` (which pulls in the whole framework);
  a name that `__init__` would have imported from a submodule is imported from it on first use,
  and the submodules it imports are imported (best effort) before the tests run, for what they
  do on import (`SparseTensor.set_diag = ...`);
- custom operators the repository registers under `torch.ops.<its package>` record like the
  extension module, and `torch.ops.load_library` of its own libraries does nothing;
- without a GPU, CUDA is pretended (`torch.cuda.is_available()`, `.cuda()`, `device='cuda'`)
  while every tensor stays on the CPU, so the tests' CUDA cases run too;
- `torch.backends.<anything unknown>` (cnnl, mlu, ...) is a stub;
- the working directory shows the repository's top-level entries (symlinks in a temp dir), so
  data files opened by repository-relative paths are found and nothing is written into it;
- assertions are disarmed so a test goes on to its next case: the repository's source files
  load with each `assert` turned into a check whose failure is ignored (the calls inside it are
  still made), numpy/torch checks pass, `pytest.raises` never fails and records nothing inside,
  `gradcheck` runs forward and backward once (not once per perturbed input);
- exact repeats of a call (a test's CPU and CUDA cases) are kept once;
- an object of a class the extension binds (SparseConvNet's `Metadata_2`) is recorded as the
  steps that made and changed it (record_objects.py): a call taking one keeps its setup;
- an expected value a test computes in line (`expected = dist.topk(...)` before
  `assert torch.all(idx == expected)`) is lifted into a function of the test file that the test
  calls (inline_refs.py), recorded like the file's helpers;
- a repository function that calls a possible reference (`bias_act` calls the extension for
  CUDA inputs, `_bias_act_ref` otherwise) runs again on the other device with copies of its
  arguments, and the reference's calls are paired with the extension calls of the same values.

The calls are written with `torch.save`.
Usage (what `inputs.record_repo_calls` runs): python recorder.py REPO TEST_FILE OUT.pt [BUILT.json]
(BUILT.json: the repository's extensions kminer built for the CPU, which run behind the log)
It imports only the standard library, torch, pytest and its siblings (record_log.py,
record_objects.py, record_rows.py, pretend_cuda.py, the same way): it also runs on the GPU box.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import types

try:  # beside this script in the sandbox; as kminer's modules when imported (tests)
    from testgen.standalone import inline_refs
    from testgen.standalone.pretend_cuda import _fake_cuda, _tag, _tagged
    from testgen.standalone.record_log import _Log, _within_budget
    from testgen.standalone.record_objects import kept_steps
except ImportError:
    import inline_refs
    from pretend_cuda import _fake_cuda, _tag, _tagged
    from record_log import _Log, _within_budget
    from record_objects import kept_steps

ITEMS_PER_TEST = 32  # parametrizations of one test run (spread over its parameter grid)
# then the remaining tests are skipped; the sandbox allows 120 s (KMINER_RECORD_BUDGET_S: a
# test of the recorder's own cut, run outside the sandbox, asks for less)
RECORD_BUDGET_S = float(os.environ.get("KMINER_RECORD_BUDGET_S") or 75.0)
TEST_SHARE_S = 30.0  # one test item past this is cut (a 10000-step loop must not eat the file;
# mmcv's dynamic scatter test computes its expected means over 8000 voxels in ~21 s on 2 cores)
DEVICE_BACKENDS = ("mlu", "npu", "musa")  # torch.<these> as stubs when torch lacks them
_DEVICE_CHECK = re.compile(r"is_(\w+?)_(?:available|pytorch)")  # is_npu_available, is_rocm_pytorch
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _stub_class(name: str) -> type:
    """A stand-in for anything a missing module would have provided: callable, subclassable,
    usable as a decorator (returns what it decorates) and as a context manager, comparable,
    iterable (empty)."""

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _stub_class(name + "()")()

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _stub_class(f"{name}.{attr}")

    namespace = {
        "__init__": lambda self, *a, **k: None,
        "__call__": __call__,
        "__getattr__": __getattr__,
        "__iter__": lambda self: iter(()),
        "__enter__": lambda self: self,
        "__exit__": lambda self, *exc: False,
        "__qualname__": name,
        "_kminer_stub": True,
    }
    # two stub versions are equal: `v >= digit_version('1.6')` and `not v < ...` both hold
    for op in ("__ge__", "__le__"):
        namespace[op] = lambda self, other: True
    for op in ("__gt__", "__lt__"):
        namespace[op] = lambda self, other: False
    return _StubMeta(name.rsplit(".", 1)[-1], (), namespace)


class _StubMeta(type):
    def __getattr__(cls, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _stub_class(f"{cls.__qualname__}.{attr}")

    def __iter__(cls):
        return iter(())

    def __getitem__(cls, key):
        return cls

    # module-level code that orders a stub's attribute (triton's `config.num_warps <= 32`
    # when mamba prunes its autotune configs): no order holds, the code goes on
    def __lt__(cls, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __call__(cls, *args, **kwargs):
        if "_kminer_stub" in cls.__dict__:  # the stub itself, not a class deriving from it
            device = _DEVICE_CHECK.fullmatch(cls.__qualname__.rsplit(".", 1)[-1])
            if device:  # mmengine.device.is_mlu_available(): only CUDA is (pretended) here
                return device.group(1) == "cuda"
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return args[0]  # used as a bare decorator
        return super().__call__(*args, **kwargs)


class _StubModule(types.ModuleType):
    __path__: tuple = ()
    # a stub has every API, so it claims the newest release (`torch_scatter.__version__` read
    # by pytorch_sparse's test helpers to choose an API)
    __version__ = "99.0.0"

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _stub_class(f"{self.__name__}.{attr}")


class _Recorder(types.ModuleType):
    """The repository's compiled extension (or its `torch.ops` namespace): every function records
    its call, then runs the extension built for the CPU (`real`, kminer's `testgen.cpu_twin`)
    when there is one, so the test goes on with real results; without one, or when the built
    function refuses (a CUDA-only launcher is a stub that raises), the call returns None."""

    def __init__(self, name: str, log: _Log, real=None) -> None:
        super().__init__(name)
        self._log = log
        self._real = real
        if real is not None:
            log.objects.watch(real)  # its classes' objects: made and changed by steps

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        log, real = self._log, self._real
        objects = log.objects

        def record(*args, **kwargs):
            target = None
            if real is not None:  # a function the CPU build lacks: recorded, returns None
                with contextlib.suppress(Exception):
                    target = _cpu_side(real, attr)
            step = None  # the call as a step of the objects it makes or takes
            if objects.is_class(target) or objects.involved(args, kwargs):
                step = objects.step(attr, args, kwargs)
            index = log.add(attr, args, kwargs, step, self.__name__)
            if target is None:
                return None
            try:
                result = target(*args, **kwargs)
            except Exception:
                return None
            if step is None and objects.holds(result):  # a function that makes an object
                step = objects.step(attr, args, kwargs)
            if step is not None:
                objects.made(step, result)
            if index is not None:
                with contextlib.suppress(Exception):
                    log.written(index, args)
                    log.returned(index, result)
            if any(_tagged(a) for a in (*args, *kwargs.values())):
                _tag(result)  # computed from tensors that pass for CUDA ones
            return result

        record.__name__ = attr
        return record


# wrappers.opmap.TWINS (this file travels alone, so it keeps its own copy)
_TWINS = (("_cuda", "_cpu"), ("_gpu", "_cpu"), ("CUDA", "CPU"), ("Cuda", "Cpu"), ("cuda", "cpu"))


def _cpu_side(real, attr: str):
    """The built module's function for `attr`; for a CUDA-named function the CPU build never
    binds (torchsparse: the package calls `hash_cuda` on CUDA tensors, the CPU build binds only
    `hash_cpu` with the same arguments), its CPU twin by name."""
    if hasattr(real, attr):
        return getattr(real, attr)
    for cuda, cpu in _TWINS:
        if cuda in attr and hasattr(real, attr.replace(cuda, cpu)):
            return getattr(real, attr.replace(cuda, cpu))
    return getattr(real, attr)


def _load_built(name: str, path: str):
    """The module built for the CPU at `path`, imported as `name`; None when it does not load."""
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception as exc:
        print(f"kminer-record: {name} built for the CPU does not load: {exc}", file=sys.stderr)
        return None


class _Package(types.ModuleType):
    """A top-level package of the repository whose `__init__` never ran: a name it would have
    imported from a submodule (`from .scatter import scatter_max`, `from .ops import *`) is
    imported from there when first asked for."""

    def __getattr__(self, attr):
        exports, stars, _ = self._exports()
        resolving = self.__dict__.setdefault("_kminer_resolving", set())
        if attr in resolving or (attr.startswith("__") and attr not in exports):
            raise AttributeError(attr)
        resolving.add(attr)
        try:
            value = self._resolve(attr, exports, stars)
        finally:
            resolving.discard(attr)
        setattr(self, attr, value)  # over the submodule of that name the import just bound
        return value

    def _resolve(self, attr, exports, stars):
        if attr in exports:
            module, name = exports[attr]
            try:
                found = importlib.import_module(f"{self.__name__}.{module}")
                return found if name is None else getattr(found, name)
            except Exception as exc:
                raise AttributeError(attr) from exc
        for module in stars:
            with contextlib.suppress(Exception):
                found = importlib.import_module(f"{self.__name__}.{module}")
                if hasattr(found, attr):
                    return getattr(found, attr)
        constants = self._exports()[2]
        if attr in constants:  # `forward_pass_multiplyAdd_count = 0`: a counter its ops bump
            return constants[attr]
        if self._submodule(attr):  # `scn.SCN`: the compiled extension its __init__ imports
            try:
                return importlib.import_module(f"{self.__name__}.{attr}")
            except Exception as exc:
                raise AttributeError(attr) from exc
        if attr in self._defined():  # an op its __init__ defines itself (a small package)
            self._run_init()
            if attr in self.__dict__:
                return self.__dict__[attr]
        raise AttributeError(attr)

    def _defined(self) -> set:
        """The functions and classes its `__init__` defines at its top level."""
        return {
            node.name
            for node in self._init_tree().body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        }

    def _run_init(self) -> None:
        """Its `__init__`'s imports and definitions, run once in its namespace, each statement
        on its own (one that fails, a framework import, is left out; nothing else runs)."""
        if self.__dict__.get("_kminer_ran"):
            return
        self.__dict__["_kminer_ran"] = True
        self.__dict__.setdefault("__package__", self.__name__)
        kinds = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.FunctionDef,
                 ast.AsyncFunctionDef, ast.ClassDef)  # fmt: skip
        for node in self._init_tree().body:
            if not isinstance(node, kinds):
                continue
            code = compile(ast.Module(body=[node], type_ignores=[]), self.__file__, "exec")
            with contextlib.suppress(Exception):
                exec(code, self.__dict__)

    def _submodule(self, attr) -> bool:
        """Whether `attr` names a module of this package: a source file or folder beside its
        `__init__`, or an extension the repository compiles under it."""
        here = os.path.dirname(self.__file__)
        if os.path.isfile(os.path.join(here, attr + ".py")) or os.path.isdir(
            os.path.join(here, attr)
        ):
            return True
        finders = [f for f in sys.meta_path if isinstance(f, _Finder)]
        return any(f"{self.__name__}.{attr}" in f.extensions for f in finders)

    def _init_tree(self) -> ast.Module:
        """Its `__init__`, parsed once (an empty module when it cannot be read)."""
        tree = self.__dict__.get("_kminer_tree")
        if tree is None:
            try:
                with open(self.__file__, encoding="utf-8", errors="replace") as f:
                    tree = ast.parse(f.read())
            except (OSError, SyntaxError, ValueError):
                tree = ast.Module(body=[], type_ignores=[])
            self.__dict__["_kminer_tree"] = tree
        return tree

    def _exports(self):
        cached = self.__dict__.get("_kminer_exports")
        if cached is not None:
            return cached
        exports: dict = {}
        stars: list = []
        tree = self._init_tree()
        prefix = self.__name__ + "."
        constants = {}
        for node in tree.body:  # plain values its __init__ sets (counters, flags, versions)
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                with contextlib.suppress(ValueError, TypeError, SyntaxError, AttributeError):
                    constants[node.targets[0].id] = ast.literal_eval(node.value)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):  # import torchsparse.backends as backends
                for alias in node.names:
                    if alias.asname and alias.name.startswith(prefix):
                        exports.setdefault(alias.asname, (alias.name[len(prefix) :], None))
                continue
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 1:
                module = node.module
            elif node.level == 0 and (node.module or "").startswith(prefix):
                module = node.module[len(prefix) :]
            else:
                continue
            for alias in node.names:
                if alias.name == "*":
                    stars.append(module)
                elif module is None:  # from . import submodule
                    exports[alias.asname or alias.name] = (alias.name, None)
                else:
                    exports.setdefault(alias.asname or alias.name, (module, alias.name))
        self.__dict__["_kminer_exports"] = (exports, stars, constants)
        return exports, stars, constants


def _load_package_submodules() -> None:
    """Import, best effort, the submodules each repository package's `__init__` would have
    imported. What they do on import is part of the package: pytorch_sparse's `diag.py` ends
    with `SparseTensor.set_diag = ...`, and a test calling `mat.set_diag(...)` fails without
    it (no call of `non_diag_mask` is ever made)."""
    for name, module in list(sys.modules.items()):
        if not isinstance(module, _Package) or module.__dict__.get("_kminer_loaded"):
            continue
        module.__dict__["_kminer_loaded"] = True
        exports, stars, _ = module._exports()
        for sub in dict.fromkeys([*(m for m, _ in exports.values()), *stars]):
            if sub:
                with contextlib.suppress(Exception):
                    importlib.import_module(f"{name}.{sub}")
        _run_init_calls(module)


def _run_init_calls(package: _Package) -> None:
    """The calls a package's `__init__` makes at its top level (torchsparse: `backends.init()`,
    which sets the globals its convolution reads), each run best effort with the names it uses
    resolved through the package: without them every call of its ops fails before reaching
    the extension."""
    for node in package._init_tree().body:
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            continue
        namespace: dict = {}
        for used in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}:
            with contextlib.suppress(Exception):
                namespace[used] = sys.modules.get(used) or getattr(package, used)
        with contextlib.suppress(Exception):
            code = compile(ast.Module(body=[node], type_ignores=[]), package.__file__, "exec")
            exec(code, namespace)


@functools.cache
def _guarded_lines(filename: str) -> tuple:
    """Line ranges of `try:` bodies whose handler takes an ImportError and goes on (not a bare
    re-raise): `try: from parrots.autograd import gradcheck / except ImportError: <fallback>`."""
    try:
        with open(filename, encoding="utf-8", errors="replace") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    ranges = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try) or not node.body:
            continue
        for handler in node.handlers:
            caught = handler.type
            names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
            takes = caught is None or any(
                isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names
            )
            if takes and not all(isinstance(b, ast.Raise) for b in handler.body):
                ranges.append((node.body[0].lineno, node.body[-1].end_lineno))
                break
    return tuple(ranges)


def _guarded(filename: str, line: int) -> bool:
    """An import with a fallback: it fails as it would here (the fallback runs), no stub."""
    return any(start <= line <= end for start, end in _guarded_lines(filename))


def _package_roots(repo: str) -> dict[str, str]:
    """The repository's top-level packages and the folder each lies in: its root, else a
    folder one level down that is no package itself (`src/pkg`, or setup.py's `package_dir=
    {'': 'Correlation_Module'}`), which an installed copy would have put on the path."""

    def packages(folder: str) -> list[str]:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return []
        return [d for d in names if os.path.isfile(os.path.join(folder, d, "__init__.py"))]

    # a test folder that is a package (`test/__init__.py` with a `run_if_cuda` helper) is the
    # tests' own: it loads from source like a test module, never as the library's package
    roots = dict.fromkeys([p for p in packages(repo) if not p.startswith("test")], repo)
    for sub in sorted(os.listdir(repo)):
        folder = os.path.join(repo, sub)
        if sub.startswith((".", "test", "doc")) or not os.path.isdir(folder) or sub in roots:
            continue  # (a test folder's packages are its tests' own)
        for name in packages(folder):
            if not name.startswith("test"):
                roots.setdefault(name, folder)
    return roots


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Top-level packages of the repository load from its source without running their
    `__init__` (which pulls in the whole framework); a module of the repository with no source
    file is its compiled extension (the recorder); a module the repository imports and this
    machine lacks is a stub."""

    def __init__(self, repo: str, log: _Log, built: dict | None = None) -> None:
        self.repo = os.path.realpath(repo)
        self.log = log
        self.built = dict(built or {})  # import name → the module built for the CPU
        self.roots = _package_roots(self.repo)  # package name → the folder it lies in
        self.packages = set(self.roots)
        # compiled modules its setup.py builds; namespaces its C++ registers operators in
        self.extensions, self.namespaces, self.versions = _compiled_names(self.repo)
        self.extensions |= set(self.built)

    def find_spec(self, fullname, path, target=None):
        top = fullname.split(".")[0]
        if top in self.packages:
            parts = fullname.split(".")
            base = os.path.join(self.roots[top], *parts)
            if len(parts) == 1:
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            if fullname in self.extensions:  # `torchsparse.backend`, beside its C++ folder
                return importlib.machinery.ModuleSpec(fullname, self, is_package=False)
            if os.path.isfile(base + ".py") or os.path.isdir(base):
                return self._source_spec(fullname, path)  # real source, asserts disarmed
            return importlib.machinery.ModuleSpec(fullname, self, is_package=False)
        spec = self._source_spec(fullname, path)  # a test module, conftest, helper
        if spec is not None:
            return spec
        if fullname in self.extensions:  # `import _ext as _backend`: a top-level extension
            return importlib.machinery.ModuleSpec(fullname, self, is_package=False)
        importer = self._importer()
        if importer is None or _guarded(*importer) or self._exists(fullname, path, target):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def _source_spec(self, fullname, path):
        """The spec of a source file of the repository, loaded with its asserts disarmed; None
        for anything else (the normal finders take it)."""
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if (
            spec is None
            or not isinstance(spec.loader, importlib.machinery.SourceFileLoader)
            or not os.path.realpath(spec.origin).startswith(self.repo + os.sep)
        ):
            return None
        spec.loader = _DisarmedLoader(fullname, spec.origin)
        return spec

    def _exists(self, fullname, path, target) -> bool:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            try:
                spec = finder.find_spec(fullname, path, target)
            except (ImportError, ValueError, AttributeError):
                continue
            if spec is not None and not self._shadow(spec):
                return True
        return False

    def _shadow(self, spec) -> bool:
        """A folder without `__init__` below the repository's root that a top-level import
        found only because pytest put a test's folder on sys.path (mamba's tests/ops/triton/
        for `import triton`): not the package asked for, which this machine lacks."""
        places = list(spec.submodule_search_locations or [])
        if spec.origin not in (None, "namespace") or not places or "." in spec.name:
            return False
        return all(
            os.path.dirname(os.path.realpath(p)).startswith(self.repo + os.sep) for p in places
        )

    def _importer(self) -> tuple[str, int] | None:
        """(file, line) of the import statement when the repository's code makes it."""
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if not filename.startswith("<frozen") and "importlib" not in filename:
                filename = os.path.realpath(filename)
                if filename.startswith(self.repo + os.sep):
                    return filename, frame.f_lineno
                return None
            frame = frame.f_back
        return None

    def create_module(self, spec):
        parts = spec.name.split(".")
        if len(parts) == 1 and parts[0] in self.packages:
            module = _Package(spec.name)
            module.__path__ = [os.path.join(self.roots[parts[0]], parts[0])]
            module.__file__ = os.path.join(self.roots[parts[0]], parts[0], "__init__.py")
            return module
        if parts[0] in self.packages or spec.name in self.extensions:
            path = self.built.get(spec.name)
            return _Recorder(spec.name, self.log, path and _load_built(spec.name, path))
        return _StubModule(spec.name)

    def exec_module(self, module):
        return None


_EXTENSION = re.compile(  # CUDAExtension("pkg._ext", ...), and `extension_type("pkg.backend"`
    r"\b\w*[Ee]xtension\w*\s*\(\s*(?:name\s*=\s*)?[\"']([\w.]+)[\"']"
)
_LOADED = re.compile(
    r"\bcpp_extension\s*\.\s*load(?:_inline)?\s*\(\s*(?:name\s*=\s*)?[\"'](\w+)[\"']"
)


# a module its C++ names itself (a CMake or scikit-build project: torchmcubes'
# `PYBIND11_MODULE(torchmcubes_module, m)`, built by `Python_add_library`, no setup.py)
_PYBIND_MODULE = re.compile(r"\bPYBIND11_MODULE\s*\(\s*([A-Za-z_]\w*)\s*,")
_OP_NAMESPACE = re.compile(
    r"\bTORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*(\w+)\s*,"  # TORCH_LIBRARY(ns, m)
    r"|\.(?:op|def)\s*\(\s*\"(\w+)::\w+"  # RegisterOperators().op("ns::name" / m.def("ns::..."
)
_TORCH_NAMESPACES = {"aten", "prim", "prims", "quantized", "_quantized", "profiler", "c10d"}
_SOURCES = (".cpp", ".cc", ".cxx", ".cu", ".h", ".hpp", ".cuh")
MAX_SOURCE_BYTES = 2 << 20


def _compiled_names(repo: str) -> tuple[set[str], set[str], dict[str, str]]:
    """In one walk of the repository: the modules it compiles (`CUDAExtension("_ext", ...)` in
    any setup.py, an `extension = CUDAExtension` alias, `cpp_extension.load(name=...)`, a
    literal `PYBIND11_MODULE(name, m)`), whose
    import is the extension, recorded, never a stub of a missing third-party package; and the
    namespaces its C++ registers operators in (`TORCH_LIBRARY(my_ops, m)`,
    `RegisterOperators().op("my_ops::f", ...)`), so `torch.ops.my_ops.f(...)` records whatever
    its Python package is called; and {distribution name: version} of what its setup.py files
    install (_answer_own_versions)."""
    extensions: set[str] = set()
    namespaces: set[str] = set()
    versions: dict[str, str] = {}
    for root, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = os.path.join(root, name)
            python = name.endswith(".py")
            source = name.endswith(_SOURCES) and os.path.getsize(path) <= MAX_SOURCE_BYTES
            if not (python or source):
                continue
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            if name == "setup.py":
                extensions |= set(_EXTENSION.findall(text))
                versions.update(_setup_version(text))
            if python and "cpp_extension" in text:
                extensions |= set(_LOADED.findall(text))
            if not python and "PYBIND11_MODULE" in text:
                extensions |= set(_PYBIND_MODULE.findall(text)) - {"TORCH_EXTENSION_NAME"}
            if not python and ("TORCH_LIBRARY" in text or "RegisterOperators" in text):
                namespaces |= {a or b for a, b in _OP_NAMESPACE.findall(text)}
    return extensions, namespaces - _TORCH_NAMESPACES, versions


def _disarm_assertions() -> None:
    """The recorder computes nothing, so checks on results would stop a test at its first case."""
    import numpy
    import torch

    for name in dir(numpy.testing):
        if name.startswith("assert_"):
            setattr(numpy.testing, name, lambda *a, **k: None)
    numpy.allclose = lambda *a, **k: True
    torch.allclose = lambda *a, **k: True
    torch.testing.assert_close = lambda *a, **k: None


class _Disarm(ast.NodeTransformer):
    """`assert CHECK, MSG` becomes `try: CHECK / except Exception: pass`: the calls inside a
    check (`assert np.allclose(op(x), expected)`) are still made, a failing check goes on."""

    def visit_Assert(self, node):
        handler = ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name=None)
        handler.body = [ast.Pass()]
        guarded = ast.Try(body=[ast.Expr(node.test)], handlers=[handler], orelse=[])
        guarded.finalbody = []
        return ast.copy_location(guarded, node)


REF_NAME = re.compile(
    r"(?:_ref|_reference|_pytorch|_torch|_naive|_python|_native|_groundtruth|_gt|_slow)$"
    r"|^(?:ref|reference|naive|torch|pytorch)_|^forward_native$",
    re.IGNORECASE,
)


class _TagRefs(ast.NodeTransformer):
    """The module's functions that may be a reference get `ref_recorder`: in a test file every
    helper (not a test, not a fixture), elsewhere those named like one (`*_ref`, `*_pytorch`,
    `forward_native`...) and every one of a module named like one (`chamfer_python.py`). Test
    functions go on past a failed statement (a result never computed must not keep the test
    from its reference call)."""

    def __init__(self, rel: str, test_file: bool) -> None:
        self.rel = rel
        self.test_file = test_file
        # a module named as one (`chamfer_python.py`, `ops_ref.py`): each of its functions
        self.ref_module = REF_NAME.search(os.path.splitext(os.path.basename(rel))[0])

    def visit_Module(self, node):
        for stmt in node.body:
            if isinstance(stmt, ast.FunctionDef):
                plain = not stmt.decorator_list  # not a fixture, nor marked
                self._tag(stmt)
                if self.test_file and plain:
                    # each call made as the file is imported has a share of its time
                    stmt.decorator_list.insert(0, ast.Name("__kminer_share__", ast.Load()))
                if not self.test_file and _calls_a_reference(stmt):
                    stmt.decorator_list.append(self._decorator("__kminer_both__", stmt.name))
            elif isinstance(stmt, ast.ClassDef) and self.test_file:
                for sub in stmt.body:
                    if isinstance(sub, ast.FunctionDef) and sub.name.startswith("test"):
                        sub.body = _GoOn().guard(sub.body)
        return node

    def _tag(self, fn) -> None:
        fixture = any("fixture" in ast.unparse(d) for d in fn.decorator_list)
        if fn.name.startswith("test") and self.test_file:
            fn.body = _GoOn().guard(fn.body)
            return
        if fixture or not (self.test_file or self.ref_module or REF_NAME.search(fn.name)):
            return
        fn.decorator_list.append(self._decorator("__kminer_ref__", fn.name))  # innermost

    def _decorator(self, hook: str, name: str) -> ast.Call:
        return ast.Call(
            func=ast.Name(hook, ast.Load()),
            args=[ast.Constant(self.rel), ast.Constant(name)],
            keywords=[],
        )


def _calls_a_reference(fn: ast.FunctionDef) -> bool:
    """Whether a function (not itself named like a reference) calls one by name: a dispatcher
    between the extension and a PyTorch fallback."""
    if REF_NAME.search(fn.name):
        return False
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            called = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            if called != fn.name and REF_NAME.search(called):
                return True
    return False


def _transform(tree: ast.Module, path: str, repo: str) -> ast.Module:
    rel = os.path.relpath(os.path.realpath(path), repo)
    test = inline_refs.is_test_file(path)
    if test:  # expected values computed in line, as functions (inline_refs.py)
        tree = inline_refs.apply(tree, rel)
    tree = _Disarm().visit(tree)
    return _TagRefs(rel, test).visit(tree)


class _GoOn(ast.NodeTransformer):
    """A script's statements each in `try: ... except Exception: pass` (loops and branches
    kept, their bodies guarded): with results never computed, a statement that reads one fails,
    and the script goes on to its next check instead of ending there."""

    def visit_FunctionDef(self, node):
        node.body = self.guard(node.body)
        return node

    def guard(self, body: list) -> list:
        out = []
        for stmt in body:
            if isinstance(stmt, (ast.For, ast.While, ast.If, ast.With)):
                stmt.body = self.guard(stmt.body)
                stmt.orelse = self.guard(getattr(stmt, "orelse", []))
                out.append(stmt)
            elif isinstance(stmt, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
                out.append(self.visit(stmt))
            else:
                handler = ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name=None)
                failed = ast.Call(ast.Name("__kminer_failed__", ast.Load()), [], [])
                handler.body = [ast.Expr(failed)]  # shown with KMINER_RECORD_TB set
                guarded = ast.Try(body=[stmt], handlers=[handler], orelse=[], finalbody=[])
                out.append(ast.copy_location(guarded, stmt))
        return out


def _has_tests(tree: ast.Module) -> bool:
    """Whether pytest collects anything from the file (test functions, Test classes,
    unittest cases)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
            "test"
        ):
            return True
        if isinstance(node, ast.ClassDef) and (
            node.name.startswith("Test")
            or any("TestCase" in ast.unparse(base) for base in node.bases)
        ):
            return True
    return False


def _is_main_block(node) -> bool:
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def _run_script(path: str, tree: ast.Module, seconds: float = RECORD_BUDGET_S) -> None:
    """A test written as a script (`if __name__ == "__main__": check_a(); check_b()`), or an
    example script (its statements at the top level): its own functions, its main block and
    its top-level statements run statement by statement, asserts disarmed, for at most
    `seconds` (an example that trains for hours gives the calls of its first steps)."""
    import builtins

    tree = _transform(tree, path, _DisarmedLoader.repo)
    go_on = _GoOn()
    body = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("test"):
            go_on.visit(node)  # (test functions already go on: _TagRefs)
        elif _is_main_block(node):
            node.body = _each_a_test(go_on.guard(node.body))
        elif not inline_refs.is_test_file(path) and not isinstance(
            node, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
        ):
            body += _each_a_test(go_on.guard([node]))  # an example's top-level statement
            continue
        body.append(node)
    tree.body = body
    code = compile(ast.fix_missing_locations(tree), path, "exec", dont_inherit=True)
    sys.argv = [path]
    here = os.path.dirname(path)
    sys.path.insert(0, here)
    for name, module in list(sys.modules.items()):  # stubbed while pytest collected the file,
        top = os.path.join(here, name.split(".")[0])  # now found beside it (`from gradcheck
        if isinstance(module, _StubModule) and (os.path.isdir(top) or os.path.isfile(top + ".py")):
            del sys.modules[name]  # import ...` in lietorch/run_tests.py)
    with contextlib.suppress(SystemExit, _OutOfTime), _choices_as_argv():
        _cut_after(seconds)
        try:
            exec(code, {"__name__": "__main__", "__file__": path, "__builtins__": builtins})
        except Exception:  # (an import at its top: nothing after it runs)
            _show_failure()
        finally:
            _cut_after(0)


@contextlib.contextmanager
def _choices_as_argv():
    """A script's command line, where its parser asks for a positional argument it would not
    run without (Pytorch-Correlation-extension's `check.py {forward,backward} ...`): the
    argument's own choices, every one where it takes several. One without choices cannot be
    guessed, and the script ends as it would."""
    import argparse

    real = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        if args is None:
            args = []
            for action in self._actions:
                if action.option_strings or not action.choices or not action.required:
                    continue
                many = action.nargs in ("+", "*", argparse.REMAINDER)
                args += [str(c) for c in action.choices][: None if many else 1]
        return real(self, args, namespace)

    argparse.ArgumentParser.parse_known_args = parse_known_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = real


def _show_failure() -> None:
    """A guarded statement failed: why, on stderr, when KMINER_RECORD_TB asks for it."""
    if os.environ.get("KMINER_RECORD_TB"):
        import traceback

        print("kminer-record: " + traceback.format_exc(limit=-2), file=sys.stderr)


def _each_a_test(stmts: list) -> list:
    """Statements each preceded by `__kminer_begin__()`: the calls of one are paired with the
    references it calls, not with every earlier statement's."""
    out = []
    for stmt in stmts:
        begin = ast.Call(ast.Name("__kminer_begin__", ast.Load()), [], [])
        out += [ast.copy_location(ast.Expr(begin), stmt), stmt]
    return out


class _DisarmedLoader(importlib.machinery.SourceFileLoader):
    """A repository source file (test, conftest, Python wrapper) compiled with its asserts
    disarmed; never from or to a bytecode cache."""

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)

    repo = ""  # set by main: where relative names of reference functions start

    def source_to_code(self, data, path, *, _optimize=-1):
        tree = _transform(ast.parse(data, path), path, self.repo)
        return compile(ast.fix_missing_locations(tree), path, "exec", dont_inherit=True)


class _Raises:
    """`pytest.raises` that never fails (the error a test expects may come from a check that was
    disarmed or a result never computed); the calls made inside it, invalid inputs on purpose,
    are not recorded."""

    value = type = tb = None

    def __init__(self, log: _Log) -> None:
        self.log = log

    def __enter__(self):
        self.log.paused += 1
        return self

    def __exit__(self, *exc) -> bool:
        self.log.paused -= 1
        return exc[0] is None or issubclass(exc[0], Exception)

    def match(self, *args, **kwargs) -> bool:
        return True

    @classmethod
    def patch(cls, pytest, log: _Log) -> None:
        def raises(expected, *args, **kwargs):
            if args and callable(args[0]):  # pytest.raises(Error, fn, *args)
                with cls(log):
                    args[0](*args[1:], **kwargs)
            return cls(log)

        pytest.raises = raises


def _record_torch_ops(finder: _Finder) -> None:
    """Custom operators of the repository (`torch.ops.torch_scatter.scatter_max(...)`, under
    its packages' names or the namespaces its C++ registers) record;
    loading the repository's own operator libraries does nothing (they are not built here); those
    kminer built for the CPU are loaded first and run behind the recording."""
    import torch

    load_library = torch.ops.load_library
    for path in finder.built.values():
        try:
            load_library(path)
        except Exception as exc:
            print(f"kminer-record: {path} does not load: {exc}", file=sys.stderr)
    for namespace in finder.packages | finder.namespaces:
        real = getattr(torch.ops, namespace) if finder.built else None
        setattr(torch.ops, namespace, _Recorder(f"torch.ops.{namespace}", finder.log, real))

    def load_repository_library(path):
        if os.path.realpath(str(path)).startswith(finder.repo + os.sep):
            return None
        return load_library(path)

    torch.ops.load_library = load_repository_library


_SETUP_NAME = re.compile(r"\bname\s*=\s*[\"']([\w.-]+)[\"']")
_SETUP_VERSION = re.compile(r"\bversion\s*=\s*[\"'](\d[\w.+-]*)[\"']")


def _setup_version(text: str) -> dict[str, str]:
    """{distribution name: version} that a setup.py's `setup(name=..., version=...)` installs."""
    call = text[text.find("setup(") :] if "setup(" in text else ""
    name, version = _SETUP_NAME.search(call), _SETUP_VERSION.search(call)
    return {_dist_key(name.group(1)): version.group(1)} if name and version else {}


def _dist_key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _answer_own_versions(versions: dict[str, str]) -> None:
    """The installed version of the repository's own package, as its code asks for it
    (InternImage's DCNv3 reads `pkg_resources.get_distribution('DCNv3').version` at import to
    choose its extension's signature): what its setup.py says, as if it were installed. A
    stub's version is no number, and the package did not import at all."""
    import importlib.metadata as metadata

    if not versions:
        return
    real_version = metadata.version

    def version(name):
        own = versions.get(_dist_key(name))
        return own if own is not None else real_version(name)

    metadata.version = version
    try:  # (by name: a module the GPU box need not have)
        pkg_resources = importlib.import_module("pkg_resources")
    except ImportError:  # (setuptools >= 81 has none): the rest of it stays a stub
        pkg_resources = _StubModule("pkg_resources")
        sys.modules["pkg_resources"] = pkg_resources
    real_get = getattr(pkg_resources, "get_distribution", None)

    def get_distribution(name):
        own = versions.get(_dist_key(str(name)))
        if own is None and real_get is not None:
            return real_get(name)
        return types.SimpleNamespace(project_name=str(name), key=_dist_key(str(name)), version=own)

    pkg_resources.get_distribution = get_distribution


def _stub_backends() -> None:
    """`torch.backends.cnnl.allow_tf32 = False` (another vendor's backend) must not stop a
    test file at collection; neither must `torch.mlu`, `torch.npu`, `torch.musa`, `x.is_npu`."""
    import torch
    import torch.backends

    def backend(name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        stub = _StubModule(f"torch.backends.{name}")
        setattr(torch.backends, name, stub)
        return stub

    torch.backends.__getattr__ = backend
    torch_getattr = getattr(torch, "__getattr__", None)

    def device_backend(name):
        if name in DEVICE_BACKENDS:
            stub = _StubModule(f"torch.{name}")
            setattr(torch, name, stub)
            return stub
        if torch_getattr is None:
            raise AttributeError(name)
        return torch_getattr(name)

    torch.__getattr__ = device_backend
    for name in DEVICE_BACKENDS:  # `x.is_musa`: no tensor is on those devices here
        if not hasattr(torch.Tensor, f"is_{name}"):
            setattr(torch.Tensor, f"is_{name}", property(lambda self: False))


def _tolerant_jit() -> None:
    """`torch.jit.script(fn)` of a function that calls the recorder (or a patched factory)
    cannot compile: the function itself stands in."""
    import torch

    script = torch.jit.script

    @functools.wraps(script)
    def tolerant(obj, *args, **kwargs):
        try:
            return script(obj, *args, **kwargs)
        except Exception:
            return obj

    torch.jit.script = tolerant


def _single_pass_gradcheck() -> None:
    """`gradcheck(fn, inputs)` runs `fn` once and back-propagates once: the forward and backward
    calls with the test's inputs are recorded, not the hundreds of perturbed ones a numerical
    check makes (nor does a result never computed stop the test)."""
    import torch
    from torch.utils._pytree import tree_leaves

    def once(func, inputs, *args, **kwargs):
        inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
        with contextlib.suppress(Exception):
            out = func(*inputs)
            outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
            if outs:
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        return True

    module = sys.modules.get("torch.autograd.gradcheck")
    for owner in (torch.autograd, module):
        if isinstance(owner, types.ModuleType):
            owner.gradcheck = owner.gradgradcheck = once


@contextlib.contextmanager
def _repository_view(repo: str):
    """A temp working directory of symlinks to the repository's top-level entries: tests open
    `tests/data/...` relative to the repository root, and what they write stays out of it."""
    view = tempfile.mkdtemp(prefix="kminer-repo-")
    try:
        for entry in os.listdir(repo):
            if entry != ".git":
                os.symlink(os.path.join(repo, entry), os.path.join(view, entry))
        here = os.getcwd()
        os.chdir(view)
        try:
            yield view
        finally:
            os.chdir(here)
    finally:
        shutil.rmtree(view, ignore_errors=True)  # removes the links, never follows them


class _OutOfTime(BaseException):
    """Raised into a test that runs past its share: a BaseException, so the test's own
    `except Exception` (or the recorder's go-on guards) cannot swallow it."""


_RECORDED = [""]  # the real path of the file being recorded: its own import is cut as usual
IMPORT_GRACE_S = 30.0  # a cut waits at most this long for an import to end
_WAITED = [0.0]


def _waits_for_import(frame) -> bool:
    """Whether a cut that rang at `frame` waits (rings again in 0.2 s): it came in an import
    the recorded file asked for (not its own body, which pytest imports and which may run a
    whole check at its top level). A cut raised in an import leaves that package half made
    for every test after it (sympy without `sympy.printing`, imported by torch on a first
    backward). Cuts wait IMPORT_GRACE_S at most, in all."""
    if _WAITED[0] >= IMPORT_GRACE_S:
        return False
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith("<frozen importlib"):
            _WAITED[0] += 0.2
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            return True
        if code.co_name == "<module>" and os.path.realpath(code.co_filename) == _RECORDED[0]:
            return False  # the recorded file's own body: what runs outside it is pytest's
        frame = frame.f_back
    return False


def _cut_after(seconds: float) -> None:
    """Interrupt the running test after `seconds` (0: never); its calls so far are kept. A
    cut that comes during an import waits for its end."""
    if not hasattr(signal, "setitimer"):
        return

    def cut(signum, frame):
        if not _waits_for_import(frame):
            raise _OutOfTime(f"kminer: past its {seconds:.0f} s")

    signal.signal(signal.SIGALRM, cut if seconds else signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, seconds)


# a call of a test file's own function as the file is imported runs this long at most
CALL_SHARE_S = float(os.environ.get("KMINER_RECORD_CALL_SHARE_S") or 10.0)
_SHARING = [False, 0]  # [whether the file is being imported (not a test's run), share depth]


class _CallOutOfTime(BaseException):
    """One call's share is spent (see `_shared`); the recording goes on after that call."""


def _shared(fn):
    """A function of a test file, each call of it made while the file is imported limited to
    CALL_SHARE_S: ChamferDistancePytorch's unit_test.py runs, at its top level, a check then a
    100-step timing of each of three ops in turn; the first timing would eat the whole budget
    and the other ops' checks never run. The outer cut (the file's budget) stays armed."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not _SHARING[0] or _SHARING[1] or not hasattr(signal, "setitimer"):
            return fn(*args, **kwargs)
        outer, _ = signal.getitimer(signal.ITIMER_REAL)
        if outer and outer <= CALL_SHARE_S:  # the file's own cut comes first
            return fn(*args, **kwargs)
        mine = _CallOutOfTime()

        def cut(signum, frame):
            if not _waits_for_import(frame):
                raise mine

        before = signal.signal(signal.SIGALRM, cut)
        start = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, CALL_SHARE_S)
        _SHARING[1] += 1
        try:
            return fn(*args, **kwargs)
        except _CallOutOfTime as e:
            if e is not mine:
                raise
            return None
        finally:
            _SHARING[1] -= 1
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, before)
            if outer:
                signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))

    return run


def main(argv: list[str]) -> int:
    repo, test_file, out = (os.path.abspath(a) for a in argv[:3])
    _RECORDED[0] = os.path.realpath(test_file)
    built = {}
    if len(argv) > 3:  # {import name: path} of the extensions kminer built for the CPU
        with open(argv[3], encoding="utf-8") as f:
            built = json.load(f)
    sys.dont_write_bytecode = True
    import builtins

    import pytest
    import torch

    with contextlib.suppress(Exception):  # asked before a stub `triton` can answer for it
        from torch.utils._triton import has_triton_package

        has_triton_package()
    log = _Log()
    finder = _Finder(repo, log, built)
    _DisarmedLoader.repo = finder.repo
    builtins.__kminer_ref__ = log.ref_recorder
    builtins.__kminer_inline_args__ = log.inline_args
    builtins.__kminer_inline_result__ = log.inline_result
    builtins.__kminer_inline_op__ = log.inline_op
    builtins.__kminer_both__ = log.on_both_devices
    builtins.__kminer_begin__ = log.begin
    builtins.__kminer_failed__ = _show_failure
    builtins.__kminer_share__ = _shared

    started = time.monotonic()

    def _left() -> float:  # of the file's budget
        return RECORD_BUDGET_S - (time.monotonic() - started)

    class _Boundaries:
        ran = 0  # tests that reached their call phase

        @staticmethod
        def pytest_runtest_logreport(report):
            _Boundaries.ran += report.when == "call"

        @staticmethod
        def pytest_collection_modifyitems(items):
            """At most ITEMS_PER_TEST parametrizations of a test, spread over all of them: a
            test that now runs on to its reference computes it (thousands of cases would not
            fit the file's time)."""
            by_test: dict = {}
            for item in items:
                by_test.setdefault(getattr(item, "originalname", item.name), []).append(item)
            keep = set()
            for group in by_test.values():
                step = max(1, -(-len(group) // ITEMS_PER_TEST))
                keep |= {id(item) for item in group[::step]}
            items[:] = [item for item in items if id(item) in keep]

        @staticmethod
        def pytest_collection_finish(session):
            _load_package_submodules()  # the tests' imports made the packages

        @staticmethod
        def pytest_runtest_setup(item):
            _SHARING[0] = False  # a test's run has its own share
            log.begin()
            left = _left()
            if left <= 0:  # what was recorded is kept
                pytest.skip("kminer: the recording's time is up")
            _cut_after(min(TEST_SHARE_S, left))

        @staticmethod
        def pytest_runtest_teardown(item):
            _cut_after(max(_left(), 1e-3))  # back to the file's whole budget
            _SHARING[0] = True

    sys.meta_path.insert(0, finder)
    sys.path.insert(0, finder.repo)
    with contextlib.suppress(ImportError):
        _disarm_assertions()
    _Raises.patch(pytest, log)
    _record_torch_ops(finder)
    _stub_backends()
    _answer_own_versions(finder.versions)
    _tolerant_jit()
    _single_pass_gradcheck()
    pretend = contextlib.nullcontext() if torch.cuda.is_available() else _fake_cuda(_stub_class)
    with open(test_file, encoding="utf-8", errors="replace") as f:
        tree = ast.parse(f.read(), test_file)
    example = not inline_refs.is_test_file(test_file) and not _has_tests(tree)  # examples/hello.py
    script = example or any(_is_main_block(node) for node in tree.body)
    with _repository_view(finder.repo), pretend:
        if not example and (_has_tests(tree) or not script):
            # --assert=plain: test modules load through the finder, which disarms their asserts
            tb = os.environ.get("KMINER_RECORD_TB", "no")  # `short` to see why a file fails
            options = [
                "-p",
                "no:cacheprovider",
                "-p",
                "no:randomly",
                "--assert=plain",
                f"--tb={tb}",
            ]
            # code the module runs as it is imported (a check, then a 100-step timing loop at
            # its top level: ChamferDistancePytorch's unit_test.py) is cut at the file's
            # budget too, the calls it made kept
            _cut_after(max(_left(), 1e-3))
            _SHARING[0] = True
            with contextlib.suppress(_OutOfTime):
                pytest.main(["-q", *options, test_file], plugins=[_Boundaries()])
            _SHARING[0] = False
            _cut_after(0)
        if script and not _Boundaries.ran:  # a script, or `test_exp(Group)` functions its
            left = _left()  # main block calls (pytest
            _load_package_submodules()
            _run_script(test_file, tree, max(left, 1.0))  # finds no fixture `Group`)
        log.begin()
    calls, refs = _within_budget(log.calls, [r for r in log.refs if r is not None])
    steps, calls = kept_steps(log.objects.steps, calls)
    torch.save({"calls": calls, "refs": refs, "steps": steps, "too_big": log.too_big}, out)
    print(f"kminer-record: {len(calls)} calls, {len(refs)} reference calls")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
