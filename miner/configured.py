"""Headers a repository's build generates from a template (CMake's `configure_file`), made here
as its CMake files' defaults would make them.

pyg-lib's sources include `pyg_lib/csrc/config.h`, which exists only after CMake turns
`config.h.in` (`#define WITH_MKL_BLAS() @WITH_MKL_BLAS@`) into it with `set(WITH_MKL_BLAS 0)`;
without it a CPU implementation's `#if WITH_MKL_BLAS()` does not even preprocess, and no test
can use it. Nothing is run: `@VAR@` and `${VAR}` take the first literal `set(VAR value)` or
`option(VAR "..." value)` of the repository's CMake files (an optional feature stays off where
nothing sets it: 0), `#cmakedefine VAR` defines VAR only where that value is on, and
`#cmakedefine01 VAR` writes 1 or 0.
"""

from __future__ import annotations

import re
from pathlib import Path

_SET = re.compile(r"^\s*set\s*\(\s*(\w+)\s+\"?([\w.+-]*)\"?\s*\)", re.MULTILINE | re.IGNORECASE)
_OPTION = re.compile(
    r"^\s*option\s*\(\s*(\w+)\s+\"[^\"]*\"\s+(\w+)\s*\)", re.MULTILINE | re.IGNORECASE
)
_CMAKEDEFINE = re.compile(r"^([ \t]*)#[ \t]*cmakedefine(01)?[ \t]+(\w+)([^\n]*)$", re.MULTILINE)
_VAR = re.compile(r"@(\w+)@|\$\{(\w+)\}")
_OFF = frozenset({"", "0", "off", "false", "no", "n", "ignore", "notfound"})
MAX_CMAKE_BYTES = 1 << 20


def cmake_values(cmake_texts: list[str]) -> dict[str, str]:
    """The first literal value each variable is set to (or each option defaults to)."""
    values: dict[str, str] = {}
    for text in cmake_texts:
        for pattern in (_SET, _OPTION):
            for m in pattern.finditer(text):
                values.setdefault(m.group(1), m.group(2))
    return values


def _on(value: str | None) -> bool:
    return value is not None and value.lower() not in _OFF and not value.endswith("-NOTFOUND")


def configure(template: str, values: dict[str, str]) -> str:
    """The header CMake would write from `template` with `values`."""

    def define(m: re.Match) -> str:
        indent, zero_one, name, rest = m.groups()
        on = _on(values.get(name))
        if zero_one:
            return f"{indent}#define {name} {int(on)}"
        return f"{indent}#define {name}{rest}" if on else f"{indent}/* #undef {name} */"

    text = _CMAKEDEFINE.sub(define, template)
    return _VAR.sub(lambda m: values.get(m.group(1) or m.group(2)) or "0", text)


def configured_headers(templates: list[tuple[str, Path]], cmake_files: list[Path]) -> dict:
    """{rel of the header: its bytes} for each template (rel of `X.in`, its path), with the
    values of `cmake_files` (the shallowest first: the top-level defaults win)."""
    values = cmake_values(
        [p.read_text(errors="replace") for p in cmake_files if p.stat().st_size <= MAX_CMAKE_BYTES]
    )
    return {
        rel[: -len(".in")]: configure(path.read_text(errors="replace"), values).encode()
        for rel, path in templates
    }
