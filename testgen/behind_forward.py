"""The reference and cases of a backward run behind its forward (wrappers.through_forward).

The label's glue takes the forward's arguments and the gradients of the forward's outputs, runs
the forward host function, then the backward one on its results, and returns the gradients the
autograd Function returns. Its reference is autograd through the repository's PyTorch function
that the tests compare the forward with (the pairing testgen.python_reference finds for the
forward binding), so the backward kernel is checked against the gradient of the op it belongs
to; its cases are the forward's recorded calls, each with a seeded gradient shaped like the
reference's output. The forward kernels run in every case but are not the candidate: a wrong
variant changes only the backward's kernel, and the forward has its own row.
"""

from __future__ import annotations

import copy
from itertools import zip_longest
from pathlib import Path

from testgen.carry import Unmappable, carry_down, defined_name
from testgen.cases import MAX_ELEMENTS, BaseCall, embeddable
from testgen.grad_reference import _binding_args, _forward_calls, _run
from testgen.inputs import RecordedCall, RefCall
from testgen.python_reference import _pair_all, adapter, checked_reference, pair
from testgen.vendor import vendor_function

CASE_SHARE = 256  # a case's forward call takes at most this share of a test file's elements:
# a test's reference often loops in Python over what the forward groups (mmcv's 2034 voxels
# of 2730 points, with autograd through the loop, outran the test's 10 s on a busy GPU box)
MAX_PAIRINGS = 4  # the forward's references, one per mode its tests check
MAX_CALLS = 24


def _forward_cand(cand, info: dict):
    """The candidate as its forward's chain sees it: what carries a forward call down."""
    fwd = copy.deepcopy(cand)
    w = info["forward_wrapper"]
    fwd.wrapper.launcher, fwd.wrapper.chain = w["launcher"], list(w["chain"])
    fwd.wrapper.functions, fwd.wrapper.op_map = list(w["functions"]), dict(w["op_map"])
    return fwd


def _slots(p, function_outputs: list | None) -> list:
    """Where each output the pairing's adapter returns goes among the forward binding's results:
    the result the autograd Function returns in its place, where the flow knows it (mamba's
    Function returns the binding's third result, `out_z`: the tests compare that with their
    PyTorch function's first output); else the same position."""
    returned = [j for j, t in enumerate(p.outputs) if t and t[0] == "return"]
    if not function_outputs:
        return returned
    return [
        src[1] if j < len(function_outputs) and (src := function_outputs[j]) and
        src[0] == "result" and src[1] >= 0 else None
        for j in returned
    ]  # fmt: skip


