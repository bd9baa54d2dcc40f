"""A label: one self-contained `.cu` with the kernel, a tensor-level wrapper and its binding.

This is the dataset row's `label` and what `torch.utils.cpp_extension.load` builds. The module
definition sits behind `#ifndef KMINER_BATCH` so kminer's own build can put many labels into one
translation unit (the torch headers then cost once per batch instead of once per kernel).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import jinja2

from miner.unit import drop_instantiations, instantiation_lines
from prompts import HERE as PROMPTS
from wrappers.legacy import header_lines, modernize

# What a written (rule or LLM) host wrapper uses beyond torch/extension.h: the CUDA guard, the
# current stream and C10_CUDA_CHECK. Mined wrappers bring the repository's own includes instead.
WRAPPER_INCLUDES = ("#include <ATen/cuda/CUDAContext.h>", "#include <c10/cuda/CUDAGuard.h>")


@dataclass
class Exposed:
    name: str  # the Python-visible name
    ref: str  # C++ expression for m.def: "&ns::f" or "static_cast<...>(&f)"
    doc: str = ""


@dataclass
class Label:
    text: str
    strategy: str  # mined | rule | llm
    functions: list[Exposed] = field(default_factory=list)

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode("latin-1", errors="replace")).hexdigest()[:20]


def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(PROMPTS)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def template_hash(name: str) -> str:
    return hashlib.sha256((PROMPTS / name).read_bytes()).hexdigest()[:16]


def render_label(
    *,
    cand_id: str,
    kernel: str,
    strategy: str,
    launcher: str,
    repo_url: str,
    commit: str,
    file: str,
    line: int,
    license: str,
    includes: list[str],
    device_code: str,
    host_code: str,
    functions: list[Exposed],
) -> Label:
    """The label's text; code written for an old torch gets its compatibility block and lists
    its rewrites in the header (wrappers/legacy.py)."""
    modern = modernize(includes, [device_code, host_code])
    includes, (device_code, host_code) = modern.includes, modern.codes
    text = (
        environment()
        .get_template("label.cu.j2")
        .render(
            cand_id=cand_id,
            kernel=kernel,
            strategy=strategy,
            launcher=launcher,
            repo_url=repo_url,
            commit=commit[:12],
            file=file,
            line=line,
            license=license,
            includes=includes,
            device_code=device_code.rstrip(),
            host_code=host_code.rstrip(),
            functions=functions,
            legacy=header_lines(modern.rewrites),
        )
    )
    return Label(text, strategy, functions)


def with_wrapper_includes(includes: list[str], extra: list[str] = ()) -> list[str]:
    """The unit's includes, then what every written wrapper needs, then `extra`, once each."""
    out = list(includes)
    seen = {ln.strip() for ln in out}
    for line in (*WRAPPER_INCLUDES, *extra):
        if line.strip() not in seen and "torch/extension.h" not in line:
            seen.add(line.strip())
            out.append(line.strip())
    return out


def unit_parts(unit_text: str) -> tuple[list[str], str]:
    """(include lines, device code) of a kernel unit, without its instantiation stubs: the
    device half of a rule or LLM label."""
    text = drop_instantiations(unit_text, set(instantiation_lines(unit_text)))
    text = text.replace("// kminer: launch", "// kminer: (launch stubs removed)")
    lines = text.splitlines()
    includes: list[str] = []
    i = 0
    while i < len(lines) and (not lines[i].strip() or lines[i].startswith("//")):
        i += 1
    while (
        i < len(lines)
        and lines[i].strip()
        and (lines[i].lstrip().startswith("#") or lines[i].startswith("namespace torch {"))
    ):
        includes.append(lines[i])
        i += 1
    body = "\n".join(ln for ln in lines[i:] if not ln.startswith("// kminer: (launch"))
    return includes, body.strip("\n")
