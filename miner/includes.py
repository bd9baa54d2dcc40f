"""Resolve `#include` the way the compiler would, without the repository's build files.

Quote includes look beside the including file first; then (quote or angle) any repository file
whose path ends with the include path, preferring the one nearest to the includer (what the
build's -I flags almost always mean). Angle includes of system, CUDA and torch headers are left
to the compiler.
"""

from __future__ import annotations

import functools
import posixpath
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

from miner.toolchain import cuda_library_dirs, header_library_dirs, math_shim_dirs

TORCH_PREFIXES = ("ATen/", "c10/", "torch/", "THC/", "caffe2/", "pybind11/")
TORCH_HEADERS = {"Python.h"}
CXX_STD = set(
    """
algorithm any array atomic bitset cassert cctype cerrno cfloat chrono cinttypes climits
clocale cmath complex condition_variable cstdarg cstddef cstdint cstdio cstdlib cstring
ctime cuchar cwchar deque exception execution filesystem forward_list fstream functional
future initializer_list iomanip ios iosfwd iostream istream iterator limits list locale
map memory mutex new numeric optional ostream queue random ratio regex set shared_mutex
sstream stack stdexcept streambuf string string_view system_error thread tuple type_traits
typeindex typeinfo unordered_map unordered_set utility valarray variant vector bit numbers
span concepts assert.h ctype.h errno.h float.h inttypes.h limits.h math.h stdarg.h
stddef.h stdint.h stdio.h stdlib.h string.h time.h wchar.h stdbool.h unistd.h sys/time.h
sys/types.h
""".split()
)


@functools.cache
def system_include_dirs() -> tuple[Path, ...]:
    """Where nvcc and g++ look for headers on this machine (probed once)."""
    dirs: list[Path] = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        cuda_inc = Path(nvcc).resolve().parent.parent / "include"
        dirs += [cuda_inc, cuda_inc / "cccl"]
    for cand in (Path("/usr/local/cuda/include"), Path("/usr/local/cuda/include/cccl")):
        if cand not in dirs:
            dirs.append(cand)
    try:
        probe = subprocess.run(
            ["g++", "-xc++", "-E", "-Wp,-v", "-"],
            input="",
            text=True,
            capture_output=True,
            timeout=20,
        )
        for line in probe.stderr.splitlines():
            if line.startswith(" /"):
                dirs.append(Path(line.strip()))
    except (OSError, subprocess.SubprocessError):
        pass
    dirs += [Path(d) for d in (*header_library_dirs(), *cuda_library_dirs(), *math_shim_dirs())]
    return tuple(d for d in dirs if d.is_dir())


MAX_INCLUDE_DEPTH = 64  # deeper chains are refused (include_too_deep), never cut silently


def include_problem(header: str, includer: str) -> str:
    """Why an `#include` of `header` from the repository file `includer` may not reach a
    compiler ('' when it may): an absolute path, or a path that climbs out of the checkout (quote
    includes resolve beside their file) or out of the include dirs (angle includes). Either would
    make nvcc read a file of this machine, and its text would land in logs and caches."""
    path = header.strip()
    if path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":"):
        return f"#include of an absolute path {path!r} in {includer}"
    if ".." not in path.replace("\\", "/").split("/"):
        return ""
    beside = posixpath.normpath(posixpath.join(posixpath.dirname(includer), path))
    if beside.startswith("../") or beside == "..":
        return f"#include {path!r} in {includer} leaves the checkout"
    return ""


def _confined(header: str) -> bool:
    """A header name that stays inside the include dirs it is looked up in."""
    parts = header.strip().replace("\\", "/").split("/")
    return bool(header.strip()) and not header.strip().startswith("/") and ".." not in parts


@functools.cache
def exists_on_system(header: str) -> bool:
    if not _confined(header):
        return False
    return header in CXX_STD or any((d / header).is_file() for d in system_include_dirs())


def is_torch_header(header: str) -> bool:
    return _confined(header) and (header.startswith(TORCH_PREFIXES) or header in TORCH_HEADERS)


class IncludeResolver:
    def __init__(self, files: list[str]) -> None:
        self.files = set(files)
        self.by_base: dict[str, list[str]] = defaultdict(list)
        for f in files:
            self.by_base[posixpath.basename(f)].append(f)
        self._cache: dict[tuple[str, str, bool], str | None] = {}

    def resolve(self, includer: str, path: str, angle: bool) -> str | None:
        key = (posixpath.dirname(includer), path, angle)
        if key not in self._cache:
            self._cache[key] = self._resolve(includer, path, angle)
        return self._cache[key]

    def _resolve(self, includer: str, path: str, angle: bool) -> str | None:
        path = path.strip()
        if not angle:
            local = posixpath.normpath(posixpath.join(posixpath.dirname(includer), path))
            if local in self.files:
                return local
        if angle and (is_torch_header(path) or exists_on_system(path)):
            return None
        tail = posixpath.normpath(path)
        while tail.startswith("../"):
            tail = tail[3:]
        cands = [
            f
            for f in self.by_base.get(posixpath.basename(tail), ())
            if f == tail or f.endswith("/" + tail)
        ]
        if not cands:
            return None
        here = posixpath.dirname(includer).split("/")

        def closeness(f: str) -> tuple[int, int]:
            parts = posixpath.dirname(f).split("/")
            common = 0
            for a, b in zip(here, parts, strict=False):
                if a != b:
                    break
                common += 1
            return (common, -len(parts))

        return max(cands, key=closeness)
