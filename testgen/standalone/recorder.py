"""Record the arguments a repository's own Python tests pass to its compiled extension.

The best inputs for a kernel are the ones its authors test it with: valid shapes, valid index
ranges, meaningful boxes. Their tests call the extension through Python wrappers we cannot build
here, so this script runs them (repository code: only ever inside `miner.sandbox.run`, a
subprocess in a temp dir with a timeout) with every compiled module of the repository replaced by a
recorder that snapshots each call's arguments. What the tests need and this machine lacks is faked:

- imports the repository needs (mmengine, cv2, ...) become inert stubs; a stub's
  `is_<device>_available()` says True for CUDA only;
- top-level packages load without running their `__init__` (which pulls in the whole framework);
  a name that `__init__` would have imported from a submodule is imported from it on first use;
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
- a repository function that calls a possible reference (`bias_act` calls the extension for
  CUDA inputs, `_bias_act_ref` otherwise) runs again on the other device with copies of its
  arguments, and the reference's calls are paired with the extension calls of the same values.

The calls are written with `torch.save`.
Usage (what `inputs.record_repo_calls` runs): python recorder.py REPO TEST_FILE OUT.pt
This file imports only the standard library, torch and pytest: it also runs on the GPU box.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import os
import re
import shutil
import sys
import tempfile
import time
import types

MAX_CALLS_PER_FUNCTION = 64
MAX_SHAPED_CALLS_PER_FUNCTION = 256  # past the first 64, a call is kept for its new shapes
MAX_ELEMENTS = 1 << 22  # larger tensors are not worth keeping as test inputs
ITEMS_PER_TEST = 32  # parametrizations of one test run (spread over its parameter grid)
SAVE_BUDGET = 48 << 20  # bytes of tensors written back (the reader takes at most 64 MiB)
MAX_REF_CALLS = 16  # calls of one possible reference kept with the extension calls beside them
MAX_REF_ELEMENTS = 1 << 20  # a reference call with a larger tensor is not kept
RECORD_BUDGET_S = 75.0  # then the remaining tests are skipped; the sandbox allows 120 s
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

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _stub_class(f"{self.__name__}.{attr}")


_TOO_BIG = object()


class _Log:
    """The recorded calls, each distinct call once (a test parametrized over CPU and the
    pretended CUDA makes the same call twice); per function MAX_CALLS_PER_FUNCTION, then only
    calls with new argument shapes (up to MAX_SHAPED_CALLS_PER_FUNCTION)."""

    def __init__(self) -> None:
        self.calls: list = []
        self.refs: list = []  # calls of the repository's Python functions that may be references
        self.paused = 0  # inside `pytest.raises`: the authors' invalid inputs are not kept
        self._seen: dict = {}
        self._shapes: set = set()
        self._count: dict[str, int] = {}
        self._test: tuple[list, list] = ([], [])  # the calls and ref calls of the running test
        self._paired: dict = {}  # reference calls kept with partners, per function
        self._dispatching = False  # inside a dispatcher run on both devices

    def add(self, function: str, args: tuple, kwargs: dict) -> None:
        count = self._count.get(function, 0)
        shapes = (function, _shapes(args), _shapes(kwargs.values()))
        if self.paused or count >= MAX_SHAPED_CALLS_PER_FUNCTION:
            return
        if count >= MAX_CALLS_PER_FUNCTION and shapes in self._shapes:
            return
        snap = [_snapshot(a) for a in args]
        named = {k: _snapshot(v) for k, v in kwargs.items()}
        if any(x is _TOO_BIG for x in [*snap, *named.values()]):
            return
        named_keys = tuple((k, _fingerprint(v)) for k, v in sorted(named.items()))
        key = (function, tuple(map(_fingerprint, snap)), named_keys)
        with contextlib.suppress(TypeError):  # unhashable: kept
            if key in self._seen:
                self._test[0].append(self._seen[key])
                return
            self._seen[key] = len(self.calls)
        self._shapes.add(shapes)
        self._count[function] = count + 1
        self._test[0].append(len(self.calls))
        self.calls.append((function, snap, named))

    def begin(self) -> None:
        """A test (or a script's statement) starts: the Python functions the last one called
        are paired with the extension calls it made, before or after them."""
        calls, refs = self._test
        for k in refs:
            self.refs[k][5].extend(sorted(set(calls)))
            if not calls:  # nothing to pair with: not worth its bytes
                self.refs[k] = None
            else:
                self._paired[self.refs[k][:2]] = self._paired.get(self.refs[k][:2], 0) + 1
        self._test = ([], [])

    def wants_ref(self, where: tuple, values: list) -> bool:
        """Whether a call of a possible reference is worth snapshotting."""
        if self.paused or self._paired.get(where, 0) >= MAX_REF_CALLS:
            return False
        return not any(getattr(v, "numel", int)() > MAX_REF_ELEMENTS for v in values)

    def add_ref(self, where: tuple, args: list, kwargs: dict, result, arrays=()) -> None:
        out = _snapshot_result(result)
        if any(x is _TOO_BIG for x in out) or not self.wants_ref(where, out):
            return
        self._test[1].append(len(self.refs))
        self.refs.append((where[0], where[1], list(args), dict(kwargs), out, [], list(arrays)))

    def on_both_devices(self, file: str, name: str):
        """The decorator put on a repository function that calls a possible reference: a
        wrapper that takes the extension for CUDA inputs and its PyTorch fallback for CPU ones
        (`bias_act`: `_bias_act_ref` on CPU). Called on one device, it is called again on the
        other with copies of its arguments, and the fallback's calls are paired with exactly the
        extension calls of the same arguments (not with every call of the test)."""

        def wrap(fn):
            if not callable(fn):
                return fn

            @functools.wraps(fn)
            def dispatched(*args, **kwargs):
                if self._dispatching or self.paused:
                    return fn(*args, **kwargs)
                self._dispatching = True
                try:
                    return self._twice(fn, args, kwargs)
                finally:
                    self._dispatching = False

            return dispatched

        return wrap

    def _twice(self, fn, args, kwargs):
        calls, refs = self._test
        c0, r0 = len(calls), len(refs)
        result = fn(*args, **kwargs)
        ext, fallback = calls[c0:], refs[r0:]
        if bool(ext) == bool(fallback):  # neither path taken, or both: nothing to learn
            return result
        c1, r1 = len(calls), len(refs)
        with contextlib.suppress(Exception):
            moved_args, moved_kwargs = _elsewhere((args, kwargs), to_gpu=not ext)
            fn(*moved_args, **moved_kwargs)
        cpu_refs, gpu_calls = (refs[r1:], ext) if ext else (fallback, calls[c1:])
        if not (cpu_refs and gpu_calls):
            return result
        for k in cpu_refs:
            self.refs[k][5].extend(sorted(set(gpu_calls)))
            where = self.refs[k][:2]
            self._paired[where] = self._paired.get(where, 0) + 1
        drop = set(cpu_refs)
        refs[:] = [k for k in refs if k not in drop]
        return result

    def ref_recorder(self, file: str, name: str):
        """The decorator put on a repository function that may be a reference: each call's
        arguments (as they were on entry) and result are kept."""

        def wrap(fn):
            if not callable(fn):
                return fn

            @functools.wraps(fn)
            def recorded(*args, **kwargs):
                if not self.wants_ref((file, name), [*args, *kwargs.values()]):
                    return fn(*args, **kwargs)
                snap_args = [_snapshot(a) for a in args]
                snap_kwargs = {k: _snapshot(v) for k, v in kwargs.items()}
                arrays = _numpy(list(args), kwargs)
                result = fn(*args, **kwargs)
                with contextlib.suppress(Exception):
                    self.add_ref((file, name), snap_args, snap_kwargs, result, arrays)
                return result

            return recorded

        return wrap


def _shapes(values) -> tuple:
    import torch

    return tuple(tuple(v.shape) if isinstance(v, torch.Tensor) else None for v in values)


class _Recorder(types.ModuleType):
    """The repository's compiled extension (or its `torch.ops` namespace): every function records
    its call and returns None."""

    def __init__(self, name: str, log: _Log) -> None:
        super().__init__(name)
        self._log = log

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        log = self._log

        def record(*args, **kwargs):
            log.add(attr, args, kwargs)
            return None

        record.__name__ = attr
        return record


def _elsewhere(value, to_gpu: bool):
    """The tensors of `value` copied to the other device (the pretended GPU, or the CPU),
    keeping which ones require grad."""
    import torch
    from torch.utils._pytree import tree_map

    def move(t):
        if not isinstance(t, torch.Tensor):
            return t
        moved = t.detach().cuda() if to_gpu else t.detach().cpu()
        if moved is t or moved.data_ptr() == t.data_ptr():
            moved = moved.clone()
        if t.requires_grad and (moved.is_floating_point() or moved.is_complex()):
            moved.requires_grad_(True)
        return moved

    return tree_map(move, value)


def _snapshot(value):
    import torch

    if isinstance(value, torch.Tensor):
        if value.numel() > MAX_ELEMENTS:
            return _TOO_BIG
        snap = value.detach().to("cpu", copy=True).contiguous()
        snap.__dict__.pop(_TAG, None)
        return snap
    if _is_numpy(value):  # a reference written in numpy: its arrays as tensors (see _numpy)
        return _snapshot(torch.from_numpy(value.copy())) if value.dtype.kind in "biuf" else None
    if hasattr(value, "item") and type(value).__module__ == "numpy":
        return value.item()  # a numpy scalar (torch.load with weights_only refuses one)
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float)) for v in value):
        return list(value)
    return repr(value)


def _is_numpy(value) -> bool:
    return type(value).__name__ == "ndarray" and type(value).__module__ == "numpy"


def _numpy(args: list, kwargs: dict) -> list:
    """Which arguments of a reference call were numpy arrays (positions, keyword names): its
    adapter hands them to the function as arrays again."""
    return [k for k, a in [*enumerate(args), *kwargs.items()] if _is_numpy(a)]


def _snapshot_result(result) -> list:
    """A reference's result as a list of outputs (tensors or None)."""
    import torch

    values = list(result) if isinstance(result, (list, tuple)) else [result]
    out = []
    for v in values:
        if isinstance(v, torch.Tensor) or _is_numpy(v):
            out.append(_snapshot(v))
        elif isinstance(v, (bool, int, float, type(None))):
            out.append(v)
        else:
            return []  # not a result made of tensors: not a reference's
    return out


def _fingerprint(value):
    """A hashable identity of a snapshot: a tensor by dtype, shape and bytes."""
    import torch

    if isinstance(value, torch.Tensor):
        try:
            data = value.reshape(-1).view(torch.uint8).numpy().tobytes()
        except (RuntimeError, TypeError, ValueError):  # no numpy, or a dtype without bytes
            return ("tensor", id(value))
        return (str(value.dtype), tuple(value.shape), hashlib.sha1(data).hexdigest())
    if isinstance(value, list):
        return tuple(value)
    return value


class _Package(types.ModuleType):
    """A top-level package of the repository whose `__init__` never ran: a name it would have
    imported from a submodule (`from .scatter import scatter_max`, `from .ops import *`) is
    imported from there when first asked for."""

    def __getattr__(self, attr):
        exports, stars = self._exports()
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
        raise AttributeError(attr)

    def _exports(self):
        cached = self.__dict__.get("_kminer_exports")
        if cached is not None:
            return cached
        exports: dict = {}
        stars: list = []
        try:
            with open(self.__file__, encoding="utf-8", errors="replace") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            tree = ast.Module(body=[], type_ignores=[])
        prefix = self.__name__ + "."
        for node in ast.walk(tree):
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
        self.__dict__["_kminer_exports"] = (exports, stars)
        return exports, stars


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


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Top-level packages of the repository load from its source without running their
    `__init__` (which pulls in the whole framework); a module of the repository with no source
    file is its compiled extension (the recorder); a module the repository imports and this
    machine lacks is a stub."""

    def __init__(self, repo: str, log: _Log) -> None:
        self.repo = os.path.realpath(repo)
        self.log = log
        self.packages = {
            d
            for d in os.listdir(self.repo)
            if os.path.isfile(os.path.join(self.repo, d, "__init__.py"))
        }
        # compiled modules its setup.py builds; namespaces its C++ registers operators in
        self.extensions, self.namespaces = _compiled_names(self.repo)

    def find_spec(self, fullname, path, target=None):
        top = fullname.split(".")[0]
        if top in self.packages:
            parts = fullname.split(".")
            base = os.path.join(self.repo, *parts)
            if len(parts) == 1:
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
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
                if finder.find_spec(fullname, path, target) is not None:
                    return True
            except (ImportError, ValueError, AttributeError):
                continue
        return False

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
            module.__path__ = [os.path.join(self.repo, parts[0])]
            module.__file__ = os.path.join(self.repo, parts[0], "__init__.py")
            return module
        if parts[0] in self.packages or spec.name in self.extensions:
            return _Recorder(spec.name, self.log)
        return _StubModule(spec.name)

    def exec_module(self, module):
        return None


_EXTENSION = re.compile(r"\b\w*[Ee]xtension\s*\(\s*(?:name\s*=\s*)?[\"']([\w.]+)[\"']")
_LOADED = re.compile(
    r"\bcpp_extension\s*\.\s*load(?:_inline)?\s*\(\s*(?:name\s*=\s*)?[\"'](\w+)[\"']"
)


_OP_NAMESPACE = re.compile(
    r"\bTORCH_LIBRARY(?:_FRAGMENT)?\s*\(\s*(\w+)\s*,"  # TORCH_LIBRARY(ns, m)
    r"|\.(?:op|def)\s*\(\s*\"(\w+)::\w+"  # RegisterOperators().op("ns::name" / m.def("ns::..."
)
_TORCH_NAMESPACES = {"aten", "prim", "prims", "quantized", "_quantized", "profiler", "c10d"}
_SOURCES = (".cpp", ".cc", ".cxx", ".cu", ".h", ".hpp", ".cuh")
MAX_SOURCE_BYTES = 2 << 20


def _compiled_names(repo: str) -> tuple[set[str], set[str]]:
    """In one walk of the repository: the modules it compiles (`CUDAExtension("_ext", ...)` in
    any setup.py, an `extension = CUDAExtension` alias, `cpp_extension.load(name=...)`), whose
    import is the extension, recorded, never a stub of a missing third-party package; and the
    namespaces its C++ registers operators in (`TORCH_LIBRARY(my_ops, m)`,
    `RegisterOperators().op("my_ops::f", ...)`), so `torch.ops.my_ops.f(...)` records whatever
    its Python package is called."""
    extensions: set[str] = set()
    namespaces: set[str] = set()
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
            if python and "cpp_extension" in text:
                extensions |= set(_LOADED.findall(text))
            if not python and ("TORCH_LIBRARY" in text or "RegisterOperators" in text):
                namespaces |= {a or b for a, b in _OP_NAMESPACE.findall(text)}
    return extensions, namespaces - _TORCH_NAMESPACES


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
    `forward_native`...). Test functions go on past a failed statement (a result never computed
    must not keep the test from its reference call)."""

    def __init__(self, rel: str, test_file: bool) -> None:
        self.rel = rel
        self.test_file = test_file

    def visit_Module(self, node):
        for stmt in node.body:
            if isinstance(stmt, ast.FunctionDef):
                self._tag(stmt)
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
        if fixture or not (self.test_file or REF_NAME.search(fn.name)):
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


def _is_test_file(path: str) -> bool:
    name = os.path.basename(path)
    return name.startswith("test") or name.endswith(("_test.py", "_tests.py"))


def _transform(tree: ast.Module, path: str, repo: str) -> ast.Module:
    rel = os.path.relpath(os.path.realpath(path), repo)
    tree = _Disarm().visit(tree)
    return _TagRefs(rel, _is_test_file(path)).visit(tree)


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
                handler.body = [ast.Pass()]
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


def _run_script(path: str, tree: ast.Module) -> None:
    """A test written as a script (`if __name__ == "__main__": check_a(); check_b()`): its own
    functions and its main block run statement by statement, asserts disarmed."""
    import builtins

    tree = _transform(tree, path, _DisarmedLoader.repo)
    go_on = _GoOn()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("test"):
            go_on.visit(node)  # (test functions already go on: _TagRefs)
        elif _is_main_block(node):
            body = []
            for stmt in go_on.guard(node.body):  # each statement a test of its own
                begin = ast.Call(ast.Name("__kminer_begin__", ast.Load()), [], [])
                body += [ast.copy_location(ast.Expr(begin), stmt), stmt]
            node.body = body
    code = compile(ast.fix_missing_locations(tree), path, "exec", dont_inherit=True)
    sys.argv = [path]
    sys.path.insert(0, os.path.dirname(path))
    with contextlib.suppress(Exception, SystemExit):
        exec(code, {"__name__": "__main__", "__file__": path, "__builtins__": builtins})


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
    loading the repository's own operator libraries does nothing (they are not built here)."""
    import torch

    for namespace in finder.packages | finder.namespaces:
        setattr(torch.ops, namespace, _Recorder(f"torch.ops.{namespace}", finder.log))
    load_library = torch.ops.load_library

    def load_repository_library(path):
        if os.path.realpath(str(path)).startswith(finder.repo + os.sep):
            return None
        return load_library(path)

    torch.ops.load_library = load_repository_library


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


def _on_cuda(device) -> bool:
    import torch

    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)  # a CUDA device index


