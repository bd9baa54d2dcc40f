"""The dataset row's `test_code`: one standalone pytest file per candidate.

Rendered from `prompts/test_code.py.j2` so a reader of the dataset sees one shape of test
everywhere. The file carries everything it needs but the implementation under test: the
recorded inputs (torch.save, zlib, base64) and a copy of the reference source, so a row's
`test_code` runs on its own against a model's `.cu` (KMINER_IMPL). Tolerances are stated in the
file, per dtype.
"""

from __future__ import annotations

import base64
import io
import re
import zlib
from pathlib import Path
from pprint import pformat

from miner.candidate import Candidate
from testgen.cases import LARGE, CasePlan, first_float
from testgen.llm_reference import origin
from wrappers.label import environment

TEMPLATE = "test_code.py.j2"
TOLERANCES = {  # rtol, atol by the label's output dtype
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
}
_CHUNK = 96
# an atomic counter's old value kept (a slot, a position): outputs come in the atomics' order
_SLOT = re.compile(r"(?<![=!<>])=\s*atomic(?:Add|Inc|Sub)\s*\(")


def order_free_reason(label_text: str) -> str:
    """Why the label's outputs have no fixed order (empty when they do): a kernel that takes
    slots from an atomic counter writes its results in whatever order the threads arrive, so
    a test compares each output as a multiset (its sorted values) against the reference."""
    m = _SLOT.search(label_text)
    if not m:
        return ""
    line = label_text[: m.start()].rsplit("\n", 1)[-1] + label_text[m.start() :].split("\n", 1)[0]
    return f"slots taken from an atomic counter (`{' '.join(line.split())[:80]}`)"


def _chunks(data: bytes) -> list[str]:
    text = base64.b64encode(zlib.compress(data, 9)).decode()
    return [text[i : i + _CHUNK] for i in range(0, len(text), _CHUNK)] or [""]


def _describe(case: dict, plan: CasePlan, made: bool) -> str:
    base = plan.base[case["base"]]
    shapes = [list(a.shape) for a in base.args if hasattr(a, "shape")]
    call = "generated call" if made else "recorded call"
    what = f"{call} {case['base']} from {base.origin}, tensors {shapes}"
    if case.get("flag") is not None and isinstance(base.args[case["flag"]], str):
        what = f"{call} {base.rows_of} ({base.origin}) with its mode argument {case['flag']} "
        what += f"set to {base.args[case['flag']]!r} (recorded only at other kinds of shape), "
        what += f"tensors {shapes}"
    elif case.get("flag") is not None:
        what = f"{call} 0 ({base.origin}) with its boolean argument {case['flag']} flipped "
        what += f"(a mode the recorded calls never ask for), tensors {shapes}"
    elif base.filled:
        what = f"{call} {base.rows_of} ({base.origin}) with {base.filled}, tensors {shapes}"
    elif base.selects:
        what = f"{call} {base.rows_of} ({base.origin}) with its {base.derived} (the recorded "
        what += f"calls launch another), tensors {shapes}"
    elif base.derived:
        which = "" if base.rows_of is None else f" {base.rows_of}"  # (behind a forward: its own)
        what = f"{call}{which} ({base.origin}) with {base.derived} at the "
        what += f"binding `{base.call.function}`, carried down: tensors {shapes}"
    elif base.rows_of is not None and base.more:
        what = f"{base.rows} rows drawn from {call} {base.rows_of} ({base.origin}) with "
        what += f"1% noise, tensors {shapes}"
    elif base.rows_of is not None:
        what = f"the first {base.rows} rows of {call} {base.rows_of} ({base.origin}), "
        what += f"tensors {shapes}"
    if case.get("nonzero"):
        what += f", argument(s) {', '.join(map(str, case['nonzero']))} (zeros in every "
        what += "recorded call) filled with random normal values"
    if case["dtype"]:
        what += f", floating tensors as {case['dtype']}"
    if case.get("tile"):
        what += f", channels x{case['tile']['times']} (arguments {case['tile']['args']})"
    if case["edge"]:
        data = "first floating tensor"
        if case.get("edge_arg") not in (None, first_float(base.args)):
            data = f"argument {case['edge_arg']} (the first floating one holds batch indices)"
        what += {
            "zeros": f", {data} all zeros",
            "negative": f", {data} negated",
            "large": f", {data} x{LARGE:g}",
        }[case["edge"]]
    return what


def _origin(cand: Candidate, reference_text: str) -> str:
    """Who made a PyTorch reference: a model (its file says so, testgen.llm_reference), or
    kminer from the repository's own function, unchanged, with an adapter from its pairing."""
    made = re.search(r"^# (adapted by .*? from the repository's .*?)\.$", reference_text, re.M)
    if made or cand.reference.kind != "python":
        return made.group(1) if made else origin(cand.reference)
    ref = cand.reference
    return f"of the repository, `{ref.function}` ({ref.file}), adapted by kminer to the binding"


def render_test(
    cand: Candidate,
    function: str,
    plan: CasePlan,
    reference_text: str,
    order_free: str = "",
    made_by: str = "",
    sorted_last: str = "",
    others: tuple[list[int], list[int]] = ([], []),
) -> str:
    """The test file; `made_by` says who made the inputs when the repository's tests never call
    the op ('' for recorded calls); `sorted_last`, why outputs are compared sorted along their
    last dimension (testgen/caller_sorts.py); `others`, the returned outputs and arguments only
    the label's other kernels write (testgen/kernel_outputs.py)."""
    import torch

    buf = io.BytesIO()
    torch.save([b.args for b in plan.base], buf)
    cases = [{**c, "description": _describe(c, plan, bool(made_by))} for c in plan.cases]
    k = cand.kernel
    return (
        environment()
        .get_template(TEMPLATE)
        .render(
            kernel=k.name,
            repo=cand.provenance.repo_url,
            commit=cand.provenance.commit,
            path=k.file,
            line_start=k.start_line,
            line_end=k.end_line,
            reference_function=cand.reference.function,
            reference_suffix=Path(cand.reference.path).suffix or ".cpp",
            reference_origin=_origin(cand, reference_text),
            reference_file=cand.reference.file,
            function=function,
            other_kernels_returned=sorted(others[0]),
            other_kernels_args=sorted(others[1]),
            cases=cases,
            num_shapes=plan.shapes,
            origins=sorted({b.origin for b in plan.base}),
            made_by=made_by,
            large=f"{LARGE:g}",
            tolerances={d: TOLERANCES[d] for d in ("float32", "float64", "float16", "bfloat16")},
            tolerances_py=pformat(TOLERANCES, width=92),
            cases_py=pformat(
                [
                    {k: c.get(k) for k in ("id", "base", "dtype", "edge", "tile", "flag", "made")}
                    | ({"was": c["was"]} if c.get("flag") is not None else {})
                    | ({"edge_arg": c["edge_arg"]} if c.get("edge_arg") is not None else {})
                    | ({"nonzero": c["nonzero"]} if c.get("nonzero") else {})
                    for c in plan.cases
                ],
                width=92,
                sort_dicts=False,
            ),
            inputs_b64=_chunks(buf.getvalue()),
            # the reference file's bytes, whatever their encoding (read as latin-1, written back)
            reference_b64=_chunks(reference_text.encode("latin-1", errors="replace")),
            test_name=re.sub(r"\W", "_", k.name),
            order_free=order_free,
            sorted_last=sorted_last,
        )
    )
