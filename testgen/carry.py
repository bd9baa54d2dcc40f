"""A repository's call of its Python binding, carried down to the label's launcher.

The repository's tests call its Python binding (mmcv: `roi_align_forward(input, rois, output,
...)`); the label exposes the launcher further down (`ROIAlignForwardCUDAKernelLauncher`). Each
call is carried down the op chain by reading every call on the way (`caller` passes these
expressions to `callee`): a parameter passed on, a literal, `t.size(k)` and integer arithmetic
are evaluated by a small interpreter over the recorded values (never Python's eval: the
expressions are repository text). A chain that computes a launcher argument in a way the
interpreter cannot follow gives no cases, and says which argument.
"""

from __future__ import annotations

import itertools
import re

from miner.candidate import Candidate
from miner.sources import GPU_SOURCE
from testgen.argmap import call_args
from testgen.inputs import RecordedCall
from testgen.interp import Unmappable, evaluate, run_statements

_DISPATCH = re.compile(r"\b(?:DISPATCH_DEVICE_IMPL|DISPATCH_\w*IMPL)\b")
# a module's bindings (a caller of every op, calling none): no step of an op's chain
_REGISTRATION = re.compile(r"^(?:PYBIND11_MODULE|TORCH_LIBRARY\w*)$")


def descent(cand: Candidate, python_fn: str) -> list[tuple[str, str]]:
    """(caller, callee) pairs from the Python binding down to the exposed launcher; a callee
    "DISPATCH:<fn>" is reached through a dispatch macro (mmcv's DISPATCH_DEVICE_IMPL)."""
    op = cand.wrapper.op_map
    exposed = (cand.wrapper.functions or [cand.wrapper.launcher])[0]
    if exposed == python_fn:  # the label binds the repository's own binding function
        return []
    chain = [f for f in op.get("chain", []) if f != python_fn and not _REGISTRATION.match(f)]
    if exposed in chain:
        chain = chain[chain.index(exposed) :]
    down = list(reversed(chain))  # device_fn ... exposed
    if op.get("dispatch_key") and op.get("device_fn") == (down[0] if down else ""):
        top = [python_fn, op["dispatch_key"], f"DISPATCH:{down[0]}"]
        pairs = [(top[0], top[1]), (top[1], top[2])]
        prev = down[0]
    else:
        pairs, prev = [], python_fn
        if down and down[0] == python_fn:
            down = down[1:]
        if not down:
            return []
        pairs.append((python_fn, down[0]))
        prev = down[0]
    for callee in down[1:]:
        pairs.append((prev, callee))
        prev = callee
    return pairs


def public_names(cand: Candidate) -> list[str]:
    """The repository's bindings that reach this launcher (several ops may share one:
    spmm_sum, spmm_mean, ... all call spmm_fw); empty when none is known."""
    op = cand.wrapper.op_map
    return list(op.get("python_names") or ([op["python_name"]] if op.get("python_name") else []))


def pybind_arg_names(refs, python_fn: str) -> list[str] | None:
    """The `py::arg("...")` (or `"..."_a`) names of the binding that exposes `python_fn`."""
    pattern = re.compile(rf'\.def\s*\(\s*"{re.escape(python_fn)}"\s*,')
    for model in refs.disc.models.values():
        text = model.text  # string literals are blanked in `code`
        m = pattern.search(text) if "py::arg" in text or '"_a' in text else None
        if m is None:
            continue
        depth, end = 1, m.end()
        while end < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        found = re.findall(r'py::arg\s*\(\s*"(\w+)"|"(\w+)"_a\b', text[m.end() : end])
        return [a or b for a, b in found]
    return None


_GPU_WORD = re.compile(r"(?:^|[_/.])(?:cuda|gpu)(?=[_/.]|$)", re.IGNORECASE)


