"""Test inputs written by a model, for a kernel that the repository's own tests never call.

Inputs mined from the repository's tests come first (testgen/inputs.py), then the rule for plain
element-wise wrappers (testgen/made_inputs.py); past those only something that reads the kernel
can say what a valid call is (which tensor is indexed by which, what range an index has). The
model writes `make_calls`, which runs in the sandbox (callcheck.py) and must return calls that can
be a test's inputs; every answer is an attempt row (step `inputs`) and a refused one goes back to
the model with the reason. The calls then feed the same case plan as mined ones (fewer rows,
edge values, dtypes), and the reference check in the test drops any call the reference rejects.
"""

from __future__ import annotations

import json
import re

from miner.candidate import Candidate
from testgen.sandbox import run_checker
from testgen.standalone import CALLCHECK
from testgen.standalone.callcheck import MAX_CALLS, MAX_ELEMENTS, MIN_CALLS, MIN_SHAPES
from wrappers.llm import turns
from wrappers.llm.client import LLMClient

TEMPLATE = "llm_inputs.v1.j2"
CHECK_TIMEOUT_S = 120.0
MAX_REFERENCE = 6000  # characters of the reference shown to the model
_INTEGRAL = re.compile(
    r"\b(?:int|long|short|unsigned|signed|size_t|u?int\d+_t|char|uint|ushort|ulong)\b"
)


def param_kind(type_text: str) -> str:
    """What a C++ parameter takes from Python: tensor, tensor?, int, float, bool, ints, intlists
    (a list of lists: groups of indices), floats, str, or any (something pybind converts that
    we do not check)."""
    t = " ".join(re.sub(r"\b(?:const|volatile)\b|&", " ", type_text).split())
    core = t.split("::")[-1]
    if re.fullmatch(r"(?:\w+::)*Tensor", t):
        return "tensor"
    if re.search(r"optional<\s*(?:\w+::)*Tensor\s*>", t):
        return "tensor?"
    if re.search(r"vector<\s*(?:std::)?vector<.*(?:int|long)", t):
        return "intlists"
    if re.search(r"(?:vector|ArrayRef)<\s*(?:float|double)\s*>", t):
        return "floats"
    if re.search(r"vector<.*(?:int|long)|IntArrayRef", t):
        return "ints"
    if core == "bool":
        return "bool"
    if core in ("float", "double"):
        return "float"
    if _INTEGRAL.search(t) and "*" not in t and "<" not in t:
        return "int"
    if core in ("string", "std::string"):
        return "str"
    return "any"


def run_calls(code: str, spec: list[dict]) -> list | str:
    """The calls `make_calls` returns (checked in the sandbox), or the problem with them."""
    files = {"calls.py": code, "spec.json": json.dumps(spec)}
    done = run_checker(CALLCHECK, files, "running `make_calls`", CHECK_TIMEOUT_S, ("calls.pt",))
    return done if isinstance(done, str) else done["calls.pt"]


def write_llm_calls(
    cand: Candidate,
    label_text: str,
    params: list[tuple[str, str]],
    reference: tuple[str, str, str] | None,
    *,
    client: LLMClient,
    store,
    max_attempts: int = 3,
) -> list[list] | str:
    """The model's calls to the host function (launcher parameter order), or why there are none.
    `reference` is (kind, language, source) of the reference the test will use, when known."""
    spec = [{"name": n, "kind": param_kind(t)} for t, n in params]
    kind, lang, source = reference or ("", "", "")
    context = dict(
        kernel=cand.kernel,
        function=(cand.wrapper.functions or [cand.wrapper.launcher])[0],
        repo_url=cand.provenance.repo_url,
        label_code=label_text,
        params=[{"name": n, "type": t, "kind": param_kind(t)} for t, n in params],
        reference_kind=kind,
        reference_lang=lang,
        reference_code=source[:MAX_REFERENCE],
        min_calls=MIN_CALLS,
        max_calls=MAX_CALLS,
        min_shapes=MIN_SHAPES,
        max_elements=MAX_ELEMENTS,
    )
    made: dict[str, list] = {}

    def check(code: str) -> str:
        problem = turns.contract_problem(code, "make_calls", [])
        if problem:
            return problem
        calls = run_calls(code, spec)
        if isinstance(calls, str):
            return calls
        made[code] = calls
        return ""

    answer = turns.ask_checked(
        client,
        store,
        cand,
        step="inputs",
        template=TEMPLATE,
        context=context,
        check=check,
        max_attempts=max_attempts,
    )
    return answer if isinstance(answer, str) else made[answer.code]
