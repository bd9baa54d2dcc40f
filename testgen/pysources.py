"""The repository's Python files, read and parsed once per process.

Several stages read the same modules: the recorder's reach (which public names wrap an op),
the sort finder (testgen/caller_sorts.py), a Python reference's signature and the vendoring of
its helpers (testgen/vendor.py). mmcv has hundreds of Python files; each parse of all of them
costs seconds, so the text and the tree of a file are kept, keyed by its path, size and time
of change (an edited file is read again). Trees are shared: a caller reads them, never edits.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from testgen.standalone import inline_refs


def text(path: Path) -> str | None:
    """The file's text (undecodable bytes replaced); None when it cannot be read."""
    key = _key(path)
    return None if key is None else _text(*key)


def tree(path: Path) -> ast.Module | None:
    """The file's syntax tree; None when it cannot be read or is not Python 3."""
    key = _key(path)
    return None if key is None else _tree(*key)


def lifted(path: Path) -> list[ast.FunctionDef]:
    """A test file's expected values computed in line, as the functions the recorder lifts
    them into (testgen/standalone/inline_refs.py); none for other files."""
    key = _key(path)
    return [] if key is None or not inline_refs.is_test_file(path.name) else _lifted(*key)


@functools.lru_cache(maxsize=1024)
def _lifted(path: str, size: int, mtime: int) -> list[ast.FunctionDef]:
    source = _text(path, size, mtime)
    tree = None if source is None else _parse(source)
    return [] if tree is None else inline_refs.lifted_functions(tree)


def _key(path: Path) -> tuple[str, int, int] | None:
    """(path, size, time of change): a file edited since is read again."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return str(path), stat.st_size, stat.st_mtime_ns


def parse(source: str) -> ast.Module | None:
    """A tree of text at hand (None when it is not Python 3), from the same cache."""
    return _parse(source)


@functools.lru_cache(maxsize=4096)
def _text(path: str, size: int, mtime: int) -> str | None:
    try:
        return Path(path).read_text("utf-8", errors="replace")
    except OSError:
        return None


@functools.lru_cache(maxsize=4096)
def _tree(path: str, size: int, mtime: int) -> ast.Module | None:
    source = _text(path, size, mtime)
    return None if source is None else _parse(source)


@functools.lru_cache(maxsize=1024)
def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None