def bound_function(
    refs, python_fn: str, within: tuple[str, ...] = (), cpu_side: bool = False
) -> str | None:
    """The C++ function a binding exposes under another name: mamba's `m.def("fwd",
    &selective_scan_fwd)`, which its Python calls as `selective_scan_cuda.fwd(...)`. Where
    several modules bind the name (PyTorch-Encoding's `cpu` and `gpu` modules both define
    `aggregate_forward`), the one among `within` (a candidate's chain), else one defined in GPU
    sources (the recorder pretends CUDA: the tests' calls take the GPU path), else the first;
    `cpu_side`: the binding called on CPU tensors, so one defined outside GPU sources."""
    pattern = re.compile(  # `m.impl(TORCH_SELECTIVE_NAME("pyg::fps"), TORCH_FN(fps_cuda))` too
        r'\.(?:def|impl)\s*\(\s*(?:TORCH_SELECTIVE_NAME\s*\(\s*)?"(?:\w+::)?'
        rf'{re.escape(python_fn)}(?:\.\w+)?"\s*\)?\s*,\s*(?:TORCH_FN\s*\(\s*)?&?\s*([A-Za-z_][\w:]*)'
    )
    found = [
        m.group(1).split("::")[-1]
        for model in refs.disc.models.values()
        if python_fn in model.text
        for m in pattern.finditer(model.text)
    ]

    def gpu_side(name: str) -> bool:  # its source is CUDA's, or its name or file says so
        item = refs.definition(name)  # (longcw/RoIAlign.pytorch: `forward` is bound to
        # crop_and_resize_forward in crop_and_resize.cpp, to crop_and_resize_gpu_forward in
        # crop_and_resize_gpu.cpp, neither file under a cuda/ folder)
        if item is None:
            return False
        return bool(GPU_SOURCE.search(item.file) or _GPU_WORD.search(f"{item.file}/{name}"))

    if len(set(found)) < 2:
        return found[0] if found else None
    return sorted(found, key=lambda f: (f not in within, gpu_side(f) == cpu_side))[0]  # stable


def defined_name(refs, python_fn: str, within: tuple[str, ...] = ()) -> str:
    """The name of the repository's function behind a binding: the CUDA function the
    dispatcher runs for an op registered per device (pyg-lib's `torch.ops.pyg.grid_cluster`
    reaches `grid_cluster_cuda`; its C++ `grid_cluster` only calls the dispatcher), its own,
    or the one `bound_function` finds where no function of the repository has its name."""
    for (key, device), fn in refs.registry.items():  # the dispatcher's keys: `ns::op`
        if device == "CUDA" and key.endswith(f"::{python_fn}") and refs.params_of(fn):
            return fn
    if refs.params_of(python_fn) is not None:
        return python_fn
    cpp = bound_function(refs, python_fn, within)
    return cpp if cpp and refs.params_of(cpp) is not None else python_fn


def _as_defined(call: RecordedCall, refs, cand: Candidate | None = None) -> RecordedCall:
    """The call under the name of the C++ function it reaches (for `cand`: the one on its
    chain down to the label)."""
    within = ()
    if cand is not None:
        exposed = (cand.wrapper.functions or [cand.wrapper.launcher])[0]
        within = (*cand.wrapper.op_map.get("chain", []), exposed)
    name = defined_name(refs, call.function, within)
    if name == call.function:
        return call
    return RecordedCall(name, call.args, call.kwargs, call.test_file, call.after)


def bind_call(call: RecordedCall, refs) -> tuple[list[str], dict]:
    """The binding's parameter names and the recorded call's arguments by name (keywords
    renamed through its py::arg list); Unmappable when the call does not fit."""
    call = _as_defined(call, refs)
    params = refs.params_of(call.function)
    if params is None:
        raise Unmappable(f"{call.function} has no definition in the repository")
    bound = call.bind(params)
    if bound is None and call.kwargs:  # keywords named by the binding's py::arg list
        names = pybind_arg_names(refs, call.function)
        if names and len(names) == len(params):
            rename = dict(zip(names, params, strict=True))
            renamed = {rename.get(k, k): v for k, v in call.kwargs.items()}
            bound = RecordedCall(call.function, call.args, renamed).bind(params)
    if bound is None:
        raise Unmappable(f"the recorded call does not fit {call.function}({', '.join(params)})")
    return params, bound


