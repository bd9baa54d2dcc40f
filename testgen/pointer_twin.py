"""A label whose exposed function is kminer's adapter over a launcher that takes raw device
pointers (wrappers.adapter): the repository never defines the adapter, so the search for the CPU
side starts at the launcher, and a CPU twin that takes the same pointers and numbers is called
through the label's own adapter (the same dtype dispatch and casts).

SparseConvNet's `cuda_MaxPooling_ForwardPass(T *in, T *out, ..., RuleBook)` is such a launcher;
its CPU op functions take a `Metadata&` the launcher's arguments cannot rebuild, which is now
the reason its labels give, where they said the adapter had no definition.
"""

from __future__ import annotations

import re
from typing import Protocol

from miner.candidate import Candidate
from miner.textprep import blank_comments_and_strings
from wrappers.adapter import adapt
from wrappers.signature import Signature, parse_signature


class RepoRefs(Protocol):
    """What is read of testgen.reference.RepoRefs (which imports this module)."""

    defs: dict

    def definition(self, name: str, host_side: bool = False): ...

    def signature(self, item) -> Signature | None: ...


def pointer_adapter(
    cand: Candidate, refs: RepoRefs, label_text: str, launcher_item=None
) -> tuple | str | None:
    """(the launcher's definition, the adapter's signature, its text) when the label's exposed
    function is kminer's adapter over a launcher that takes device pointers (wrappers.adapter):
    the repository's code starts at the launcher, whose parameters the adapter keeps by name.
    None when the label exposes no adapter; a reason when its parameters are not the
    launcher's (an object built from its constructor's arguments); the device buffers the
    launcher stages host data in are the adapter's own (wrappers.staging). `launcher_item`: the
    launcher's definition where it is no host function (a kernel adapted alone)."""
    exposed, launcher = (cand.wrapper.functions or [""])[0], cand.wrapper.launcher
    if not (exposed and launcher and label_text) or exposed in refs.defs:
        return None
    item = launcher_item or refs.definition(launcher)
    code = blank_comments_and_strings(label_text)
    at = re.search(rf"^[^\n;{{}}]*\b{re.escape(exposed)}\s*\(", code, re.MULTILINE)
    sig = parse_signature(code[at.start() :], exposed) if at else None
    l_sig = refs.signature(item) if item else None
    if sig is None or l_sig is None:
        return None
    mine, theirs = [n for _, n in sig.params], iter(n for _, n in l_sig.params)
    if not all(n in theirs for n in mine):  # not in order, the buffers it stages left out
        return f"{exposed} builds objects {launcher} takes: no reference takes its arguments"
    end = _matching_brace(label_text, label_text.index("{", at.end()))
    return item, sig, label_text[at.start() : end + 1]


def _matching_brace(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return len(text) - 1


def pointer_reference(
    adapter: str, exposed: str, launcher: str, cpu: str, tensors: bool = False
) -> tuple[str, str]:
    """(C++ code, what `m.def("reference", ...)` binds): the label's own adapter, calling the
    CPU twin where it called the launcher. The twin takes the same pointers and numbers, so the
    dtype dispatch and the casts are the label's; with `tensors`, it takes the tensors whose
    data the pointers are (a helper that rebuilds the CPU op's tensors, testgen.op_loop)."""
    body = adapter.replace(exposed, "reference", 1)
    body = re.sub(rf"(?<![\w:]){re.escape(launcher)}(?=\s*[<(])", cpu, body)
    if tensors:
        body = re.sub(r"\b(\w+)\s*\.\s*data_ptr\s*<[^<>()]*>\s*\(\s*\)", r"\1", body)
    code = (
        f"// kminer: {cpu} takes the pointers {launcher} takes; the label's adapter calls it\n"
        f"namespace kminer_ref {{\nusing at::Tensor;\n{body}\n}}  // namespace kminer_ref\n"
    )
    return code, "&kminer_ref::reference"


def twin_reference(cpu: Signature, qualified: str, aliases: str = "") -> tuple[str, str] | None:
    """(C++ code, what `m.def("reference", ...)` binds) for a kernel's CPU twin
    (wrappers.kernel_twin): an adapter of its own over the same tensors, numbers and flags. A
    twin of `float *` rejects a double tensor (`data_ptr<float>`): that case has no reference.
    None when the twin takes what no tensor, number or flag gives. `aliases`: code declaring
    the types its parameters are spelled in (`using Int = int32_t;`)."""
    plain = Signature(cpu.name, qualified, cpu.returns, cpu.params, cpu.template)
    made = adapt(plain, aliases, ("float", "double"))
    if made is None:
        return None
    sig, text = made
    body = text.replace(sig.name, "reference", 1)
    code = (
        f"// kminer: {cpu.name} takes the kernel's parameters; an adapter calls it\n"
        f"namespace kminer_ref {{\nusing at::Tensor;\n{body}\n}}  // namespace kminer_ref\n"
    )
    return code, "&kminer_ref::reference"
