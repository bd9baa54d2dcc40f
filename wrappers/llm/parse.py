"""Model answers → checked JSON objects.

Models wrap JSON in prose or code fences and put raw newlines inside strings; we accept that
(strict `json.loads` first, then the first ```json block, then the outermost braces, with control
characters allowed in strings), but the object itself must match the schema the prompt gave.
Every failure is an `AnswerError` with one line that goes back to the model as feedback. The
code answer also has rules a compiler cannot check (it must launch the given kernel, not a kernel
of its own; the binding is ours): `contract_problem` names the first one broken.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)```", re.S)
_PY_NAME = re.compile(r"[A-Za-z_]\w*")
_CPP_NAME = re.compile(r"(?:::)?[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*")
ROLES = ("input", "output", "inout")


class AnswerError(ValueError):
    """The answer is unusable as given; the message (one line) is fed back to the model."""


@dataclass
class Function:
    name: str  # Python-visible
    cpp: str  # the host function it binds
    doc: str = ""


@dataclass
class CodeAnswer:
    strategy: str
    host_code: str
    functions: list[Function]


def parse_object(text: str) -> dict:
    """The JSON object in an answer: strict first, then tolerant; AnswerError otherwise."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        first_error = exc
        obj = _tolerant(text)
        if obj is None:
            raise AnswerError(f"not valid JSON: {_one_line(first_error)}") from None
    if not isinstance(obj, dict):
        raise AnswerError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _tolerant(text: str) -> object | None:
    candidates = [m.group(1) for m in _FENCE.finditer(text)][:1]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for chunk in candidates:
        try:
            return json.loads(chunk, strict=False)  # strict=False: raw newlines in strings
        except ValueError:
            continue
    return None


def parse_analysis(text: str) -> dict:
    """The analysis step's object (see prompts/llm_analysis.v1.j2 for the schema)."""
    obj = parse_object(text)
    for key in ("summary", "contract"):
        _need(obj, key, str, nonempty=True)
    for key in ("pointers", "scalars"):
        _need(obj, key, list)
    _need(obj, "launch", dict)
    for i, p in enumerate(obj["pointers"]):
        where = f"pointers[{i}]"
        if not isinstance(p, dict):
            raise AnswerError(f"{where} must be an object")
        for key in ("name", "role", "shape"):
            _need(p, key, str, nonempty=True, where=where)
        if p["role"] not in ROLES:
            raise AnswerError(f"{where}.role must be one of {', '.join(ROLES)}, got {p['role']!r}")
    return obj


def parse_code(text: str) -> CodeAnswer:
    """The code step's object: strategy, host_code and the functions to bind."""
    obj = parse_object(text)
    _need(obj, "strategy", str)
    _need(obj, "host_code", str, nonempty=True)
    _need(obj, "functions", list, nonempty=True)
    functions = []
    for i, f in enumerate(obj["functions"]):
        where = f"functions[{i}]"
        if not isinstance(f, dict):
            raise AnswerError(f"{where} must be an object")
        _need(f, "name", str, nonempty=True, where=where)
        _need(f, "cpp", str, nonempty=True, where=where)
        if not _PY_NAME.fullmatch(f["name"]):
            raise AnswerError(f"{where}.name must be a Python identifier, got {f['name']!r}")
        if not _CPP_NAME.fullmatch(f["cpp"].strip()):
            raise AnswerError(f"{where}.cpp must name one C++ function, got {f['cpp']!r}")
        functions.append(Function(f["name"], f["cpp"].strip(), str(f.get("doc", ""))))
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise AnswerError("functions[].name must be unique")
    return CodeAnswer(_one_line(obj["strategy"]), obj["host_code"], functions)


def _need(obj: dict, key: str, kind: type, *, nonempty: bool = False, where: str = "") -> None:
    path = f"{where}.{key}" if where else key
    if key not in obj:
        raise AnswerError(f"missing key {path!r}")
    if not isinstance(obj[key], kind):
        raise AnswerError(f"{path} must be a {kind.__name__}, got {type(obj[key]).__name__}")
    if nonempty and not (obj[key].strip() if isinstance(obj[key], str) else obj[key]):
        raise AnswerError(f"{path} must not be empty")


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def split_includes(host_code: str) -> tuple[str, list[str]]:
    """(host code without its #include lines, those lines): includes belong above the label
    body, which kminer's batch build wraps in a namespace."""
    keep, includes = [], []
    for line in host_code.splitlines():
        (includes if line.lstrip().startswith("#include") else keep).append(line)
    return "\n".join(keep).strip("\n"), includes


def contract_problem(answer: CodeAnswer, host_code: str, kernel: str) -> str:
    """A rule the answer breaks that the compiler would not catch (or only obscurely)."""
    if "__global__" in host_code:
        return "host_code defines a __global__ kernel; launch the given kernel instead"
    if "PYBIND11_MODULE" in host_code:
        return "host_code contains PYBIND11_MODULE; the binding is generated from functions"
    if not re.search(rf"\b{re.escape(kernel)}\b", host_code):
        return f"host_code never launches {kernel}"
    for f in answer.functions:
        bare = f.cpp.split("::")[-1]
        if bare == kernel:
            return f"functions: {f.cpp} is the kernel itself; bind a host function"
        if not re.search(rf"\b{re.escape(bare)}\s*\(", host_code):
            return f"functions: {f.cpp} is not defined in host_code"
    return ""


def c_string(text: str) -> str:
    """A docstring safe inside the label's C string literal."""
    return " ".join(text.split()).replace("\\", "\\\\").replace('"', '\\"')