_TAG = "_kminer_cuda"


def _tagged(value) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.__dict__.get(_TAG, False)


def _tag(value):
    import torch
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            leaf.__dict__[_TAG] = True
    return value


def _pretend_cuda_mode():
    """A torch function mode under which CPU tensors pass for CUDA tensors: what a CUDA device
    would create (`device='cuda'`, `.cuda()`, `.to('cuda')`) is a CPU tensor tagged as on the
    GPU, what is computed from a tagged tensor is tagged, and a tagged tensor says `is_cuda`,
    `device` cuda:0, `get_device()` 0. Wrappers that take their CUDA path only for CUDA inputs
    (`if x.is_cuda: ext.op(...) else: <pure PyTorch>`) call the extension."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves

    tensor = torch.Tensor
    is_cuda, device = torch._C.TensorBase.is_cuda, torch._C.TensorBase.device
    uninitialized = {torch.empty, torch.empty_like, torch.empty_strided, tensor.new_empty}

    def on_cpu(kwargs):
        if _on_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
            return True
        return False

    def copy_to(self, *args, **kwargs):
        """Tensor.to: (device, dtype, ...), (dtype, ...), (tensor, ...) or device=..."""
        args = list(args)
        target = kwargs.get("device")
        if args and isinstance(args[0], tensor):
            other = args.pop(0)
            target = "cuda" if _tagged(other) else other.device
            kwargs.setdefault("dtype", other.dtype)
        elif args and (isinstance(args[0], (str, torch.device)) or type(args[0]) is int):
            target = args.pop(0)
        kwargs.pop("device", None)
        if target is None:
            out = tensor.to(self, *args, **kwargs)
            return _tag(out) if _tagged(self) else out
        gpu = _on_cuda(target)
        out = tensor.to(self, "cpu" if gpu else target, *args, **kwargs)
        if out is self and gpu != _tagged(self):  # a move between "devices" copies
            out = self.clone()
        return _tag(out) if gpu else out

    class PretendCuda(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            owner = getattr(func, "__self__", None)
            if owner is is_cuda:
                return _tagged(args[0]) or func(*args)
            if owner is device:
                return torch.device("cuda", 0) if _tagged(args[0]) else func(*args)
            if func is tensor.get_device and _tagged(args[0]):
                return 0
            if func is tensor.cuda:
                return args[0] if _tagged(args[0]) else _tag(args[0].clone())
            if func is tensor.cpu:
                return args[0].clone() if _tagged(args[0]) else func(*args, **kwargs)
            if func is tensor.to:
                return copy_to(*args, **kwargs)
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
            created = on_cpu(kwargs)  # torch.zeros(..., device='cuda'), x.new_ones(..., device=)
            out = func(*args, **kwargs)
            if func in uninitialized and isinstance(out, tensor):
                out.zero_()  # output buffers record the same in every run (and dedupe)
            leaves = tree_leaves((args, kwargs))
            if created or any(_tagged(x) for x in leaves):
                cpu_inputs = {id(x) for x in leaves if isinstance(x, tensor) and not _tagged(x)}
                for leaf in tree_leaves(out):
                    if isinstance(leaf, tensor) and id(leaf) not in cpu_inputs:
                        leaf.__dict__[_TAG] = True
            return out

    return PretendCuda()


def _fake_cuda() -> contextlib.AbstractContextManager:
    """Pretend a CUDA device while every tensor stays on the CPU, so the tests' CUDA cases (most
    of them) run and make their calls: `torch.cuda` says a device is there, and the returned
    mode (active while the tests run) places CUDA tensors on the CPU."""
    import torch

    cuda = torch.cuda
    torch.version.cuda = torch.version.cuda or "12.1"
    cuda.is_available = lambda: True
    cuda.is_initialized = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.get_device_name = lambda *a, **k: "kminer pretended CUDA"
    cuda.get_device_capability = lambda *a, **k: (8, 0)
    cuda.device = lambda *a, **k: contextlib.nullcontext()
    cuda.current_stream = cuda.default_stream = lambda *a, **k: _stub_class("torch.cuda.Stream")()
    for name in (
        "synchronize empty_cache set_device manual_seed manual_seed_all seed seed_all init "
        "ipc_collect reset_peak_memory_stats"
    ).split():
        setattr(cuda, name, lambda *a, **k: None)
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved"):
        setattr(cuda, name, lambda *a, **k: 0)

    class autocast(torch.amp.autocast):  # CUDA autocast casts CPU tensors like CUDA would
        def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda":
                device_type, dtype = "cpu", dtype or torch.float16
            super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def cuda_autocast(enabled=True, dtype=torch.float16, cache_enabled=True):
        return autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    torch.autocast = torch.amp.autocast = autocast
    cuda.amp.autocast = cuda_autocast
    return _pretend_cuda_mode()


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


def _bytes(entry) -> int:
    import torch
    from torch.utils._pytree import tree_leaves

    leaves = tree_leaves(list(entry))
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _within_budget(calls: list, refs: list) -> tuple[list, list]:
    """The calls (smallest first) and then the reference calls that fit SAVE_BUDGET bytes, so
    a test file of large inputs still gives its small ones; partners renumbered."""
    left = SAVE_BUDGET
    kept = set()
    for k in sorted(range(len(calls)), key=lambda k: _bytes(calls[k])):
        size = _bytes(calls[k])
        if size <= left:
            kept.add(k)
            left -= size
    number = {k: i for i, k in enumerate(sorted(kept))}
    out_refs = []
    for ref in sorted(refs, key=_bytes):
        partners = [number[k] for k in ref[5] if k in number]
        size = _bytes(ref[:5])
        if partners and size <= left:
            left -= size
            out_refs.append((*ref[:5], partners, *ref[6:]))
    return [calls[k] for k in sorted(kept)], out_refs


def main(argv: list[str]) -> int:
    repo, test_file, out = (os.path.abspath(a) for a in argv)
    sys.dont_write_bytecode = True
    import builtins

    import pytest
    import torch

    with contextlib.suppress(Exception):  # asked before a stub `triton` can answer for it
        from torch.utils._triton import has_triton_package

        has_triton_package()
    log = _Log()
    finder = _Finder(repo, log)
    _DisarmedLoader.repo = finder.repo
    builtins.__kminer_ref__ = log.ref_recorder
    builtins.__kminer_both__ = log.on_both_devices
    builtins.__kminer_begin__ = log.begin

    started = time.monotonic()

    class _Boundaries:
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
        def pytest_runtest_setup(item):
            log.begin()
            if time.monotonic() - started > RECORD_BUDGET_S:  # what was recorded is kept
                pytest.skip("kminer: the recording's time is up")

    sys.meta_path.insert(0, finder)
    sys.path.insert(0, finder.repo)
    with contextlib.suppress(ImportError):
        _disarm_assertions()
    _Raises.patch(pytest, log)
    _record_torch_ops(finder)
    _stub_backends()
    _tolerant_jit()
    _single_pass_gradcheck()
    pretend = contextlib.nullcontext() if torch.cuda.is_available() else _fake_cuda()
    with open(test_file, encoding="utf-8", errors="replace") as f:
        tree = ast.parse(f.read(), test_file)
    with _repository_view(finder.repo), pretend:
        if not _has_tests(tree) and any(_is_main_block(node) for node in tree.body):
            _run_script(test_file, tree)
        else:
            # --assert=plain: test modules load through the finder, which disarms their asserts
            options = ["-p", "no:cacheprovider", "-p", "no:randomly", "--assert=plain", "--tb=no"]
            pytest.main(["-q", *options, test_file], plugins=[_Boundaries()])
        log.begin()
    calls, refs = _within_budget(log.calls, [r for r in log.refs if r is not None])
    torch.save({"calls": calls, "refs": refs}, out)
    print(f"kminer-record: {len(calls)} calls, {len(refs)} reference calls")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
