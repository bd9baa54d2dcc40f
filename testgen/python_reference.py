"""The repository's own PyTorch reference for an op, found the way its tests use it.

A test that checks a kernel calls the op (which reaches the extension) and a pure-PyTorch
function it trusts (`out_ref = causal_conv1d_ref(x_ref, weight, ...)`), in either order. The
recorder keeps both: the extension call and the calls of the repository's functions that may be
references (helpers of its test files, functions named `*_ref`, `*_pytorch`, `forward_native`...),
grouped by test. Here the two are paired by value, with no name matched and no model asked:

- each tensor parameter of the function is the binding argument holding the same values in
  every pair; a number or string is a constant, the binding argument equal to it, or a table
  from a binding argument (`silu_activation` True -> `activation="silu"`), all read off the pairs;
- its outputs go where the binding's go: returned when the host function returns tensors, else
  copied into the tensor arguments it writes (same shape, not an input of the function);
- the binding arguments the function does not read must have the values they had in the pairs
  (`seq_idx` None): the calls that differ are outside what the reference was checked on, so they
  are not cases (and the adapter refuses them as invalid input).

The function is vendored with what it needs from its module (imports of torch, numpy and the
standard library, module-level helpers and constants, helpers imported from the repository's
other modules) plus the adapter `reference(<host parameters>)`, and is run in the sandbox on
recorded calls before a test relies on it. The GPU verdict judges the pairing further: a wrong
one makes a test that fails, never one that passes.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
from dataclasses import dataclass, field, replace
from pathlib import Path

from miner.candidate import Candidate, Reference
from testgen import pysources
from testgen.inputs import RecordedCall, RefCall
from testgen.sandbox import run_checker
from testgen.standalone import REFCHECK
from testgen.vendor import vendor_function

CHECK_TIMEOUT_S = 120.0
_SCALARS = (bool, int, float, str, type(None))


@dataclass
class Pairing:
    """How a repository function stands in for the binding: where each of its parameters
    comes from, where each of its outputs goes, and what the other binding arguments were."""

    function: str
    file: str
    params: dict = field(
        default_factory=dict
    )  # name -> ("arg", k[, order]) | ("const", v) | ("table", k, {}) | ("list", [k...])
    # | ("dtype", k)
    outputs: list = field(default_factory=list)  # per output: ("return",) | ("arg", k) | None
    fixed: dict = field(default_factory=dict)  # binding position -> the kind it had in the pairs
    pairs: int = 0
    arrays: list = field(default_factory=list)  # parameters the tests passed as numpy arrays
    unchecked: list = field(default_factory=list)  # output buffers the function does not fill
    other_outputs: list = field(default_factory=list)  # other `outputs` the pairs allow

    def output_orders(self) -> list[Pairing]:
        """This pairing once per `outputs` the pairs allow (a square output's orders), each
        tried in turn since the pairs cannot tell them apart."""
        return [
            replace(self, outputs=o, other_outputs=[]) for o in [self.outputs, *self.other_outputs]
        ]

    def covers(self, args: list) -> bool:
        if any(_kind(args[k]) != kind for k, kind in self.fixed.items() if k < len(args)):
            return False
        return all(
            repr(_plain(args[src[1]])) in src[2]
            for src in self.params.values()
            if src[0] == "table"
        )


def _kind(value) -> str:
    """What a binding argument the reference does not read must stay: None, a tensor, a value."""
    if value is None:
        return "None"
    if hasattr(value, "shape"):
        return "tensor" if value.numel() else "empty tensor"  # an unused slot: torch.empty([0])
    return repr(_plain(value))


def _tensor(value):
    """An output as a tensor (a reference written in numpy returns arrays)."""
    if type(value).__module__ == "numpy" and hasattr(value, "shape"):
        import torch

        return torch.from_numpy(value.copy())
    return value


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _same_tensor(a, b) -> bool:
    import torch

    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.shape == b.shape
        and a.dtype == b.dtype
        and bool(
            torch.equal(a.nan_to_num(), b.nan_to_num())
            if a.is_floating_point()
            else torch.equal(a, b)
        )
    )


def _made_the_inputs(raw: list) -> bool:
    """Whether, in every pair, the function read no tensor and returned values the binding
    then took as an argument: it made the op's inputs (longcw/RoIAlign.pytorch's
    `generate_data(batch_size, depth, ...)`, whose image went on into the op), and compared
    with the op's output it would blame a correct kernel. (A reference reads the op's data.)"""

    def fed(call, ref) -> bool:
        if any(hasattr(a, "shape") for a in [*ref.args, *ref.kwargs.values()]):
            return False
        return any(
            _same_tensor(_tensor(r), a) and a.numel() > 1 and not _blank(a)
            for r in ref.result
            for a in call.args
        )

    return bool(raw) and all(fed(call, ref) for call, ref in raw)


def _signature(repo: Path, file: str, name: str) -> list[str] | None:
    """The function's parameter names (positional then keyword-only); None for *args."""
    tree = pysources.tree(repo / file)
    if tree is None:
        return None
    for node in [*tree.body, *pysources.lifted(repo / file)]:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            a = node.args
            if a.vararg:
                return None
            return [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
    return None


def _bind(ref: RefCall, params: list[str]) -> dict | None:
    if len(ref.args) > len(params) or any(k not in params for k in ref.kwargs):
        return None
    return {**dict(zip(params, ref.args, strict=False)), **ref.kwargs}


def _tensor_sources(pairs: list, name: str) -> set[tuple] | None:
    """(binding position, None) for each argument that holds this parameter's tensor (or None
    where it is None) in every pair; (position, order) for one that holds it with its
    dimensions reordered (`x.permute(order)`: a wrapper that hands the extension channels
    first, where the function takes them last)."""
    found = None
    for call, values in pairs:
        v = values.get(name)
        here = set()
        for k, a in enumerate(call.args):
            if (v is None and a is None) or (v is not None and _same_tensor(a, v)):
                here.add((k, None))
            elif (order := _reordered(a, v)) is not None:
                here.add((k, order))
        found = here if found is None else found & here
    return found


def _reordered(a, v) -> tuple | None:
    """The order of v's dimensions that makes it a (a different shape, same values)."""
    import itertools

    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(v, torch.Tensor)) or a.dtype != v.dtype:
        return None
    if a.shape == v.shape or sorted(a.shape) != sorted(v.shape) or not 2 <= v.dim() <= 5:
        return None
    for order in itertools.permutations(range(v.dim())):
        moved = v.permute(order)
        if moved.shape == a.shape and _same_tensor(a, moved.contiguous()):
            return order
    return None


