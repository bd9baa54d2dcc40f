"""The two instructions of a dataset row, written by rule from what kminer knows of a candidate.

`instruction_complete` is the full task: the kernel to write and its parameters with their
roles, template parameters and dtypes, the repository's launch configuration, the host function
the test calls and its signature, the tensor shapes of a real case, the tolerances, and what the
kernel computes (a model's description when one was made, else the repository's own comment or
docstring). `instruction` is cut from it by fixed rules and no model, as BigCodeBench derives
its Instruct prompts from its Complete ones, so an edit to the complete text carries over. A
curator's edit of either wins (`effective`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from curation import ops
from miner.candidate import Candidate, StageName
from testgen.made_inputs import label_signature
from testgen.testcode import TOLERANCES

GIVEN = "## Given code"  # the section a derived instruction always keeps
_POINTER = re.compile(r"\*")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?(?:\*/|\Z)", re.S)  # an unclosed /* ends it: linear
_ARITHMETIC = re.compile(
    r"(unsigned |signed )?(bool|char|short|int|long|long long|float|double|half|__half|"
    r"size_t|u?int(8|16|32|64)_t|at::Half|c10::Half|scalar_t|index_t|int64|int32)"
)


@dataclass
class Description:
    text: str
    source: str  # llm | comment | docstring | ""


@dataclass
class Instructions:
    instruction: str
    instruction_complete: str
    description_source: str
    edited: bool  # a curator's text, not the generated one


def function_of(cand: Candidate) -> str:
    """The host function the test calls (the one the label binds)."""
    return (cand.wrapper.functions or [cand.wrapper.launcher or cand.kernel.name])[0]


def _role(param_type: str, templates: set[str]) -> str:
    if _POINTER.search(param_type):
        return "input, read only" if re.search(r"\bconst\b", param_type) else "output (written)"
    base = " ".join(re.sub(r"\bconst\b", " ", param_type).split())
    if base in templates:
        return "template-typed scalar"
    return "scalar" if _ARITHMETIC.fullmatch(base) else "passed by value"


def _kernel_head(cand: Candidate) -> str:
    """The kernel's declaration as written (template header included), without its body."""
    head = _COMMENT.sub(" ", cand.kernel.source).split("{", 1)[0]
    return " ".join(head.split())


def _shapes(cand: Candidate, tensor_names: list[str]) -> str:
    verify = cand.stage(StageName.VERIFY)
    cases = (verify.metrics.get("cases") or []) if verify else []
    if not cases or not tensor_names:
        return ""
    shapes = cases[0].get("shape") or []
    if len(shapes) != len(tensor_names):
        return ""
    return "; ".join(f"`{n}` {list(s)}" for n, s in zip(tensor_names, shapes, strict=True))


def complete_text(cand: Candidate, label_text: str, description: Description) -> str:
    """The structured task, in markdown sections that `derive_instruction` reads back."""
    k, function = cand.kernel, function_of(cand)
    templates = {tp.name for tp in k.template_params if tp.kind == "type"}
    others = [n for n in ops.kernels(label_text) if n != k.name] if label_text else []
    given = ops.with_kernel_elided(label_text, k.name) if others else None
    if given:  # one step of a multi-kernel op: the rest of the file is given
        title = (
            f"Write the body of the CUDA kernel `{k.name}`. The rest of the .cu file is given "
            f"below: the host function `{function}` and the other kernels it launches "
            f"({', '.join(f'`{n}`' for n in others)}). Return the whole file, with `{k.name}` "
            "written, as one .cu file that torch.utils.cpp_extension builds."
        )
    else:
        title = (
            f"Write the CUDA kernel `{k.name}` and the host function `{function}` that launches "
            "it, as one .cu file that torch.utils.cpp_extension builds."
        )
    lines = [
        title,
        "",
        "## What it computes",
        description.text.strip()
        or _behind_forward(cand)
        or "The repository gives no description; the test's CPU reference defines the result.",
        "",
        "## Kernel",
        f"`{_kernel_head(cand)}`",
    ]
    types = cand.tests.dtypes or cand.unit.compiled_types  # what the test dispatches to
    for tp in k.template_params:
        what = (
            f"type parameter, instantiated for {', '.join(types)}"
            if (tp.kind == "type" and types)
            else f"{tp.kind} parameter"
        )
        lines.append(f"- `{tp.name}` ({what})")
    for p in k.params:
        lines.append(f"- `{p.name}` (`{p.type}`): {_role(p.type, templates)}")
    chevrons = [s for s in cand.launches if s.kind == "chevron" and s.config]
    if chevrons:
        site = chevrons[0]
        lines.append(
            f"Launched in the repository as `<<<{site.config}>>>`"
            + (f" from `{site.caller}`." if site.caller else ".")
        )
    lines += _binding_and_constraints(cand, function, label_text)
    if given:
        lines += ["", GIVEN, "```cuda", given.rstrip(), "```"]
    return "\n".join(lines).rstrip() + "\n"