def _code(
    bodies: list[str], ps: list, fwd: list[str], grads: list[int], wanted: list[int], slots: list
) -> str:
    """The forwards, their adapters, `kminer_forward(*forward args)` (its outputs by the
    binding's output order, from the first pairing that takes the call; None where none gives
    one) and `kminer_behind(<forward args>, <gradients>)`: the gradients of the forward
    arguments `wanted`, from autograd (`kminer_behind_or_none`: [] where it raises)."""
    names = [*fwd, *(f"kminer_grad_{j}" for j in grads)]
    n_out = max([*grads, *(j for s in slots for j in s if j is not None)]) + 1
    lines = [*bodies]
    for i, p in enumerate(ps):  # a mode each (mmcv's mean and max references): its own adapter
        lines.append(adapter(p, fwd, name=f"_forward_{i}", helpers=i == 0))
    forwards = ", ".join(f"_forward_{i}" for i in range(len(ps)))
    return "\n".join(
        [
            *lines,
            "",
            "",
            f"_SLOTS = {slots!r}  # per pairing: the binding's result each output it returns is",
            "",
            "",
            "def kminer_forward(*fargs):",
            f"    for i, forward in enumerate([{forwards}]):",
            "        try:",
            "            returned = forward(*fargs)",
            "        except RuntimeError as e:  # another mode's reference (its adapter refuses)",
            "            if str(e).startswith('kminer:'):",
            "                continue",
            "            raise",
            "        returned = list(returned) if isinstance(returned, (list, tuple)) else (",
            "            [] if returned is None else [returned])",
            f"        outs = [None] * {n_out}",
            "        for at, value in zip(_SLOTS[i], returned):",
            "            if at is not None:",
            "                outs[at] = value",
            "        return outs",
            f"    return [None] * {n_out}",
            "",
            "",
            "# kminer: the glue's gradients are autograd of the forward above (torch.autograd).",
            f"def kminer_behind({', '.join(names)}):",
            f"    fargs = [{', '.join(fwd)}]",
            f"    grads = [{', '.join(f'kminer_grad_{j}' for j in grads)}]",
            f"    given = [k for k in {wanted!r} if fargs[k] is not None]  # (optional: None)",
            "    for k in given:",
            "        fargs[k] = fargs[k].detach().clone().requires_grad_(True)",
            "    with torch.enable_grad():",
            "        outs = kminer_forward(*fargs)",
            f"        pairs = [(outs[j], g) for j, g in zip({grads!r}, grads)",
            "                 if outs[j] is not None and outs[j].requires_grad]",
            "        if not pairs:",
            "            raise RuntimeError('kminer: no output of the forward function is"
            " differentiable in torch')",
            "        found = torch.autograd.grad([o for o, _ in pairs],",
            "            [fargs[k] for k in given], [g.to(o.dtype) for o, g in pairs],",
            "            allow_unused=True)",
            "    found = dict(zip(given, found))",
            "    return [None if k not in found else found[k].detach() if found[k] is not None",
            f"            else torch.zeros_like(fargs[k]) for k in {wanted!r}]",
            "",
            "",
            "def kminer_forward_or_none(*fargs):",
            "    try:",
            "        return kminer_forward(*fargs)",
            "    except Exception:  # a call the reference cannot take: it makes no case",
            f"        return [None] * {n_out}",
            "",
            "",
            "def kminer_behind_or_none(*args):",
            "    try:",
            "        return kminer_behind(*args)",
            "    except Exception:  # the reference cannot take this call: it makes no case",
            "        return []",
            "",
        ]
    )


def _small(args: list, names: list[str]) -> list | None:
    """The call, or its first rows, within the share of a test file a case may take."""
    import torch

    size = sum(a.numel() for a in args if isinstance(a, torch.Tensor))
    if size * CASE_SHARE <= MAX_ELEMENTS:
        return args
    # the rows are the first tensor's first dimension (mmcv's points, mamba's batch), cut in
    # every tensor that has that many rows: a weight of another first size (mamba's A, D) stays
    top = next((a.shape[0] for a in args if isinstance(a, torch.Tensor) and a.dim()), 1)
    rows = max(1, int(top * MAX_ELEMENTS / (CASE_SHARE * max(size, 1))))
    # each cut a copy: a view would carry its whole storage into the test file
    cut = [a[:rows].clone() if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == top
           and top > rows else a for a in args]  # fmt: skip
    _, fitted = embeddable(cut, names)
    return fitted