def carry_down(call: RecordedCall, cand: Candidate, refs) -> list:
    """The launcher's arguments for one recorded binding call; Unmappable when the chain
    computes one in a way we cannot follow."""
    call = _as_defined(call, refs, cand)
    python_fn = call.function
    _, bound = bind_call(call, refs)
    env = bound
    steps = descent(cand, python_fn)
    if not any(callee.startswith("DISPATCH:") for _, callee in steps):
        steps = _called_path(refs, steps) or steps
    for caller, callee in steps:
        item = refs.definition(caller)
        if item is None:
            raise Unmappable(f"{caller} has no definition")
        body = refs.body(item)
        if callee.startswith("DISPATCH:"):
            callee = callee.removeprefix("DISPATCH:")
            m = _DISPATCH.search(body)
            at = m.start() if m else None
            args = call_args(body, m.group(0))[1:] if m else None
        else:
            body, env = _reach(refs, body, callee, env)
            at = _call_at(body, callee) if body else None
            args = call_args(body, callee) if body else None
        env = run_statements(body or "", env, at)
        callee_params = refs.params_of(callee)
        if args is None or callee_params is None:
            raise Unmappable(f"{caller} does not call {callee} in a way we can read")
        if len(args) > len(callee_params):
            raise Unmappable(f"{caller} passes {len(args)} arguments to {callee}")
        new_env = {}
        for p, a in zip(callee_params, args, strict=False):
            try:
                new_env[p] = _mode_number(a, env, refs)
            except Unmappable as e:
                raise Unmappable(f"{caller} passes `{a}` as {callee}'s `{p}`: {e}") from None
        if len(new_env) < len(callee_params):
            missing = callee_params[len(new_env)]
            raise Unmappable(f"{caller} leaves {callee}'s `{missing}` to its default")
        env = new_env
    exposed = (cand.wrapper.functions or [cand.wrapper.launcher])[0]
    names = refs.params_of(exposed)
    if names is None:
        raise Unmappable(f"{exposed} has no definition")
    if python_fn == exposed:
        return [bound[n] for n in names]
    return [env[n] for n in names]


def _called_path(refs, steps: list[tuple[str, str]]) -> list[tuple[str, str]] | None:
    """The steps through the same functions that follow calls the code makes. An op chain
    merges every path to the launcher (im2col is reached from both `dcn_v2_cuda_forward` and
    `dcn_v2_cuda_backward`), so its order can step from the forward into the backward; the
    path kept is the first one, in the chain's order, on which each function mentions the next.
    A caller that runs `K::apply(...)` (a C++ autograd Function) mentions what K's methods do.
    None when there is none."""
    if not steps:
        return None
    names = list(dict.fromkeys(n for step in steps for n in step))
    start, goal = steps[0][0], steps[-1][1]
    stack = [[start]]
    while stack:
        path = stack.pop()
        if path[-1] == goal:
            return list(itertools.pairwise(path))
        item = refs.definition(path[-1])
        body = refs.body(item) if item is not None else ""
        body = body[max(body.find("{"), 0) :]
        for klass in re.findall(r"\b(\w+)::apply\s*\(", body):
            body += _class_body(refs, klass) or ""
        for name in reversed(names):
            if name not in path and re.search(rf"(?<![\w.]){re.escape(name)}\b", body):
                stack.append([*path, name])
    return None


def _call_at(body: str, callee: str) -> int | None:
    m = re.search(rf"(?<![\w.>]){re.escape(callee)}\s*(?:<[^<>;{{}}]*>)?\s*\(", body)
    return m.start() if m else None


def _reach(refs, body: str, callee: str, env: dict, depth: int = 2) -> tuple[str | None, dict]:
    """The body that calls `callee`, and `env` over its parameters: the caller itself, an
    autograd Function's forward (`K::apply(...)`), or a helper the caller calls
    (`modulated_deform_conv_forward` → `..._fallthrough` → the dispatch), `depth` levels."""
    if call_args(body, callee) is not None:
        return body, env
    found, k_env = _through_apply(refs, body, callee, env)
    if found is not None or depth == 0:
        return found, k_env
    for mid in dict.fromkeys(
        re.findall(r"(?<![\w.>:])([A-Za-z_]\w*)\s*\(", body[body.find("{") :])
    ):
        item = refs.definition(mid)
        params = refs.params_of(mid) if item is not None else None
        mid_body = refs.body(item) if item is not None else ""
        if not params or callee not in mid_body:
            continue
        args = call_args(body, mid)
        here = run_statements(body, env, _call_at(body, mid))
        try:
            mid_env = {p: evaluate(a, here) for p, a in zip(params, args or [], strict=True)}
        except (Unmappable, ValueError):
            continue
        found, out_env = _reach(refs, mid_body, callee, mid_env, depth - 1)
        if found is not None:
            return found, out_env
    return None, env


