"""A backward kernel checked against autograd of the repository's own forward PyTorch function.

Repositories that keep a pure-PyTorch forward (`multi_scale_deformable_attn_pytorch`) almost
never keep a backward one: their tests check gradients through the op's autograd Function,
which the recorder cannot run (the extension is absent, so the forward returns nothing and
backward is never called). Yet a backward binding takes the forward's arguments by name plus the
gradient of its output, and computes the gradients of the forward's floating inputs. So every
recorded forward call that the forward function was paired with gives a backward call: the
forward's arguments by name, a seeded random gradient shaped like the forward's output, zero
buffers for the gradients it writes. `torch.autograd.grad` through the vendored forward, run in
the sandbox, says what the backward must compute; those calls are then paired with the backward
label's host function by value like any other (python_reference._pair_all), and the vendored
forward, its adapter, the gradient step and the backward adapter make one reference.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from testgen.carry import Unmappable, bind_call, defined_name
from testgen.cases import shape_key
from testgen.inputs import RecordedCall, RefCall
from testgen.python_reference import (
    Pairing,
    _pair_all,
    adapter,
    checked_reference,
    pair,
)
from testgen.sandbox import run_checker
from testgen.standalone import REFRUN
from testgen.vendor import vendor_function
from wrappers.through_forward import forward_of

RUN_TIMEOUT_S = 180.0
MAX_CALLS = 24
_GRAD_OF = re.compile(r"^(?:grad_?|d_?)(?P<a>\w+)$|^(?P<b>\w+?)_?grad$")
_OUTPUT_GRAD = re.compile(r"grad|^d_?(?:out|y|top)", re.I)
_OPTIONAL = re.compile(r"\boptional\b")  # c10::optional<at::Tensor>, std::optional<...>
MIN_WITHOUT_OPTIONALS = 4  # forward calls made without their optional tensors, even at MAX_CALLS


def _bare(name: str) -> str:
    return name.rstrip("_")  # `bias_`, `dfinal_states_`: C++'s mark of an optional


def grad_base(name: str) -> str:
    """The name a gradient is named after (`grad_x`, `dx`, `x_grad` → `x`), else ''."""
    m = _GRAD_OF.match(name)
    return _bare((m and (m.group("a") or m.group("b"))) or "")


def _role(name: str, fwd: list[str], outputs: set[str]):
    """What a backward parameter holds: one of the forward's ("input", p), the gradient it
    writes for forward input p ("grad", p), the gradient of the forward output written into p
    ("out_grad", p: `dout` for `out`, `dfinal_states_` for `final_states_out_`), or of an output
    it does not name ("out_grad",), or of an optional output p the paired forward calls never
    write ("absent", p: always None). `outputs`: the forward's parameters it writes into."""
    if name in fwd:
        return ("input", name)
    base = grad_base(name)
    if base:
        for p in fwd:
            if _bare(p) == base and p not in outputs:
                return ("grad", p)
        for p in sorted(outputs):
            if _bare(p) in (base, base + "_out", base + "out"):
                return ("out_grad", p)
        for p in fwd:  # an output the paired calls never asked for (`final_states_out_`)
            if _bare(p) in (base + "_out", base + "out"):
                return ("absent", p)
    if _OUTPUT_GRAD.search(name):
        return ("out_grad",)
    return None


def _unpaired(type_text: str):
    """The role of a backward parameter the forward neither takes nor writes: an optional one
    (the forward's saved results, mamba's `x_` and `out_`) is not given, as when the op skips
    them; a bool (a mode of the backward alone: `recompute_out_z`) is off."""
    if _OPTIONAL.search(type_text):
        return ("absent",)
    if re.fullmatch(r"(?:const\s+)?bool\s*&?", type_text.strip()):
        return ("off",)
    return None


def _grad_target(name: str, fwd: list[str]) -> int | None:
    """The forward position whose gradient `name` holds (`dA` → `A`, `ddelta_bias` →
    `delta_bias_`), or None."""
    base = grad_base(name)
    return next((k for k, p in enumerate(fwd) if base and _bare(p) == base), None)


