"""Inputs mined from the repository's own tests: the calls they make into its extension.

`recorder.py` runs one test file at a time in the sandbox (a crash or hang costs that file only);
the calls come back as a `torch.save` file and are cached under the workdir by the hash of the
test file and of the recorder, so a rerun records nothing again. A file whose recording failed
(a crash, a timeout) is not cached: the next run tries it again. Each call is bound to the
parameter names of the function the binding exposes, which is how the case generator matches
it to the label's launcher.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import logging
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from miner import sandbox
from testgen import pysources
from testgen.standalone import RECORDER, RECORDER_PARTS
from testgen.standalone.record_objects import is_marker

log = logging.getLogger(__name__)
FILE_TIMEOUT_S = 120.0
RECORD_LIMITS = sandbox.Limits(seconds=FILE_TIMEOUT_S, memory_mb=16 << 10, processes=128)


@dataclass
class RecordedCall:
    function: str  # the name the extension exposes (mmcv: roi_align_forward)
    args: list
    kwargs: dict = field(default_factory=dict)
    test_file: str = ""  # relative to the repository root
    # arguments the call changed, by position, as they were after it ran on the CPU build
    after: dict = field(default_factory=dict)
    returned: list = field(default_factory=list)  # [shape, dtype name] per tensor it returned
    # the objects of the repository's bound classes it took (testgen.standalone.record_objects),
    # by position or keyword: {"kminer_object": class, "made_by": step, "path": [...]}; in
    # `args` each stands as "<object CLASS>", as an unrecordable value always did
    objects: dict = field(default_factory=dict)
    setup: list = field(default_factory=list)  # the steps that remake them: (name, args, kwargs)
    # kminer made it, no test did (a backward call from a forward call's gradient): the label's
    # host code may refuse it, which makes an invalid case, never a failure
    made: bool = False
    module: str = ""  # the extension module it went to, as the test imported it
    # [N, R, where]: the test's call had N rows, too many to keep, and this is its first R
    # (testgen.standalone.record_rows); the integer arguments at `where` were N and are R
    rows_cut: list = field(default_factory=list)

    def bind(self, params: list[str]) -> dict | None:
        """Arguments by parameter name, or None when the call does not fit `params`."""
        if len(self.args) > len(params):
            return None
        bound = dict(zip(params, self.args, strict=False))
        for name, value in self.kwargs.items():
            if name not in params or name in bound:
                return None
            bound[name] = value
        return bound if len(bound) == len(params) else None


@dataclass
class RefCall:
    """A call the repository's tests made to one of its Python functions that may be a
    reference (`causal_conv1d_ref(x, w, ...)`), with its result and the extension calls made
    by the same test (`partners`), which `testgen.python_reference` pairs by value."""

    function: str
    file: str  # where the function is defined, relative to the repository root
    args: list
    kwargs: dict
    result: list  # its outputs (tensors, numbers or None), in order
    partners: list[RecordedCall] = field(default_factory=list)
    test_file: str = ""
    arrays: list = field(default_factory=list)  # arguments that were numpy arrays (pos, name)


class Recorded(dict):
    """Extension calls by function name (a dict, as before), and the reference calls."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.refs: list[RefCall] = []
        # per function its tests called, the most elements of a tensor of a call the recorder
        # did not keep for its size (MAX_ELEMENTS)
        self.too_big: dict[str, int] = {}

    def for_source(self, source: str, kernel_files: list[str], shared: set[str]) -> Recorded:
        """The calls a candidate of `source` may take: of a binding name that kernels of
        several files are reached by (`shared`), not those that went to a module named after
        another kernel file's folder or stem and not after its own. Several extensions bind
        the same names (ChamferDistancePytorch's chamfer_2D, chamfer_3D and chamfer_5D each
        bind `forward`): the 5D kernel given the 2D op's points reads past them, and its test
        would blame it. (A name only one kernel's file is reached by keeps every call: an
        extension named after one op may bind another's.)"""
        mine = _path_words(source)
        others = set().union(*(_path_words(f) for f in kernel_files)) - mine
        view = Recorded(
            {
                name: [
                    c for c in calls if name not in shared or _module_word(c.module) not in others
                ]
                for name, calls in self.items()
            }
        )
        view.refs, view.too_big = self.refs, self.too_big
        return view


