"""nvcc is the arbiter: each unit is compiled (`-c`, no GPU needed) and the verdict recorded.

Units that need torch types get the torch include dirs and the flags `cpp_extension` would
pass (toolchain.py); the others compile bare (~2 s instead of ~10 s). A launch stub for a dtype
the template does not support (half through `max`, say) is dropped and the unit compiled again,
so the record says which dtypes the kernel really allows.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from miner import toolchain
from miner.candidate import Reason, Status
from miner.unit import drop_instantiations, instantiation_lines

_ERROR = re.compile(
    r"^(?P<file>[^\n(]*)\((?P<line>\d+)\): (?:catastrophic )?error: (?P<msg>.*)$", re.MULTILINE
)
_FATAL = re.compile(r"fatal error: (.*)$|^(.*): fatal error: (.*)$", re.MULTILINE)


@dataclass
class CompileResult:
    status: Status
    reason: Reason | None
    detail: str
    text: str  # the unit as finally compiled (stubs of unsupported dtypes removed)
    compiled_types: list[str] = field(default_factory=list)
    log: str = ""
    seconds: float = 0.0


def nvcc_command(src: Path, obj: Path, needs_torch: bool) -> list[str]:
    return [
        toolchain.nvcc_path() or "nvcc",
        "-c",
        *toolchain.unit_flags(needs_torch),
        str(src),
        "-o",
        str(obj),
    ]


def cache_key(unit_hash: str, needs_torch: bool, code: str = "") -> str:
    """Key of a compile verdict: the rendered unit's hash, the compiler, its flags, the torch
    headers when it uses them, and the code that judges it (`code`)."""
    flags = " ".join(nvcc_command(Path("u.cu"), Path("u.o"), needs_torch)[1:])
    if needs_torch:
        flags += " torch=" + toolchain.torch_version()
    blob = "\0".join([toolchain.nvcc_version(), flags, code, unit_hash])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def first_error(log: str) -> tuple[Reason, str]:
    fatal = _FATAL.search(log)
    if fatal and ("No such file" in log or "cannot open source file" in log):
        return Reason.MISSING_HEADER, " ".join(log[fatal.start() :].splitlines()[0].split())[:300]
    m = _ERROR.search(log)
    if m:
        msg = m.group("msg")
        if "cannot open source file" in msg:
            return Reason.MISSING_HEADER, f"line {m.group('line')}: {msg}"[:300]
        return Reason.COMPILE_ERROR, f"line {m.group('line')}: {msg}"[:300]
    lines = [ln for ln in log.splitlines() if ln.strip()]
    return Reason.COMPILE_ERROR, (lines[0] if lines else "nvcc failed")[:300]


_MANGLED_DTYPE = (  # the first template argument of a mangled kernel name
    ("f", "float"),
    ("d", "double"),
    ("N3c104HalfE", "half"),
    ("6__half", "half"),
    ("N3c108BFloat16E", "bfloat16"),
    ("13__nv_bfloat16", "bfloat16"),
)


def _ptxas_dtypes(log: str) -> set[str]:
    """dtypes of the kernels ptxas refuses (`Entry function '_Z..IdLi64E..' uses too much
    shared data`): a double tile can need twice the shared memory of a float one."""
    found = set()
    for mangled in re.findall(r"Entry function '(_Z\w+)'", log):
        m = re.match(r"_Z(\d+)", mangled)
        rest = mangled[m.end() + int(m.group(1)) :] if m else ""
        if rest.startswith("I"):
            found |= {dtype for code, dtype in _MANGLED_DTYPE if rest[1:].startswith(code)}
    return found


def failing_dtypes(log: str, text: str) -> set[str]:
    """dtypes whose launch stub an error mentions (by namespace or by line), or whose kernel
    ptxas refuses."""
    spans = instantiation_lines(text)
    named = set(re.findall(r"kminer_inst_(\w+)", log)) | _ptxas_dtypes(log)
    lines = {int(n) for n in re.findall(r"\((\d+)\): (?:catastrophic )?error", log)}
    # "at line N" of the unit, never "(declared at line N of /usr/include/c++/12/cmath)"
    lines |= {int(n) for n in re.findall(r"at line (\d+)(?! of )", log)}
    for dtype, (a, b) in spans.items():
        if any(a <= n <= b for n in lines):
            named.add(dtype)
    return named & set(spans)


def _run_nvcc(text: str, needs_torch: bool, timeout: float) -> tuple[int | None, str, float]:
    return toolchain.compile_source(text, "unit.cu", toolchain.unit_flags(needs_torch), timeout)


def compile_unit(
    text: str, needs_torch: bool, instantiations: list[str], timeout: float = 600
) -> CompileResult:
    """Compile; on errors confined to some dtypes' stubs, drop those and compile again (as
    long as float stays and each round drops another)."""
    if toolchain.nvcc_path() is None:
        return CompileResult(Status.SKIPPED, Reason.NO_COMPILER, "nvcc not found on PATH", text)
    code, log, seconds = _run_nvcc(text, needs_torch, timeout)
    full_log = log
    types = list(instantiations)
    while code not in (0, None) and types:  # half fails in the front end, then double in ptxas
        bad = failing_dtypes(log, text) & set(types)
        if not bad or "float" in bad:
            break
        text = drop_instantiations(text, bad)
        types = [t for t in types if t not in bad]
        code, log, more = _run_nvcc(text, needs_torch, timeout)
        seconds += more
        full_log += f"\n--- retry without {', '.join(sorted(bad))} ---\n" + log
    if code is None:
        return CompileResult(Status.ERROR, Reason.COMPILE_TIMEOUT, log, text, [], full_log, seconds)
    if code != 0:
        reason, detail = first_error(log)
        return CompileResult(Status.ERROR, reason, detail, text, [], full_log, seconds)
    dropped = [t for t in instantiations if t not in types]
    reason = Reason.PARTIAL_INSTANTIATION if dropped else None
    detail = f"not for {', '.join(dropped)}" if dropped else ""
    return CompileResult(Status.OK, reason, detail, text, types, full_log, seconds)