def _top_level(items: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(items):
        depth += (ch in "([") - (ch in ")]")
        if ch == "," and depth == 0:
            parts.append(items[start:i])
            start = i + 1
    return [*parts, items[start:]]


def returned_order(body: str, fwd: list[str]) -> list[int] | None:
    """The forward positions whose gradients a backward returns, in its return's order
    (`std::vector<at::Tensor> result = {du, ddelta, dA, dB.to(B.dtype())}; if (has_z) {
    result.push_back(dz); } return result;`), up to the first value that is no gradient of a
    forward input; None when the return is not such a list."""
    listed = re.search(r"\breturn\s*\{([^{}]*)\}", body)
    items = _top_level(listed.group(1)) if listed else []
    if not listed:
        var = re.search(r"\breturn\s+(\w+)\s*;", body)
        init = var and re.search(rf"\b{var.group(1)}\s*=?\s*\{{([^{{}}]*)\}}", body)
        if not init:
            return None
        pushed = rf"\b{var.group(1)}\s*\.\s*(?:push|emplace)_back\s*\(([^;]*)\)\s*;"
        items = _top_level(init.group(1)) + re.findall(pushed, body)
    order: list[int] = []
    for item in items:
        name = re.match(r"\s*([A-Za-z_]\w*)", item)
        k = _grad_target(name.group(1), fwd) if name else None
        if k is None or k in order:
            break
        order.append(k)
    return order or None


def _binding_args(call: RecordedCall, refs) -> list | None:
    try:
        params, bound = bind_call(call, refs)
    except Unmappable:
        return None
    return [bound[p] for p in params]


class _Plan:
    """How the backward's arguments come from a forward call and what it must output."""

    def __init__(self, p: Pairing, fwd: list[str], bwd: list[str], roles: list, order=None) -> None:
        self.p, self.fwd, self.bwd, self.roles = p, fwd, bwd, roles
        self.order = order  # forward positions in the order the backward returns gradients
        self.out_targets = [j for j, t in enumerate(p.outputs) if t]
        self.inputs = [k for k, r in enumerate(roles) if r[0] != "grad"]
        self.grads = [r[1] for r in roles if r[0] == "grad"]
        read = {src[1] for src in p.params.values() if src[0] == "arg"}
        self.leaves = sorted(read)  # forward positions whose gradient may be asked
        self.written = {t[1]: j for j, t in enumerate(p.outputs) if t and t[0] == "arg"}
        self.output_of = self._outputs_by_parameter()

    def _place(self, fwd_param: str) -> int:
        """Where the output the forward writes into `fwd_param` is in `out_targets`."""
        return self.out_targets.index(self.written[self.fwd.index(fwd_param)])

    def _outputs_by_parameter(self) -> list:
        """For each backward parameter that is an output gradient, the forward output (its
        place in `out_targets`) it is the gradient of: the one it names, else the next
        output no other names (-1: none left); None for the other parameters."""
        named = {self._place(r[1]) for r in self.roles if r[0] == "out_grad" and len(r) > 1}
        free = [j for j in range(len(self.out_targets)) if j not in named]
        found = []
        for r in self.roles:
            if r[0] != "out_grad":
                found.append(None)
            elif len(r) > 1:
                found.append(self._place(r[1]))
            else:
                found.append(free.pop(0) if free else -1)
        return found

    def backward_call(self, fargs: list, outs: list, seed: int) -> list | None:
        """The backward's arguments for a forward call whose outputs (in `out_targets`
        order) are `outs`; an output the call did not ask for (None) has no gradient."""
        import torch

        if -1 in self.output_of:
            return None
        gen = torch.Generator().manual_seed(seed)
        args, given = [], 0
        for role, j in zip(self.roles, self.output_of, strict=True):
            k = self.fwd.index(role[1]) if len(role) > 1 and role[0] != "out_grad" else None
            if role[0] == "input":
                w = self.written.get(k)
                args.append(outs[self.out_targets.index(w)] if w is not None else fargs[k])
            elif role[0] == "absent":
                args.append(None)
            elif role[0] == "off":
                args.append(False)
            elif role[0] == "grad":
                if fargs[k] is None:
                    args.append(None)  # an optional input not given: no gradient to write
                elif not hasattr(fargs[k], "shape"):
                    return None
                else:
                    args.append(torch.zeros_like(fargs[k]))
            else:
                o = outs[j]
                if not (hasattr(o, "is_floating_point") and o.is_floating_point()):
                    args.append(None)
                    continue
                given += 1
                args.append(torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype))
        return args if given else None

    def _written_order(self) -> list:
        """(forward position, place of its output in `out_targets` when a backward parameter
        is its gradient, else None) for each output the forward writes into an argument."""
        asked = set(self.output_of)
        places = ((k, self.out_targets.index(j)) for k, j in sorted(self.written.items()))
        return [(k, j if j in asked else None) for k, j in places]

    def code(self, forward_body: str) -> str:
        """The forward, its adapter, `kminer_forward(*forward args)` returning its outputs,
        `kminer_backward(<backward inputs>)` returning the gradients in the order the backward
        outputs them, and `kminer_gradients(*backward args)` (refrun runs the last and the
        first)."""
        names = [self.bwd[k] for k in self.inputs]
        fexpr = []
        for k, pname in enumerate(self.fwd):
            if pname in self.bwd and self.roles[self.bwd.index(pname)][0] == "input":
                fexpr.append(pname)
            elif k in self.written:
                fexpr.append("None")  # an output the forward writes: made below
            elif ("absent", pname) in self.roles:
                fexpr.append("None")  # an optional output no paired call asked for
            else:
                return ""
        by_output = dict(zip(self.output_of, self.bwd, strict=True))
        out_grads = [by_output.get(j, "None") for j in range(len(self.out_targets))]
        # the gradients it writes, by name; else those it returns, in the forward's order;
        # one that writes a gradient (mamba's optional `dz_`) and returns them all: in its
        # return's order
        wanted = [self.fwd.index(g) for g in self.grads] or "leaves"
        if self.grads and self.order:
            wanted = list(self.order)
        lines = [
            forward_body,
            adapter(self.p, self.fwd, name="_forward"),
            "",
            "",
            "def kminer_forward(*fargs):",
            "    returned = _forward(*fargs)",
            "    returned = list(returned) if isinstance(returned, (list, tuple)) else (",
            "        [] if returned is None else [returned])",
            "    outs = []",
            *[
                "    outs.append(returned.pop(0))"
                if self.p.outputs[j][0] == "return"
                else f"    outs.append(fargs[{self.p.outputs[j][1]}])"
                for j in self.out_targets
            ],
            "    return outs",
            "",
            "",
            "# kminer: the backward is the gradient of the forward above (torch.autograd).",
            f"def kminer_backward({', '.join(names)}):",
            f"    fargs = [{', '.join(fexpr)}]",
            f"    grads_out = [{', '.join(out_grads)}]  # per forward output; None: not asked",
            f"    for k, j in {self._written_order()!r}:",
            "        g = grads_out[j] if j is not None else next(  # no gradient: a buffer alike",
            "            (g for g in grads_out if g is not None), None)",
            "        fargs[k] = torch.empty_like(g) if g is not None else None",
            f"    leaves = [k for k in {self.leaves!r} if getattr(fargs[k], 'is_floating_point',"
            " bool)()]",
            "    for k in leaves:",
            "        fargs[k] = fargs[k].detach().clone().requires_grad_(True)",
            "    with torch.enable_grad():",
            "        outs = kminer_forward(*fargs)",
            "        pairs = [(o, g) for o, g in zip(outs, grads_out)",
            "                 if o is not None and g is not None and o.requires_grad]",
            "        if not pairs:",
            "            raise RuntimeError('kminer: the forward function is not differentiable"
            " in torch (numpy, or no floating input reaches its output)')",
            "        found = torch.autograd.grad(",
            "            [o for o, _ in pairs], [fargs[k] for k in leaves],",
            "            [g.to(o.dtype) for o, g in pairs], allow_unused=True)",
            "    by = dict(zip(leaves, found))",
            "    return [by[k].detach() if by.get(k) is not None else (",
            "            None if fargs[k] is None else torch.zeros_like(fargs[k]))",
            f"            for k in {wanted}]",
            "",
            "",
            "def kminer_gradients(*args):",
            f"    return kminer_backward(*[args[k] for k in {self.inputs!r}])",
            "",
        ]
        return "\n".join(lines)