def _a_size(pairs: list, k: int) -> bool:
    """Whether binding argument k is, in every pair, the length of one same dimension of one
    same tensor argument."""
    where = None
    for call, _ in pairs:
        v = call.args[k]
        if not isinstance(v, int) or isinstance(v, bool):
            return False
        here = {
            (t, d)
            for t, a in enumerate(call.args)
            if hasattr(a, "shape")
            for d, n in enumerate(a.shape)
            if n == v
        }
        where = here if where is None else where & here
        if not where:
            return False
    return True


def _blank(t) -> bool:
    """A tensor holding no data: every element the same (an output buffer made by zeros)."""
    flat = t.reshape(-1)
    return bool(flat.numel()) and bool((flat == flat[0]).all())


def _scalar_source(pairs: list, name: str):
    import torch

    values = [vals[name] for _, vals in pairs]
    if all(isinstance(v, torch.dtype) for v in values):  # `dtype`: the dtype of an argument
        width = min(len(c.args) for c, _ in pairs)
        for k in range(width):
            typed = [getattr(c.args[k], "dtype", None) for c, _ in pairs]
            if typed == values:
                return ("dtype", k)
    if all(repr(v) == repr(values[0]) for v in values) and isinstance(values[0], (*_SCALARS, list)):
        return ("const", values[0])
    width = min(len(c.args) for c, _ in pairs)
    calls = [c for c, _ in pairs]
    for k in range(width):  # the binding argument equal to it
        if all(
            not hasattr(c.args[k], "shape") and c.args[k] == v
            for c, v in zip(calls, values, strict=True)
        ):
            return ("arg", k)
    for k in range(width):  # or a table from one
        if any(hasattr(c.args[k], "shape") for c in calls):
            continue
        table: dict = {}
        consistent = all(
            table.setdefault(repr(_plain(c.args[k])), v) == v
            for c, v in zip(calls, values, strict=True)
        )
        if consistent and all(isinstance(v, _SCALARS) for v in table.values()):
            return ("table", k, table)
    return _list_source(calls, values, width)


def _list_source(calls: list, values: list, width: int):
    """A list parameter spelled out by several binding arguments (`padding=[2, 1]` for
    `padx0=2, padx1=2, pady0=1, pady1=1`): the first argument equal to each element, in order;
    where the test passed one number instead, each argument picked equals it."""
    lists = [v for v in values if isinstance(v, (list, tuple))]
    if not lists or any(len(v) != len(lists[0]) for v in lists):
        return None
    if not all(isinstance(x, (int, float)) for v in values for x in (v if v in lists else [v])):
        return None
    picked: list[int] = []
    for i in range(len(lists[0])):
        for k in range(picked[-1] + 1 if picked else 0, width):
            if all(
                not hasattr(c.args[k], "shape")
                and c.args[k] == (v[i] if isinstance(v, (list, tuple)) else v)
                for c, v in zip(calls, values, strict=True)
            ):
                picked.append(k)
                break
        else:
            return None
    return ("list", picked)