def op_complete_text(cand: Candidate, label_text: str, op: str) -> str:
    """The op-level task (curation.ops): the host function and every kernel it launches,
    judged only by what the op returns. `cand` is the op's representative candidate."""
    function, heads = function_of(cand), ops.heads(label_text)
    ref = cand.reference
    what = (
        f"The op `{op}`. The test compares it with the repository's own "
        + (
            "CPU implementation"
            if ref.kind == "cpp"
            else "PyTorch reference"
            if ref.kind == "python"
            else "reference"
        )
        + (f" `{ref.function}`" if ref.function else "")
        + ", which defines the result."
    )
    lines = [
        f"Write the host function `{function}` and the CUDA kernels it launches, as one .cu "
        "file that torch.utils.cpp_extension builds. The repository's implementation launches "
        f"{len(heads)} kernels; yours may split the work differently.",
        "",
        "## What it computes",
        what,
        "",
        "## Kernels",
        "The repository's kernels, for orientation:",
        *(f"- `{h}`" for h in heads.values()),
    ]
    lines += _binding_and_constraints(cand, function, label_text)
    return "\n".join(lines).rstrip() + "\n"


def _behind_forward(cand: Candidate) -> str:
    """What a glue behind its forward computes (wrappers.through_forward), as its reference
    checks it: autograd of the forward."""
    info = cand.wrapper.op_map.get("through_forward")
    if not info:
        return ""
    grads = ", ".join(f"`kminer_grad_{j}` of its output {j}" for j in info["out_grads"])
    return (
        f"The backward of `{info['forward']}`: `{info['function']}` runs the forward on its "
        f"first arguments, then the backward on the forward's results, as the autograd Function "
        f"in `{info['flow_file']}` does, and returns the gradients of the forward's inputs given "
        f"the gradients {grads}. The test checks them against autograd through the "
        "repository's PyTorch forward."
    )


def _binding_and_constraints(cand: Candidate, function: str, label_text: str) -> list[str]:
    lines: list[str] = []
    sig = label_signature(function, label_text) if label_text else None
    lines += ["", "## Binding"]
    if sig is not None:
        params = ", ".join(f"{t} {n}".strip() for t, n in sig.params)
        lines.append(
            f"`{sig.returns} {function}({params})`, bound with "
            f'`m.def("{function}", ...)` in `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)`.'
        )
        tensors = [n for t, n in sig.params if "Tensor" in t]
        shapes = _shapes(cand, tensors)
        if shapes:
            lines.append(f"Tensor shapes in the first test case: {shapes}.")
    else:
        lines.append(
            f'`{function}`, bound with `m.def("{function}", ...)` in '
            "`PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)`."
        )
    lines += ["", "## Constraints"]
    if cand.tests.dtypes:
        lines.append(f"- dtypes: {', '.join(cand.tests.dtypes)}")
    lines.append(
        "- Tensors are contiguous CUDA tensors; the kernel writes its outputs into the "
        "tensors passed in (or returns them), as the repository's function does."
    )
    tols = [
        f"{d} rtol={TOLERANCES[d][0]} atol={TOLERANCES[d][1]}"
        for d in cand.tests.dtypes
        if d in TOLERANCES
    ]
    if tols:
        lines.append(
            f"- Floating outputs must match the CPU reference within {'; '.join(tols)} "
            "(atol scaled by the output's largest value); integer outputs exactly."
        )
    if cand.tests.num_cases:
        lines.append(
            f"- The test runs {cand.tests.num_cases} cases over {cand.tests.num_shapes} "
            "shapes, including sizes that are not a multiple of the block size."
        )
    return lines


def _sections(text: str) -> tuple[str, dict[str, str]]:
    parts = re.split(r"^## +(.+?)\s*$", text, flags=re.M)
    return parts[0].strip(), {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    m = re.match(r"(.+?[.!?])(\s|$)", flat)
    return (m.group(1) if m else flat)[:400]


def derive_instruction(complete: str) -> str:
    """The short, natural instruction: the task line, the first sentence of the description,
    the signature to expose and the dtypes; any free text falls back to its first paragraph."""
    title, sections = _sections(complete)
    if not title or not sections:
        return complete.strip().split("\n\n", 1)[0].strip()
    out = [title]
    what = sections.get("What it computes", "")
    if what and not what.startswith("The repository gives no description"):
        out.append(
            "It " + _lower_first(_first_sentence(what))
            if _starts_verb(what)
            else _first_sentence(what)
        )
    binding = re.match(r"`([^`]+\([^`]*\))`", sections.get("Binding", ""))
    if binding:
        out.append(f"Expose `{binding.group(1)}` with pybind11.")
    dtypes = re.search(r"^- dtypes: (.+)$", sections.get("Constraints", ""), re.M)
    if dtypes:
        out.append(f"It must support {dtypes.group(1)}.")
    short = " ".join(out)
    given = sections.get(GIVEN.removeprefix("## "))
    return f"{short}\n\n{given}" if given else short


def _starts_verb(text: str) -> bool:
    word = text.split(maxsplit=1)[0] if text.split() else ""
    return word.lower().endswith("s") and word[:1].isupper() and not word.lower().endswith("ss")


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def effective(
    cand: Candidate, review: dict, label_text: str, description: Description
) -> Instructions:
    """The row's instructions: a curator's edit of either wins; an unedited `instruction` is
    derived from the (possibly edited) complete one."""
    complete = review.get("instruction_complete") or complete_text(cand, label_text, description)
    short = review.get("instruction") or derive_instruction(complete)
    edited = bool(review.get("instruction_complete") or review.get("instruction"))
    return Instructions(short, complete, description.source, edited)


def read_label(workdir: Path, cand: Candidate) -> str:
    path = workdir / cand.wrapper.label_path if cand.wrapper.label_path else None
    return path.read_text(encoding="utf-8", errors="replace") if path and path.is_file() else ""