def find_grad_reference(
    cand, recorded, refs, binding: str, host: list, returns: str, workdir: Path, to_host
):
    """(Reference, the backward calls it covers) for a backward `binding`, from the forward
    the tests pair with a PyTorch function; or why there is none."""
    repo = Path(refs.disc.root)
    found = _grad_code(binding, recorded, refs, repo, to_host, returns, [n for _, n in host])
    if isinstance(found, str):
        return found
    code, back, calls, forward = found
    code += adapter(back, [n for _, n in host], helpers=False)
    hosts = [h for h in (to_host(c) for c in calls) if h is not None and back.covers(h)]
    ref = checked_reference(cand, code, back, host, workdir, hosts, f"autograd of {forward}")
    if isinstance(ref, str):
        return f"the gradient of the forward: {ref}"
    return ref, [c for c in calls if back.covers(to_host(c) or [])]


_RUNS: dict[str, list | str] = {}  # the kernels of one backward op ask the same twice
MAX_RUNS_KEPT = 64


def _run(code: str, entry: str, calls: list, what: str) -> list | str:
    """`entry` of the assembled code run on each call in the sandbox: its outputs, or why not."""
    if not calls:
        return []
    import io

    import torch

    blob = io.BytesIO()
    torch.save(calls, blob)
    key = hashlib.sha256(f"{entry}\0{code}".encode() + blob.getvalue()).hexdigest()
    if key not in _RUNS:
        if len(_RUNS) >= MAX_RUNS_KEPT:
            _RUNS.pop(next(iter(_RUNS)))
        _RUNS[key] = _sandboxed(code, entry, calls, what)
    return _RUNS[key]


