"""The repository's own extension, built for the CPU, so its tests can run while they are recorded.

The recorder runs a repository's tests with the compiled extension replaced by a log; every call
returned None, so a test stopped at the first call whose result it used: lietorch's `Group.exp(a)
.log()` recorded `expm` and never `logm`, a backward was never reached through autograd, and
pytorch_sparse's `SparseTensor` never existed (its `ind2ptr` gave None). Most such repositories
ship a CPU implementation beside the CUDA one and dispatch on the tensor's device, and the
recorder's tensors stay on the CPU: built here, the extension computes real results.

So: `capture` reads the extensions from setup.py as it runs (`standalone/setupcapture.py`, in the
sandbox: a CPU description, else one with CUDA pretended); `build` compiles each one's C++ sources
(never its .cu) with g++ against the installed torch, inside the sandbox too, leaving out a
source that does not compile; what the objects then lack (the CUDA launchers, a left-out
source's functions) is defined by stubs that raise, which the recorder turns back into a call that
returned None. Built once per repository snapshot and kminer version (cached under the workdir).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from miner import sandbox, toolchain
from testgen.standalone import SETUPCAPTURE
from wrappers.opmap import TWINS

log = logging.getLogger(__name__)
CXX_SOURCES = (".cpp", ".cc", ".cxx", ".c")
MAX_SOURCES = 40  # C++ sources built per repository (each parses the torch headers: ~30 s)
COMPILE_LIMITS = sandbox.Limits(seconds=600, memory_mb=8 << 10, processes=64)
CAPTURE_LIMITS = sandbox.Limits(seconds=120, memory_mb=8 << 10, processes=64)
_UNDEFINED = re.compile(r"undefined reference to `([^']+)'")
_PYTHON_API = re.compile(r"^_?Py|^_Py")  # resolved by the interpreter that loads the module


@dataclass(frozen=True)
class Extension:
    name: str  # as Python imports it: lietorch_backends, torch_sparse._convert_cpu
    sources: tuple[str, ...]  # the C++ ones, relative to the repository
    include_dirs: tuple[str, ...]
    defines: tuple[str, ...]  # -D / -U flags
    cxx_args: tuple[str, ...]

    @classmethod
    def from_setup(cls, desc: dict) -> Extension:
        defines = [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in desc["define_macros"]]
        defines += [f"-U{m}" for m in desc["undef_macros"]]
        keep = [a for a in desc["cxx_args"] if a.startswith(("-D", "-U", "-std=", "-fopenmp"))]
        return cls(
            name=desc["name"],
            sources=tuple(s for s in desc["sources"] if s.endswith(CXX_SOURCES)),
            include_dirs=tuple(desc["include_dirs"]),
            defines=tuple(defines),
            cxx_args=tuple(keep),
        )


def capture(repo: Path) -> list[Extension]:
    """The extensions setup.py describes (with C++ sources), read by running it in the sandbox:
    as on a machine without CUDA first, then with CUDA pretended when that describes none."""
    if not (repo / "setup.py").is_file():
        return []
    for flags in ([], ["--cuda"]):
        with tempfile.TemporaryDirectory(prefix="kminer-setup-") as tmp:
            out = Path(tmp) / "extensions.json"
            argv = [sys.executable, str(SETUPCAPTURE), str(repo), str(out), *flags]
            sandbox.run(argv, CAPTURE_LIMITS, writable=[Path(tmp)], readable=[repo])
            try:
                found = [Extension.from_setup(d) for d in json.loads(out.read_text())]
            except (OSError, ValueError, KeyError, TypeError):
                found = []
        found = [e for e in found if e.sources]
        if found:
            return found
    return []


def _flags(repo: Path, ext: Extension) -> list[str]:
    incs = [str(repo / d) for d in ext.include_dirs] + list(toolchain.torch_include_dirs())
    incs += [sysconfig.get_paths()["include"], *toolchain.header_library_dirs()]
    if toolchain.cuda_include_dir():  # cuda.h for host code that names CUDA types
        incs.append(toolchain.cuda_include_dir())
    leaf = ext.name.rsplit(".", 1)[-1]
    # a standard older than the one torch's headers need (mmcv still asks for -std=c++14,
    # which today's torch refuses) gives way to torch's; a newer one stands
    ours = toolchain.cxx_standard()
    args = [a for a in ext.cxx_args if not (a.startswith("-std=") and _year(a) < _year(ours))]
    return [
        f"-std={ours}", "-fPIC", "-O1", "-w", "-fopenmp",
        *[f"-I{d}" for d in incs], *ext.defines, *args,
        "-DTORCH_API_INCLUDE_EXTENSION_H", f"-DTORCH_EXTENSION_NAME={leaf}",
        *toolchain.abi_flags(),
    ]  # fmt: skip


def _year(std: str) -> int:
    """2014 for -std=c++14 or gnu++1y, 2020 for c++2a: standards compared by year."""
    m = re.search(r"\+\+(\d\w)", std)
    if not m:
        return 0
    two = {"0x": "11", "1y": "14", "1z": "17", "2a": "20", "2b": "23", "2c": "26"}.get(m[1], m[1])
    return 2000 + int(two) if two.isdigit() else 0


def _run(argv: list[str], folder: Path, repo: Path, objects: Path | None = None) -> sandbox.Result:
    """g++ in the sandbox, writing only into `folder` (each run its own: the sandbox gives it to
    the run's uid), reading the repository and the objects built before."""
    folder.mkdir(parents=True, exist_ok=True)
    readable = [repo, *([objects] if objects else [])]
    return sandbox.run(argv, COMPILE_LIMITS, cwd=folder, readable=readable)


def _stubs(symbols: set[str]) -> str:
    """A definition of each missing function that raises: pybind11 turns the exception into a
    Python RuntimeError, which the recorder reads as a call that returned None."""
    lines = ["#include <stdexcept>"]
    for i, sym in enumerate(sorted(symbols)):
        lines.append(f'extern "C" void kminer_missing_{i}() __asm__("{sym}");')
        lines.append(
            f'extern "C" void kminer_missing_{i}() {{ throw std::runtime_error('
            f'"kminer: {sym[:80]} is not built for the CPU"); }}'
        )
    return "\n".join(lines) + "\n"


def _torch_libs() -> list[str]:
    lib = Path(toolchain.torch_include_dirs()[0]).parent / "lib"
    return [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


def built_as_torch_builds(argv: list[str], run, asked: bool = False) -> sandbox.Result:
    """`run(argv)`, and where that fails, once more without -fopenmp, as torch's own build
    compiles a repository that did not ask for it (`asked`): its OpenMP pragmas ignored, and
    with them a clause naming what the repository never defines (PyTorch-Encoding's ROIAlign,
    copied from MXNet: `num_threads(engine::OpenMP::Get()->...)`)."""
    done = run(argv)
    if done.returncode != 0 and not asked and "-fopenmp" in argv:
        done = run([a for a in argv if a != "-fopenmp"])
    return done


def build(repo: Path, ext: Extension, out_dir: Path, jobs: int = 2) -> Path | None:
    """`ext` as a loadable module under `out_dir` (None when no source compiles or it does not
    link); a source that fails to compile is left out and its functions become stubs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kminer-cputwin-") as t:
        tmp = Path(t)
        flags = _flags(repo, ext)

        def compile_one(i_src):
            i, src = i_src
            obj = tmp / f"c{i}" / "source.o"
            argv = ["g++", "-c", *flags, str(repo / src), "-o", str(obj)]
            asked = "-fopenmp" in ext.cxx_args
            done = built_as_torch_builds(argv, lambda a: _run(a, obj.parent, repo), asked)
            if done.returncode != 0:
                log.info("cpu twin %s: %s does not compile: %s", ext.name, src, done.stderr[-300:])
                return None
            return obj

        with ThreadPoolExecutor(max(1, jobs)) as pool:
            objs = [o for o in pool.map(compile_one, enumerate(ext.sources)) if o]
        if not objs:
            return None
        so = tmp / "link" / "module.so"
        link = ["g++", "-shared", "-fopenmp", *map(str, objs), "-o", str(so), *_torch_libs()]
        probe = _run([*link, "-Wl,--no-undefined", "-Wl,--no-demangle"], so.parent, repo, tmp)
        missing = {s for s in _UNDEFINED.findall(probe.stderr) if not _PYTHON_API.match(s)}
        if missing:
            stub = tmp / "stubs" / "missing.cpp"
            stub.parent.mkdir()
            stub.write_text(_stubs(missing))
            obj = stub.with_suffix(".o")
            stubbed = _run(["g++", "-c", "-fPIC", str(stub), "-o", str(obj)], stub.parent, repo)
            if stubbed.returncode != 0:
                return None
            link.insert(3, str(obj))
        if _run(link, so.parent, repo, tmp).returncode != 0 or not so.is_file():
            return None
        final = out_dir / f"{ext.name}.so"
        final.write_bytes(so.read_bytes())
        return final


def _snapshot_key(repo: Path, wanted: set[str] | None) -> str:
    """What decides the build: the repository's setup.py files and C/C++ sources and headers,
    the ops at hand, this code (and the script reading setup.py) and the torch it builds
    against."""
    h = hashlib.sha256(json.dumps(sorted(wanted) if wanted is not None else None).encode())
    h.update(Path(__file__).read_bytes() + Path(SETUPCAPTURE).read_bytes())
    h.update(toolchain.torch_version().encode())
    for path in sorted(repo.rglob("*")):
        kept = path.suffix in (*CXX_SOURCES, ".h", ".hpp", ".hh", ".cuh", ".inl")
        if (kept or path.name == "setup.py") and path.is_file() and ".git" not in path.parts:
            h.update(path.relative_to(repo).as_posix().encode() + path.read_bytes())
    return h.hexdigest()[:16]


def cpu_extensions(repo: Path, cache_dir: Path, wanted: set[str] | None, jobs: int = 2) -> dict:
    """Import name → built module for the extensions whose C++ names one of `wanted` (the ops at
    hand; every extension when None), at most MAX_SOURCES sources in all. Cached by snapshot:
    a rerun neither runs setup.py nor compiles."""
    wanted = {w for w in wanted if w} if wanted is not None else None
    folder = cache_dir / _snapshot_key(repo, wanted)
    index = folder / "index.json"
    if index.is_file():
        return {k: Path(v) for k, v in json.loads(index.read_text()).items()}
    exts = capture(repo)
    read = _reader(repo)  # one read per source, for the filter and the trim both
    words = None
    if wanted is not None:  # an op the CPU build binds under its twin's name counts too
        words = wanted | {w.replace(a, b) for w in wanted for a, b in TWINS if a in w}
        exts = [e for e in exts if any(_mentions(read(s), words) for s in e.sources)]
    built, total = {}, 0
    for ext in exts:
        if total + len(ext.sources) > MAX_SOURCES:
            ext = trimmed(repo, ext, words, MAX_SOURCES - total, read)
            if ext is None:
                log.info("cpu twin: left out (over %d sources in all)", MAX_SOURCES)
                continue
        total += len(ext.sources)
        so = build(repo, ext, folder, jobs)
        if so is not None:
            built[ext.name] = so
    folder.mkdir(parents=True, exist_ok=True)
    index.write_text(json.dumps({k: str(v) for k, v in built.items()}))
    return built


_MODULE_DEF = re.compile(r"\b(?:PYBIND11_MODULE|TORCH_LIBRARY(?:_FRAGMENT)?)\s*\(")


def trimmed(
    repo: Path, ext: Extension, words: set[str] | None, budget: int, read=None
) -> Extension | None:
    """`ext` cut to `budget` sources that can still run its ops on the CPU, or None: mmcv's and
    pytorch3d's one extension has a hundred C++ sources, and left out whole none of its CPU
    implementations ran behind the recorder. Kept first the sources that define the module
    (its bindings), then the CPU implementations (a `cpu` in their path) of the wanted ops,
    then the same-named source of each in another folder (mmcv's `pytorch/roi_align.cpp`,
    which dispatches to `pytorch/cpu/roi_align.cpp`); what is cut becomes raising stubs.
    `read` gives a source's text (by its path in the repository)."""
    read = read or _reader(repo)
    texts = {src: read(src) for src in ext.sources}

    def wanted(src: str) -> bool:  # `roi_align_forward` in `roi_align_forward_cpu` too
        return words is None or any(w in texts[src] for w in words)

    modules = [s for s in ext.sources if _MODULE_DEF.search(texts[s])]
    kept = list(modules)
    for cpu in [s for s in ext.sources if "cpu" in s.lower() and s not in modules]:
        stem = Path(cpu).stem.lower().removesuffix("_cpu")
        twins = [t for t in ext.sources if t not in kept and Path(t).stem.lower() == stem]
        group = [cpu, *[t for t in twins if t != cpu]]
        if wanted(cpu) and len(kept) + len(group) <= budget:
            kept += group
    if not modules or len(kept) <= len(modules):
        return None
    log.info(
        "cpu twin %s: %d of its %d sources (the module, CPU implementations and their ops)",
        ext.name, len(kept), len(ext.sources),
    )  # fmt: skip
    return Extension(ext.name, tuple(kept), ext.include_dirs, ext.defines, ext.cxx_args)


def _reader(repo: Path):
    """A source's text by its path in `repo` ("" when unreadable), each file read once."""

    @functools.cache
    def read(src: str) -> str:
        try:
            return (repo / src).read_text("utf-8", errors="replace")
        except OSError:
            return ""

    return read


def _mentions(text: str, words: set[str]) -> bool:
    return any(re.search(rf"\b{re.escape(w)}\b", text) for w in words)