def _outputs(pairs: list, used: set[int], returns: str) -> tuple[list, list] | None:
    """Where each output of the function goes: returned (the host function returns tensors)
    or into the binding's tensor argument of its shape that is no input of the function, an
    integer one for integers (knn's indices, not its distances beside them); of its shape with
    the dimensions reordered where no argument has it as it is (a wrapper that transposes what
    the extension wrote: ("arg", k, order) for `out.permute(order)`), one order for all pairs."""
    void = returns.strip() in ("void", "")
    single = not void and "vector" not in returns and "tuple" not in returns
    width = max(len(r.result) for _, r in pairs)
    targets: list = []
    taken: set[int] = set()
    others: dict[int, list] = {}  # output -> the other orders its argument's shape allows
    for j in range(width):
        free, floating = None, {}
        for call, ref in pairs:
            out = ref.result[j] if j < len(ref.result) else None
            if not hasattr(out, "shape"):
                continue
            here = {
                (k, order)
                for k, a in enumerate(call.args)
                if k not in used and k not in taken and hasattr(a, "shape")
                for order in _orders(out.shape, a.shape)
            }
            free = here if free is None else free & here
            kind = out.is_floating_point()
            floating.update({k: call.args[k].is_floating_point() == kind for k, _ in here})
        if free is None:  # never a tensor: nothing to compare
            targets.append(None)
        elif not void and (not single or j == 0):
            targets.append(("return",))
        elif free:
            k, order = min(free, key=lambda t: (not floating.get(t[0], True), t[1] is not None, t))
            taken.add(k)
            targets.append(("arg", k) if order is None else ("arg", k, list(order)))
            others[j] = [("arg", k, list(o)) for kk, o in sorted(free, key=str) if kk == k and o]
            others[j] = [t for t in others[j] if t != targets[-1]]
        elif void:
            return None  # an output with nowhere to go
        else:
            targets.append(None)
    if not any(targets):
        return None
    alternatives = [  # square outputs: the pairs cannot tell
        [*targets[:j], t, *targets[j + 1 :]] for j, ts in others.items() for t in ts
    ]
    return targets, alternatives[:3]


def _orders(shape, target) -> list:
    """None when `shape` is `target`; else each order of its dimensions that makes it so."""
    import itertools

    found = [None] if tuple(shape) == tuple(target) else []
    if len(shape) == len(target) and 2 <= len(shape) <= 5 and sorted(shape) == sorted(target):
        for order in itertools.permutations(range(len(shape))):
            if list(order) != sorted(order) and [shape[d] for d in order] == list(target):
                found.append(order)
    return found


def _positional(call: RecordedCall) -> list | None:
    return None if call.kwargs else list(call.args)


def pair(
    refs: list[RefCall], binding: str, repo: Path, returns: str, to_host=_positional
) -> list[Pairing]:
    """Every repository function the tests pair with `binding` whose arguments and outputs map
    onto those of the host function the label exposes (`to_host` carries a binding call down
    to them, None where it cannot), most pairs first."""
    groups: dict[tuple[str, str], list[tuple[RecordedCall, RefCall]]] = {}
    for ref in refs:
        for call in ref.partners:
            host = to_host(call) if call.function == binding else None
            if host is not None:
                host_call = RecordedCall(call.function, host, {}, call.test_file)
                groups.setdefault((ref.file, ref.function), []).append((host_call, ref))
    found = []

    def lifted(where: tuple) -> bool:  # a test's expression, after a function with the pairs
        return any(fn.name == where[1] for fn in pysources.lifted(repo / where[0]))

    for (file, name), raw in sorted(groups.items(), key=lambda g: (-len(g[1]), lifted(g[0]))):
        params = _signature(repo, file, name)
        if params is None or _made_the_inputs(raw):
            continue
        bound = [(c, r, _bind(r, params)) for c, r in raw]
        pairing = _pair_all([(c, r, v) for c, r, v in bound if v is not None], file, name, returns)
        if pairing is not None:
            arrays = {params[a] if isinstance(a, int) else a for _, r in raw for a in r.arrays}
            pairing.arrays = sorted(a for a in arrays if a in pairing.params)
            found.append(pairing)
    return found