def _sandboxed(code: str, entry: str, calls: list, what: str) -> list | str:
    ran = run_checker(
        REFRUN,
        {"code.py": f"{code}\nkminer_run = {entry}\n", "calls.pt": calls},
        what,
        RUN_TIMEOUT_S,
        outputs=("results.pt",),
    )
    if isinstance(ran, str):
        return ran.splitlines()[-1][:200] if ran else f"{what} failed"
    return ran["results.pt"]


def _forward_calls(calls: list, p: Pairing, refs) -> list[RecordedCall]:
    """The recorded forward calls the pairing covers (its tests' gradient checks included),
    one per shape first, at most MAX_CALLS."""
    covered, shapes = [], set()
    for c in calls:
        fargs = _binding_args(c, refs)
        if fargs is not None and p.covers(fargs):
            covered.append(RecordedCall(c.function, fargs, {}, c.test_file))
    picked, rest = [], []
    for c in covered:
        key = shape_key(c.args)
        (rest if key in shapes else picked).append(c)
        shapes.add(key)
    return (picked + rest)[:MAX_CALLS]


def _without_optionals(calls: list[RecordedCall], params: list, p: Pairing) -> list:
    """Each forward call again without its optional tensors (mamba's `D_`, `z_`,
    `delta_bias_`), where it gives some: a backward handed none of the forward's saved results
    (`out_`) runs only on such calls when its host code needs them beside an optional input
    (`if (has_z) TORCH_CHECK(out_.has_value())`); the others it refuses, which the test reports
    as invalid cases."""
    optional = [k for k, (t, _) in enumerate(params) if _OPTIONAL.search(t)]
    made = []
    for c in calls:
        if any(k < len(c.args) and c.args[k] is not None for k in optional):
            args = [None if k in optional else a for k, a in enumerate(c.args)]
            if p.covers(args):
                made.append(RecordedCall(c.function, args, {}, c.test_file))
    return made[: max(MIN_WITHOUT_OPTIONALS, MAX_CALLS - len(calls))]