# words of a module's or file's name that say only how it is built, not which op it holds
_BUILD_WORDS = {"c", "cu", "cpp", "cuda", "ext", "gpu", "lib", "op", "ops", "kernel", "kernels"}
_BUILD_WORDS |= {"plugin", "impl", "src", "csrc"}


def _word(name: str) -> str:
    """A name as a word to compare: lower case, its `_`-separated words but those that say
    only how it is built (`chamfer_3D`: chamfer3d; `roi_align_cuda`: roialign; `_C`: none)."""
    words = re.split(r"[^0-9a-z]+", name.lower())
    return "".join(w for w in words if w not in _BUILD_WORDS)


@functools.cache
def _path_words(path: str) -> frozenset[str]:
    """The words of a source file's folders and stem (`chamfer3D/chamfer3D.cu`: chamfer3d)."""
    words = {_word(p) for p in [*Path(path).parts[:-1], Path(path).stem]}
    return frozenset(words - {""})


def _module_word(module: str) -> str:
    return _word(module.rsplit(".", 1)[-1]) if module else ""


def repo_test_files(repo: Path) -> list[Path]:
    """The repository's test files, in a stable order: pytest's (test_*.py, *_test.py) and
    those written as scripts (test.py, testcuda.py, *_tests.py: the recorder runs a file with no
    pytest tests as `__main__`)."""
    found = {
        p
        for pattern in ("test*.py", "*_test.py", "*_tests.py")
        for p in repo.rglob(pattern)
        if p.is_file() and ".git" not in p.parts
    }
    return sorted(found)


EXAMPLE_DIRS = {"examples", "example", "demo", "demos", "benchmarks", "benchmark", "samples"}
# a script named as a check, a benchmark or a demo wherever it lies (Pytorch-Correlation-
# extension's top-level check.py compares the CPU and CUDA ops; grad_check.py, benchmark.py)
EXAMPLE_NAME = re.compile(
    r"^(?:\w+_)?(?:check|checks|bench|benchmark|benchmarks|demo|example|sanity)(?:_\w+)?\.py$"
)
MAX_EXAMPLES = 12  # example scripts recorded per run at most (each may cost the whole budget)


def repo_example_files(repo: Path, tests: list[Path] | None = None) -> list[Path]:
    """The repository's example and benchmark scripts (a folder named examples/, demo/,
    benchmarks/..., or a file named so): the second source of inputs, for ops its tests never
    call (SparseConvNet has no tests, only `examples/hello-world.py`). Test files (`tests`,
    found when not given) are not among them."""
    tests = set(repo_test_files(repo) if tests is None else tests)
    found = set()
    for p in repo.rglob("*.py"):
        rel = p.relative_to(repo).parts
        folders = {d.lower() for d in rel[:-1]}
        ordinary = p.name != "__init__.py" and not p.name.startswith("setup") and p not in tests
        named = EXAMPLE_DIRS & folders or EXAMPLE_NAME.match(p.name) or _top_script(p, rel)
        if p.is_file() and ".git" not in rel and named and ordinary:
            found.add(p)
    return sorted(found, key=lambda p: (len(p.parts), p.as_posix()))


_MAIN_BLOCK = re.compile(r"^if\s+__name__\s*==\s*[\"']__main__[\"']\s*:", re.MULTILINE)


def _top_script(path: Path, rel: tuple) -> bool:
    """A script at the repository's top level, run as a program (`if __name__ ==
    "__main__":`): torchmcubes' mcubes.py, the one place that calls its op."""
    if len(rel) != 1:
        return False
    try:
        return bool(_MAIN_BLOCK.search(path.read_text(encoding="utf-8", errors="replace")))
    except OSError:
        return False