def _pair_all(
    bound: list, file: str, name: str, returns: str, buffers: frozenset = frozenset()
) -> Pairing | None:
    """Keep the pairs on which every tensor parameter finds its binding argument (a test's
    other ops pair by accident and drop out), then read the mapping off them. `buffers`:
    binding positions the function may leave unread (a gradient buffer a backward is handed
    and also returns)."""
    kept: list = []
    tensor_names = {n for _, _, v in bound for n, x in v.items() if hasattr(x, "shape")}
    for call, ref, values in bound:
        trial = [(c, v) for c, _, v in kept] + [(call, values)]
        if all(_tensor_sources(trial, n) for n in tensor_names if n in values):
            kept.append((call, ref, values))
    if not kept:
        return None
    names = sorted({n for _, _, v in kept for n in v})
    if any(set(v) != set(names) for _, _, v in kept):  # keyword sets differ: keep the common
        common = set.intersection(*(set(v) for _, _, v in kept))
        kept = [t for t in kept if set(t[2]) == common] or kept
        names = sorted(common)
    pairs = [(c, v) for c, _, v in kept]
    sources: dict = {}
    for n in names:
        if n in tensor_names:
            ks = _tensor_sources(pairs, n)
            if not ks:
                return None
            k, order = min(ks, key=lambda s: (s[1] is not None, s[0]))  # as it is, if it can
            sources[n] = ("arg", k) if order is None else ("arg", k, list(order))
        else:
            src = _scalar_source(pairs, n)
            if src is None:
                return None
            sources[n] = src
    used = {s[1] for s in sources.values() if s[0] == "arg"}
    used_pairs = [(c, r) for c, r, _ in kept]
    choices = _outputs(used_pairs, used, returns)
    if choices is None:
        return None
    outputs, other_outputs = choices
    written = {t[1] for t in outputs if t and t[0] == "arg"}
    tables = {s[1] for s in sources.values() if s[0] in ("table", "dtype")}
    tables |= {k for s in sources.values() if s[0] == "list" for k in s[1]}
    width = min(len(c.args) for c, _ in pairs)
    fixed, unchecked = {}, []
    for k in range(width):
        if k in used or k in written or k in tables or k in buffers:
            continue
        kinds = {_kind(c.args[k]) for c, _ in pairs}
        if any(_kind(c.args[k]) == "tensor" and c.args[k].is_floating_point() for c, _ in pairs):
            if written and all(_blank(c.args[k]) for c, _ in pairs):
                unchecked.append(k)  # a second output (knn's distances) the function skips
                continue
            return None  # data the function neither reads nor writes: not the binding's op
        if _a_size(pairs, k):  # the length of a dimension, which the function reads off its
            continue  # tensors (knn's b, n, m): cases of other shapes change it with them
        if len(kinds) == 1:
            fixed[k] = kinds.pop()
        # a number that varies over the pairs and reaches no parameter: not read by the ref
    return Pairing(
        name,
        file,
        sources,
        outputs,
        fixed,
        len(pairs),
        unchecked=unchecked,
        other_outputs=other_outputs,
    )