def _grad_code(binding: str, recorded, refs, repo: Path, to_host, returns: str, host_names=()):
    """(code, Pairing, backward calls, forward function) for a backward `binding`; or why
    there is none."""
    refs_list = getattr(recorded, "refs", [])
    partners = {c.function for r in refs_list for c in r.partners}
    fwd_name = forward_of(binding, partners)
    if fwd_name is None:
        return f"no forward op beside {binding} is paired with a PyTorch function"
    fwd_def, bwd_def = defined_name(refs, fwd_name), defined_name(refs, binding)
    fwd, bwd = refs.params_of(fwd_def), refs.params_of(bwd_def)
    item = refs.definition(fwd_def)
    sig = refs.signature(item) if item else None
    if not fwd or not bwd or sig is None:
        return f"{fwd_name} or {binding} has no signature to pair"
    problems = []
    bwd_item = refs.definition(bwd_def)
    bsig = refs.signature(bwd_item) if bwd_item else None
    types = {n: t for t, n in (bsig.params if bsig else [])}
    order = returned_order(refs.body(bwd_item), fwd) if bwd_item else None
    for p in pair(refs_list, fwd_name, repo, sig.returns, lambda c: _binding_args(c, refs))[:2]:
        written = {fwd[t[1]] for t in p.outputs if t and t[0] == "arg"}
        roles = [_role(n, fwd, written) or _unpaired(types.get(n, "")) for n in bwd]
        if None in roles or not any(r[0] == "out_grad" for r in roles):
            odd = [n for n, r in zip(bwd, roles, strict=True) if r is None]
            what = ", ".join(odd) or "output gradient"
            problems.append(f"{binding}'s {what} is no forward input of {fwd_name}")
            continue
        plan = _Plan(p, fwd, bwd, roles, order)
        body = vendor_function(repo, p.file, p.function)
        if body.startswith("!"):
            problems.append(f"{p.function}: {body[1:]}")
            continue
        code = plan.code(body)
        forward_calls = _forward_calls(recorded.get(fwd_name, []), p, refs)
        forward_calls += _without_optionals(forward_calls, sig.params, p)
        if not code or not forward_calls:
            problems.append(f"{p.function}: no backward call follows from its forward calls")
            continue
        outs = _run(code, "kminer_forward", [c.args for c in forward_calls], "the forward")
        if isinstance(outs, str):
            problems.append(f"{p.function}: {outs}")
            continue
        calls: list[RecordedCall] = []
        for seed, (c, o) in enumerate(zip(forward_calls, outs, strict=True)):
            args = plan.backward_call(c.args, o, seed)
            if args is not None:
                calls.append(RecordedCall(binding, args, {}, c.test_file, made=True))
        grads = _run(code, "kminer_gradients", [c.args for c in calls], "its gradient")
        if isinstance(grads, str):
            problems.append(f"{p.function}: {grads}")
            continue
        names = [bwd[k] for k in plan.inputs]
        bound = []
        for call, result in zip(calls, grads, strict=False):
            host = to_host(call)
            if host is None:
                continue
            values = dict(zip(names, [call.args[k] for k in plan.inputs], strict=True))
            ref = RefCall("kminer_backward", p.file, list(values.values()), {}, result)
            bound.append((RecordedCall(binding, host, {}, call.test_file), ref, values))
        handed = {n for n, r in zip(bwd, roles, strict=True) if r[0] == "grad"}
        buffers = frozenset(i for i, n in enumerate(host_names) if n in handed)
        back = _pair_all(bound, p.file, "kminer_backward", returns, buffers) if bound else None
        if back is None:
            problems.append(f"{p.function}: its gradients do not map onto {binding}'s outputs")
            continue
        return code, back, calls, p.function
    return "; ".join(problems)[:600] or f"no PyTorch function pairs with {fwd_name}"