def behind_forward(cand, refs, recorded, label_text: str, workdir: Path):
    """(Reference, base calls) for the glue a backward's label exposes, or why there is none."""
    import torch

    from testgen.made_inputs import exposed_params

    info = cand.wrapper.op_map["through_forward"]
    forward, glue = info["forward"], info["function"]
    repo = Path(refs.disc.root)
    fwd_def = defined_name(refs, forward)
    fwd = refs.params_of(fwd_def)
    item = refs.definition(fwd_def)
    sig = refs.signature(item) if item else None
    host = exposed_params(refs, glue, label_text)
    if not fwd or sig is None or host is None:
        return f"{forward} or the glue {glue} has no signature to pair"
    grads = [int(j) for j in info["out_grads"]]
    # the Function's k-th argument is the forward binding's at the position it is passed
    call = [tuple(s) for s in info["forward_call"]]
    wanted = [call.index(("arg", k)) for k in info["gradients"] if ("arg", k) in call]
    if not wanted:
        return f"the gradients the Function returns are of no argument {forward} takes"
    fwd_cand = _forward_cand(cand, info)
    binding_args = lambda c: _binding_args(c, refs)  # noqa: E731
    ps, problems = [], []
    outputs = info.get("function_outputs")
    for p in pair(getattr(recorded, "refs", []), forward, repo, sig.returns, binding_args):
        if any(j not in _slots(p, outputs) for j in grads):
            problems.append(f"{p.function} does not compute the outputs the backward is given")
            continue
        body = vendor_function(repo, p.file, p.function)
        if body.startswith("!"):
            problems.append(f"{p.function}: {body[1:]}")
            continue
        ps.append((p, body))
    ps = ps[:MAX_PAIRINGS]
    if not ps:
        return "; ".join(problems)[:600] or f"no PyTorch function the tests pair with {forward}"
    slots = [_slots(p, outputs) for p, _ in ps]
    code = _code([b for _, b in ps], [p for p, _ in ps], fwd, grads, wanted, slots)
    by_pairing = [_forward_calls(recorded.get(forward, []), p, refs) for p, _ in ps]
    calls = [c for group in zip_longest(*by_pairing) for c in group if c]  # modes in turn
    small = [(c, a) for c in calls if (a := _small(c.args, fwd)) is not None][:MAX_CALLS]
    outs = _run(code, "kminer_forward_or_none", [a for _, a in small], "the forward")
    if isinstance(outs, str):
        return f"{ps[0][0].function}: {outs}"
    made = []
    for seed, ((c, fargs), o) in enumerate(zip(small, outs, strict=True)):
        if any(o[j] is None or not o[j].is_floating_point() for j in grads):
            continue
        gen = torch.Generator().manual_seed(seed)
        g = [torch.randn(o[j].shape, generator=gen, dtype=torch.float64).to(o[j].dtype)
             for j in grads]  # fmt: skip
        made.append((c, fargs, g))
    expected = _run(code, "kminer_behind_or_none", [[*f, *g] for _, f, g in made], "its gradient")
    if isinstance(expected, str) or not made:
        return f"{ps[0][0].function}: {expected or 'no forward call it computes'}"
    bound, base = [], []
    names = [*fwd, *(f"kminer_grad_{j}" for j in grads)]
    for (c, fargs, g), result in zip(made, expected, strict=True):
        if not result:
            continue
        try:
            fwd_call = RecordedCall(forward, fargs, {}, c.test_file)
            host_args = carry_down(fwd_call, fwd_cand, refs)
        except Unmappable:
            continue
        glue_args = [*host_args, *g]
        values = dict(zip(names, [*fargs, *g], strict=True))
        ref = RefCall("kminer_behind", ps[0][0].file, list(values.values()), {}, result)
        bound.append((RecordedCall(glue, glue_args, {}, c.test_file), ref, values))
        how = "a seeded gradient of its output"
        base.append(BaseCall(glue_args, c.test_file, call=fwd_call, derived=how))
    returns = "std::vector<at::Tensor>"
    back = _pair_all(bound, ps[0][0].file, "kminer_behind", returns) if bound else None
    if back is None:
        return f"{ps[0][0].function}: its gradients do not map onto {glue}'s arguments"
    code += adapter(back, [n for _, n in host], helpers=False)
    hosts = [b.args for b in base if back.covers(b.args)]
    functions = " and ".join(dict.fromkeys(p.function for p, _ in ps))
    ref = checked_reference(cand, code, back, host, workdir, hosts, f"autograd of {functions}")
    if isinstance(ref, str):
        return f"the gradient of {functions}: {ref}"
    return ref, [b for b in base if back.covers(b.args)]