def _cache_key(test_file: Path, built: dict[str, Path]) -> str:
    h = hashlib.sha256(RECORDER.read_bytes())
    for part in RECORDER_PARTS:
        h.update(part.read_bytes())
    h.update(test_file.read_bytes())
    h.update(json.dumps(sorted((k, str(v)) for k, v in built.items())).encode())  # content-keyed
    return h.hexdigest()[:20]


def _run_recorder(repo: Path, test_file: Path, built: dict[str, Path]) -> bytes | None:
    with tempfile.TemporaryDirectory(prefix="kminer-record-") as tmp:
        written = Path(tmp) / "calls.pt"
        argv = [sys.executable, str(RECORDER), str(repo), str(test_file), str(written)]
        if built:
            (Path(tmp) / "built.json").write_text(json.dumps({k: str(v) for k, v in built.items()}))
            argv.append(str(Path(tmp) / "built.json"))
        readable = [repo, *{Path(p).parent for p in built.values()}]
        result = sandbox.run(argv, RECORD_LIMITS, writable=[Path(tmp)], readable=readable)
        data = sandbox.read_output(written)
        if data is None:
            why = "timed out" if result.timed_out else f"exit {result.returncode}"
            log.info("recording %s: no calls (%s)", test_file.name, why)
        return data


def _listed(rest: list) -> list:
    """The returned [shape, dtype] pairs of a recorded call (none in older recordings)."""
    return [list(r) for r in rest[0]] if rest else []


def record_file(
    repo: Path, test_file: Path, cache_dir: Path, built: dict[str, Path] | None = None
) -> tuple[list[RecordedCall], list[RefCall], dict[str, int]]:
    """The extension calls one test file makes, its calls of possible references, and the
    most elements of a call's tensor per function whose calls were too large to keep (cached).
    With `built` (the extensions `cpu_twin` built), the calls run on the CPU behind the log; a
    recording that crashes with them is made again without them. A file whose calls cannot be
    read back (a crash, a timeout, a value `weights_only` refuses) gives none, and is tried
    again next run; the others go on."""
    import torch

    repo, test_file, cache_dir = repo.resolve(), test_file.resolve(), cache_dir.resolve()
    built = built or {}
    cache_dir.mkdir(parents=True, exist_ok=True)
    out = cache_dir / f"{_cache_key(test_file, built)}.pt"
    if not out.exists():
        data = _run_recorder(repo, test_file, built)
        if data is None and built:
            data = _run_recorder(repo, test_file, {})
        if data is None:
            return [], [], {}
        out.write_bytes(data)
    rel = test_file.relative_to(repo).as_posix()
    try:
        raw = torch.load(out, weights_only=True)
        calls = [_recorded_call(entry, rel, raw.get("steps", [])) for entry in raw["calls"]]
        refs = [
            RefCall(name, file, list(a), dict(k), list(res), [calls[i] for i in ps], rel, *arrays)
            for file, name, a, k, res, ps, *arrays in raw["refs"]
        ]
        return calls, refs, {str(k): int(v) for k, v in raw.get("too_big", {}).items()}
    except Exception as exc:  # the file's own data: its calls are lost, not the stage
        log.warning("recording %s: calls unreadable (%s: %s)", rel, type(exc).__name__, exc)
        return [], [], {}


def _recorded_call(entry: tuple, rel: str, steps: list) -> RecordedCall:
    """A call as the recorder wrote it, with its objects' markers moved out of its arguments
    (testgen.standalone.record_objects) and the steps that remake them."""
    n, a, k, *rest = entry
    call = RecordedCall(n, list(a), dict(k), rel, dict(rest[0]) if rest else {}, _listed(rest[1:]))
    for key, value in [*enumerate(call.args), *call.kwargs.items()]:
        if is_marker(value):
            call.objects[key] = value
            (call.args if isinstance(key, int) else call.kwargs)[key] = (
                f"<object {value['kminer_object']}>"
            )
    setup = [steps[i] for i in rest[2]] if len(rest) > 2 else []
    call.setup = [(name, list(args), dict(kwargs)) for name, args, kwargs in setup]
    call.module = str(rest[3]) if len(rest) > 3 else ""
    call.rows_cut = list(rest[4]) if len(rest) > 4 else []
    return call


