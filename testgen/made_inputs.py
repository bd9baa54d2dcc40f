"""Inputs for a kernel whose repository's tests never call it: by rule where the contract is
certain, else by a model.

The rule covers the wrappers kminer writes by rule (wrappers/rule.py): every pointer is a tensor
of n elements and every other argument a scalar, so any n is a valid call; and a repository's
host function whose code uses each of its tensors only as n elements (testgen/elementwise.py).
Its calls are a typical size, a small one and one past several blocks, none a multiple of the
block size (1000, 37, 4099 elements), seeded values, a distinct value per scalar (so swapped
scalars show). Anything else (shapes related across tensors, index ranges) is left to the model
(testgen/llm_inputs.py), whose calls are checked in the sandbox. Either way the calls enter the
same case plan as recorded ones.
"""

from __future__ import annotations

import re

import torch

from miner.candidate import Candidate
from testgen.cases import BaseCall
from testgen.elementwise import elementwise_tensors
from testgen.llm_inputs import param_kind
from wrappers.signature import Signature, parse_signature

RULE_SIZES = (1000, 37, 4099)
RULE_SCALARS = (1.25, -0.5, 2.0, 0.75, 3.0)
RULE_ORIGIN = "kminer's element-wise rule: every tensor of n elements, seeded values"
ELEMENTWISE_ORIGIN = (
    "kminer's element-wise rule (the host function uses each tensor as n elements): "
    "every tensor of n elements, seeded values"
)
SEED = 20261124
C_DTYPES = {
    "float": torch.float32,
    "double": torch.float64,
    "half": torch.float16,
    "__half": torch.float16,
    "int": torch.int32,
    "int32_t": torch.int32,
    "int64_t": torch.int64,
    "long": torch.int64,
    "long long": torch.int64,
}


def exposed_signature(refs, function: str, label_text: str):
    """The signature of the function a test calls: the repository's definition, else the one
    in the label (a rule or model wrapper, bound as `m.def("function", &impl)`)."""
    item = refs.definition(function)
    sig = refs.signature(item) if item else None
    return sig or label_signature(function, label_text)


def exposed_params(refs, function: str, label_text: str) -> list[tuple[str, str]] | None:
    """(type, name) of the function a test calls; None when a parameter has no name."""
    sig = exposed_signature(refs, function, label_text)
    if sig is None or not all(n for _, n in sig.params):
        return None
    return list(sig.params)


_DEF_PREFIX = re.compile(r"^[ \t]*[\w:<>,*& \t]*?[\w>*&]\s+$")


def label_signature(function: str, label_text: str) -> Signature | None:
    """The signature of the C++ function a label binds as `m.def("function", &impl)`: the first
    `impl(` whose line starts like a definition. Plain string search, no pattern per name (an
    export reads thousands of labels, and compiling one regex per name dominated it)."""
    start = label_text.find(f'm.def("{function}"')
    impl = function
    if start >= 0:
        bound = re.match(r'm\.def\(\s*"[^"]*"\s*,\s*&?\s*([\w:]+)', label_text[start:])
        impl = bound.group(1).split("::")[-1] if bound else function
    at = label_text.find(impl)
    while at >= 0:
        end = at + len(impl)
        before = label_text[at - 1] if at else " "
        after = label_text[end:].lstrip(" \t\n")
        line_start = label_text.rfind("\n", 0, at) + 1
        if not label_text[line_start:at].strip() and line_start:  # the type on the line before
            line_start = label_text.rfind("\n", 0, line_start - 1) + 1
        if (
            not (before.isalnum() or before in "_:")
            and after.startswith("(")
            and _DEF_PREFIX.match(label_text[line_start:at])
        ):
            return parse_signature(label_text[line_start:], impl)
        at = label_text.find(impl, end)
    return None


def _element_dtype(cand: Candidate, name: str) -> torch.dtype | None:
    """The dtype of the kernel pointer `name` (a template type parameter is float32: the
    dispatch adds the other dtypes as cases)."""
    templates = {tp.name for tp in cand.kernel.template_params}
    for p in cand.kernel.params:
        if p.name == name:
            words = [w for w in re.findall(r"[A-Za-z_]\w*", p.type) if w not in ("const",)]
            words = [w for w in words if w not in ("__restrict__", "__restrict", "restrict")]
            base = " ".join(words)
            return torch.float32 if base in templates else C_DTYPES.get(base)
    return None


def elementwise_calls(params: list[tuple[str, str]], label_text: str, function: str) -> list:
    """Calls for a repository host function that uses each tensor as n floating elements
    (testgen/elementwise.py), as the rule makes them; [] for any other."""
    kinds = [param_kind(t) for t, _ in params]
    if any(k not in ("tensor", "float") for k in kinds) or "tensor" not in kinds:
        return []
    tensors = [n for (_, n), k in zip(params, kinds, strict=True) if k == "tensor"]
    dtypes = elementwise_tensors(label_text, function, tensors)
    if dtypes is None:
        return []
    gen = torch.Generator().manual_seed(SEED)
    calls = []
    for n in RULE_SIZES:
        scalars = iter(RULE_SCALARS * 4)
        args = [
            (torch.randn(n, generator=gen) * 2).to(getattr(torch, dtypes[name]))
            if k == "tensor"
            else next(scalars)
            for (_, name), k in zip(params, kinds, strict=True)
        ]
        calls.append(BaseCall(args, ELEMENTWISE_ORIGIN))
    return calls


def rule_calls(cand: Candidate, params: list[tuple[str, str]]) -> list[BaseCall]:
    """Calls for a rule-wrapped (element-wise) kernel; [] for any other."""
    if cand.wrapper.strategy != "rule":
        return []
    gen = torch.Generator().manual_seed(SEED)
    calls = []
    for n in RULE_SIZES:
        args, scalars = [], iter(RULE_SCALARS * 4)
        for type_text, name in params:
            kind = param_kind(type_text)
            if kind == "tensor":
                dtype = _element_dtype(cand, name)
                if dtype is None:
                    return []
                if dtype.is_floating_point:
                    args.append((torch.randn(n, generator=gen) * 2).to(dtype))
                else:  # never zero: an element-wise op may divide by it
                    magnitude = torch.randint(1, 51, (n,), generator=gen)
                    sign = torch.randint(0, 2, (n,), generator=gen) * 2 - 1
                    args.append((magnitude * sign).to(dtype))
            elif kind == "float":
                args.append(next(scalars))
            else:
                return []
        calls.append(BaseCall(args, RULE_ORIGIN))
    return calls