def adapter(
    p: Pairing, host_params: list[str], name: str = "reference", helpers: bool = True
) -> str:
    """`reference(<host parameters>)`: the function called with what the pairs showed (a
    second adapter in the same file takes another `name`, and the helpers once)."""
    args = ", ".join(host_params)
    fixed = f"_FIXED_{name.upper().strip('_')}"
    lines = [
        "",
        "",
        "# kminer's adapter: the host function's arguments, as the repository's tests pair them",
        f"# with `{p.function}` ({p.pairs} recorded pairs), and its outputs back where the",
        "# kernel's go.",
        f"{fixed} = {p.fixed!r}",
        "",
    ]
    if p.unchecked:  # (the test leaves these out of its comparison)
        lines += [f"UNCHECKED = {p.unchecked!r}  # outputs `{p.function}` does not compute", ""]
    if helpers:
        lines += ["", inspect.getsource(_plain), "", inspect.getsource(_kind), ""]
        lines += [inspect.getsource(_tensor), ""]
    lines += [
        f"def {name}({args}):",
        f"    args = [{args}]",
        f"    for k, kind in {fixed}.items():",
        "        if _kind(args[k]) != kind:",
        "            raise RuntimeError(f'kminer: argument {k} is {_kind(args[k])}, the "
        "reference was paired only with {kind}')",
        "    kwargs = {}",
    ]
    for name, src in p.params.items():
        if src[0] == "arg" and name in p.arrays:  # the tests passed it as a numpy array
            lines.append(f"    kwargs[{name!r}] = args[{src[1]}].detach().cpu().numpy()")
        elif src[0] == "arg" and len(src) > 2:  # handed to the binding reordered
            back = [src[2].index(d) for d in range(len(src[2]))]
            lines.append(f"    kwargs[{name!r}] = args[{src[1]}].permute({back}).contiguous()")
        elif src[0] == "arg":
            lines.append(f"    kwargs[{name!r}] = args[{src[1]}]")
        elif src[0] == "dtype":
            lines.append(f"    kwargs[{name!r}] = args[{src[1]}].dtype")
        elif src[0] == "const":
            lines.append(f"    kwargs[{name!r}] = {src[1]!r}")
        elif src[0] == "list":
            lines.append(f"    kwargs[{name!r}] = [{', '.join(f'args[{k}]' for k in src[1])}]")
        else:
            lines += [
                f"    table = {src[2]!r}",
                f"    key = repr(_plain(args[{src[1]}]))",
                "    if key not in table:",
                f"        raise RuntimeError(f'kminer: no recorded pair has argument {src[1]} = "
                "{key}')",
                f"    kwargs[{name!r}] = table[key]",
            ]
    lines += [
        f"    result = {p.function}(**kwargs)",
        "    outs = list(result) if isinstance(result, (tuple, list)) else [result]",
        "    outs = [_tensor(o) for o in outs]",
        "    returned = []",
    ]
    for j, target in enumerate(p.outputs):
        if target is None:
            continue
        if target[0] == "return":
            lines.append(f"    returned.append(outs[{j}] if len(outs) > {j} else None)")
        else:
            moved = f".permute({target[2]})" if len(target) > 2 else ""
            lines += [
                f"    if len(outs) > {j} and outs[{j}] is not None:",
                f"        args[{target[1]}].copy_(outs[{j}]{moved})",
            ]
    lines += [
        "    returned = [r for r in returned if r is not None]",
        "    if not returned:",
        "        return None",
        "    return returned[0] if len(returned) == 1 else returned",
        "",
    ]
    return "\n".join(lines)


def find_python_reference(
    cand: Candidate,
    refs: list[RefCall],
    binding: str,
    host: list[tuple[str, str]],
    returns: str,
    repo: Path,
    workdir: Path,
    to_host=_positional,
) -> tuple[Reference, Pairing] | str:
    """The repository's PyTorch function that its tests compare `binding` against, vendored
    with its adapter under references/, or why there is none."""
    if not binding or not host:
        return "no binding or host signature to pair a PyTorch function with"
    if not any(c.function == binding for r in refs for c in r.partners):
        return f"no test calls a PyTorch function alongside {binding}"
    problems = []
    hosts = [to_host(c) for r in refs for c in r.partners if c.function == binding]
    tried = [o for p in pair(refs, binding, repo, returns, to_host)[:3] for o in p.output_orders()]
    for p in tried:
        body = vendor_function(repo, p.file, p.function)
        if isinstance(body, str) and body.startswith("!"):
            problems.append(f"{p.function}: {body[1:]}")
            continue
        code = (
            f'"""The repository\'s own PyTorch function `{p.function}` ({p.file}), vendored\n'
            f'with what it needs, as the CPU reference; paired with `{binding}` by kminer."""\n\n'
            + body
            + adapter(p, [n for _, n in host])
        )
        calls = [a for a in hosts if a is not None and p.covers(a)][:3]
        ref = checked_reference(cand, code, p, host, workdir, calls)
        if isinstance(ref, str):
            problems.append(f"{p.function}: {ref}")
            continue
        return ref, p
    if not problems:
        return f"no PyTorch function the tests call maps onto {binding}'s arguments and outputs"
    return "; ".join(problems)[:600]


def checked_reference(
    cand: Candidate, code: str, p: Pairing, host: list, workdir: Path, calls: list, function=""
) -> Reference | str:
    """The reference written under references/ once it runs on `calls` in the sandbox."""
    checked = run_checker(
        REFCHECK, {"code.py": code, "calls.pt": calls[:3]}, "the reference", CHECK_TIMEOUT_S
    )
    if isinstance(checked, str):
        return checked.splitlines()[-1][:200] if checked else "the check failed"
    rel = f"references/{cand.id}.py"
    (workdir / "references").mkdir(exist_ok=True)
    (workdir / rel).write_text(code, encoding="utf-8")
    return Reference(
        kind="python",
        function=function or p.function,
        file=p.file,
        path=rel,
        hash=hashlib.sha256(code.encode()).hexdigest()[:20],
        exposed="reference",
        signature=[t for t, _ in host],
    )