def record_repo_calls(
    repo: Path, cache_dir: Path, wanted: set[str] | None = None, built: dict | None = None
) -> dict[str, list[RecordedCall]]:
    """Every extension call of the repository's tests, by function name; only the test files
    that mention one of `wanted` are run when it is given. `built`: see `record_file`."""
    calls = Recorded()
    tests = repo_test_files(repo)
    if wanted is not None:
        mentions = _mentions(wanted)
        words = _wrapper_names(repo, wanted, set(tests))
    for path in tests:
        if wanted is not None and not _mentioned(path, mentions, words):
            continue
        found, refs, too_big = record_file(repo, path, cache_dir, built)
        for call in found:
            calls.setdefault(call.function, []).append(call)
        calls.refs.extend(refs)
        for name, numel in too_big.items():
            calls.too_big[name] = max(calls.too_big.get(name, 0), numel)
    # the examples speak for the ops no test calls (every op when the names are unknown and
    # the tests called nothing)
    missing = wanted - set(calls) if wanted is not None else None
    if missing == set() or (missing is None and calls):
        return calls
    scripts = repo_example_files(repo, tests)
    if missing is not None:
        mentions, words = _mentions(missing), _wrapper_names(repo, missing, set(tests))
        scripts = [p for p in scripts if _mentioned(p, mentions, words)]
    tested = set(calls)
    for path in scripts[:MAX_EXAMPLES]:
        found, _, _ = record_file(repo, path, cache_dir, built)  # their own checks: none
        for call in found:
            if call.function not in tested and (missing is None or call.function in missing):
                calls.setdefault(call.function, []).append(call)
    return calls


def _mentioned(path: Path, mentions: set[str], words: set[str]) -> bool:
    text = path.read_text("utf-8", errors="replace")
    return any(name in text for name in mentions) or bool(words & _words(text))


def _mentions(wanted: set[str]) -> set[str]:
    """Tests name the Python op, not the extension function: roi_align_forward is tested by a
    file that says roi_align, so the stem before _forward/_backward also counts."""
    stems = set(wanted)
    for name in wanted:
        for suffix in ("_forward", "_backward", "_fw", "_bw"):
            if name.endswith(suffix):
                stems.add(name[: -len(suffix)])
    return stems


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


def _wrapper_names(repo: Path, wanted: set[str], tests: set[Path], depth: int = 3) -> set[str]:
    """What a test file says when it tests one of `wanted` through its Python wrappers: the
    public names defined by the repository's modules that call it (mmcv/ops/voxelize.py calls
    `ext_module.hard_voxelize_forward(` and defines Voxelization and
    `voxelization = _Voxelization.apply`), and the names of modules that call those, `depth`
    levels up (causal-conv1d: `causal_conv1d_fwd` <- `causal_conv1d_fwd_function` <-
    `causal_conv1d_fn`, which the test calls)."""
    if not wanted:
        return set()
    sources = {}
    for path in sorted(repo.rglob("*.py")):
        if ".git" in path.parts or path in tests or not path.is_file():
            continue
        sources[path] = pysources.text(path) or ""
    names: set[str] = set()
    level = set(wanted)
    for n in range(depth):
        how = r"\.\s*" if n == 0 else r"\b"  # the extension's functions are attributes
        called = re.compile(how + "(?:" + "|".join(map(re.escape, sorted(level))) + r")\s*\(")
        found = set()
        for text in sources.values():
            if called.search(text):
                found |= _public_names(text)
        level = found - names - set(wanted)
        names |= found
        if not level:
            break
    return names


def _public_names(text: str) -> set[str]:
    tree = pysources.parse(text)
    if tree is None:
        return set()
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Attribute, ast.Name)):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}  # = F.apply
    return {n for n in defined if not n.startswith("_")}