def _class_body(refs, name: str) -> str | None:
    """The class's text as written (string literals kept: `"sum"` is an argument)."""
    pattern = re.compile(rf"\b(?:class|struct)\s+{re.escape(name)}\b[^{{;]*\{{")
    for model in refs.disc.models.values():
        m = pattern.search(model.code)
        if m is None:
            continue
        depth, end = 1, m.end()
        while end < len(model.code) and depth:
            depth += {"{": 1, "}": -1}.get(model.code[end], 0)
            end += 1
        return model.text[m.end() - 1 : end]
    return None


def _through_apply(refs, body: str, callee: str, env: dict) -> tuple[str | None, dict]:
    """A caller that reaches `callee` through `K::apply(args)` (a torch autograd Function):
    K's body, and `env` over K::forward's parameters (after the context)."""
    for klass in re.findall(r"\b(\w+)::apply\s*\(", body):
        apply_args = call_args(body, f"{klass}::apply")
        k_body = _class_body(refs, klass)
        if apply_args is None or k_body is None or call_args(k_body, callee) is None:
            continue
        m = re.search(r"\bforward\s*\(([^)]*)\)", k_body)
        if m is None:
            continue
        params = [p.strip().split()[-1].lstrip("*&") for p in m.group(1).split(",") if p.strip()]
        params = params[1:]  # the AutogradContext
        if len(params) != len(apply_args):
            continue
        here = run_statements(body, env, _call_at(body, f"{klass}::apply"))
        try:
            return k_body, {p: evaluate(a, here) for p, a in zip(params, apply_args, strict=True)}
        except Unmappable:
            continue
    return None, env


_CONVERTER = re.compile(r"^\s*(\w+)\s*\(\s*(\w+)\s*\)\s*$")
_RETURNED = re.compile(r'==\s*"([^"\\]*)"\s*\)\s*\{?\s*return\s+([\w:]+)\s*;')
_ENUM = re.compile(  # enum [class] NAME [: type] { ... } [NAME]  (a typedef names it after)
    r"\benum\s+(?:class\s+|struct\s+)?(\w*)\s*(?::\s*[\w:]+\s*)?\{([^{}]*)\}\s*(\w*)"
)


def _mode_number(expr: str, env: dict, refs):
    """The value of `expr`; a mode string passed through the repository's converter
    (`convert_reduce_type(reduce_type)`, whose body says `if (s == "mean") return
    reduce_t::MEAN;`) is the number of the enumerator it returns, as the launcher gets it."""
    try:
        return evaluate(expr, env)
    except Unmappable:
        m = _CONVERTER.match(expr)
        if not m or not isinstance(env.get(m.group(2)), str):
            raise
    item = refs.definition(m.group(1), host_side=True)
    body = refs.text(item) if item is not None else ""  # (its string literals kept)
    for literal, returned in _RETURNED.findall(body):
        if literal == env[m.group(2)]:
            enum, _, member = returned.rpartition("::")
            known = _enumerators(refs)
            number = known.get((enum.split("::")[-1], member), known.get(("", member)))
            if number is not None:
                return number
    raise Unmappable(f"{expr}: no enumerator returned for {env[m.group(2)]!r}")


def _enumerators(refs) -> dict[tuple[str, str], int]:
    """Every enumerator the repository's sources define, with its number, by (its enum's
    name, its name) and by ("", its name) (read once)."""
    found = getattr(refs, "_kminer_enumerators", None)
    if found is not None:
        return found
    found = {}
    for model in refs.disc.models.values():
        for m in _ENUM.finditer(model.code):
            number = -1
            for entry in m.group(2).split(","):
                name, _, value = entry.partition("=")
                if not name.strip():
                    continue
                try:
                    number = int(value.strip(), 0) if value.strip() else number + 1
                except ValueError:
                    break  # an enumerator defined by an expression: the rest is unknown
                for enum in {m.group(1) or m.group(3), ""}:
                    found.setdefault((enum, name.strip()), number)
    refs._kminer_enumerators = found
    return found
