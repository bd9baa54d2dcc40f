"""Which files of a repository are CUDA sources worth parsing, and why the others are not.

Backend mirrors (MUSA, Cambricon, hipified copies) repeat every kernel under another name, so
counting them would double a repository's kernels; they are skipped by extension and folder and
each skip is counted with its reason.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from miner.candidate import FileSkip
from miner.configured import configured_headers

SOURCE_SUFFIXES = (
    ".cu",
    ".cuh",
    ".cu.h",
    ".h",
    ".hpp",
    ".hh",
    ".hxx",
    ".inl",
    ".cpp",
    ".cc",
    ".cxx",
    ".c",
    ".cuinc",
)
BACKEND_SUFFIXES = (".mu", ".muh", ".mlu", ".hip", ".cl", ".metal", ".mm", ".dp.cpp", ".sycl")
# other accelerators' backends, and framework bindings other than PyTorch (mmcv's parrots/)
BACKEND_DIRS = frozenset(
    "musa mlu npu mps hip rocm ascend cambricon xpu sycl metal dipu parrots".split()
)
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".tox", ".venv"})
HIP_COPY = re.compile(r"(^|[_.])hip([_.]|$)|hipify", re.IGNORECASE)
MAX_FILE_BYTES = 2 * 1024 * 1024
# a file only a CUDA build compiles: a .cu/.cuh, or any file under a cuda/ or gpu/ folder; a
# label links its GPU side from these, a reference its CPU side from the others
GPU_SOURCE = re.compile(r"\.cuh?$|(^|/)(cuda|gpu)/")


@dataclass
class SourceFile:
    rel: str  # posix path relative to the root
    path: Path
    data: bytes
    utf8_ok: bool = True


@dataclass
class Inventory:
    files: list[SourceFile] = field(default_factory=list)
    skipped: list[tuple[str, FileSkip]] = field(default_factory=list)
    invalid_utf8: list[str] = field(default_factory=list)

    def skip_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, reason in self.skipped:
            counts[reason.value] = counts.get(reason.value, 0) + 1
        return counts


def _skip_reason_by_name(rel: str) -> FileSkip | None:
    lower = rel.lower()
    if lower.endswith(BACKEND_SUFFIXES):
        return FileSkip.NON_CUDA_BACKEND
    parts = lower.split("/")
    if any(p in BACKEND_DIRS for p in parts[:-1]):
        return FileSkip.BACKEND_DIR
    stem = parts[-1].split(".")[0]
    if HIP_COPY.search(stem):
        return FileSkip.HIP_COPY
    return None


def is_source_name(name: str) -> bool:
    return name.lower().endswith(SOURCE_SUFFIXES)


def scan_tree(root: Path, max_bytes: int = MAX_FILE_BYTES) -> Inventory:
    """Read every candidate source under `root` once, deciding per file whether to mine it."""
    inv = Inventory()
    root = root.resolve()
    templates, cmake_files = [], []  # what a build configures (miner.configured)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            lower = name.lower()
            if lower.endswith(".in") and is_source_name(lower[:-3]) and not path.is_symlink():
                templates.append((rel, path))
            elif lower == "cmakelists.txt" or lower.endswith(".cmake"):
                cmake_files.append(path)
            if not (is_source_name(lower) or lower.endswith(BACKEND_SUFFIXES)):
                continue
            reason = _skip_reason_by_name(rel)
            if reason is None:
                reason = _check_file(path, root, max_bytes)
            if reason is not None:
                inv.skipped.append((rel, reason))
                continue
            try:
                data = path.read_bytes()
            except OSError:
                inv.skipped.append((rel, FileSkip.UNREADABLE))
                continue
            if b"\0" in data[:8192]:
                inv.skipped.append((rel, FileSkip.BINARY))
                continue
            try:
                data.decode("utf-8")
                ok = True
            except UnicodeDecodeError:
                ok = False
                inv.invalid_utf8.append(rel)
            inv.files.append(SourceFile(rel, path, data, ok))
    present = {f.rel for f in inv.files} | {rel for rel, _ in inv.skipped}
    templates = [(rel, path) for rel, path in templates if rel[:-3] not in present]
    if templates:
        cmake_files.sort(key=lambda p: (len(p.relative_to(root).parts), str(p)))
        made = configured_headers(templates, [p for p in cmake_files if not p.is_symlink()])
        for rel, path in templates:  # as generated: its template's path, the build's text
            inv.files.append(SourceFile(rel[:-3], path, made[rel[:-3]], True))
    return inv


def _check_file(path: Path, root: Path, max_bytes: int) -> FileSkip | None:
    if path.is_symlink():
        try:
            target = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return FileSkip.SYMLINK_OUTSIDE
        if not target.is_relative_to(root):
            return FileSkip.SYMLINK_OUTSIDE
        if not target.is_file():
            return FileSkip.UNREADABLE
    try:
        size = path.stat().st_size
    except OSError:
        return FileSkip.UNREADABLE
    if size > max_bytes:
        return FileSkip.TOO_LARGE
    return None
