"""Which arguments to hand the repository's CPU function when a test calls the mined launcher.

A test calls the label's exposed function (the launcher) and the reference with the same
arguments. The CPU function, though, takes the op's arguments: mmcv's `roi_align_forward_cpu`
has the signature of `roi_align_forward_cuda`, which calls `ROIAlignForwardCUDAKernelLauncher`
with its own parameters, in some order. Reading those calls backwards (each launcher argument
that is a plain parameter of its caller, possibly `.contiguous()` or cast) tells which launcher
parameter carries each op parameter. An op parameter that reaches the launcher only inside a
computation (`by * 2`) cannot be recovered, and then there is no adapter: we say so.

Text only (comment-blanked code in, C++ expressions out), so it is tested without a repository.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from miner.filemodel import CPP_KEYWORDS
from miner.textprep import split_top
from wrappers.signature import Signature

_IDENT = re.compile(r"(?<![\w.:>])(?<!->)[A-Za-z_]\w*")
_PARENS = re.compile(r"^\((.*)\)$", re.DOTALL)
# wrappers that keep an argument's value: casts, moves, contiguity, dereferenced optionals
_KEEP_VALUE = (
    re.compile(r"^(?:std::)?move\s*\((.*)\)$", re.DOTALL),
    re.compile(r"^(?:static|reinterpret|const)_cast\s*<[^()]*>\s*\((.*)\)$", re.DOTALL),
    re.compile(r"^\(\s*(?:const\s+)?[\w:]+(?:\s*[*&])?\s*\)\s*(.+)$", re.DOTALL),
    re.compile(r"^(?:int|float|double|bool|long|int64_t|int32_t|size_t)\s*\((.*)\)$", re.DOTALL),
    re.compile(r"^(.*?)\s*\.\s*(?:contiguous|clone|detach)\s*\(\s*\)$", re.DOTALL),
)


# a CPU function's own parallelism (threads, workers): it changes how the CPU computes, not
# what, so a reference called without it runs on one
_PARALLELISM = re.compile(r"^(?:num_|n_?)?(?:workers|threads|jobs)$", re.IGNORECASE)


@dataclass
class Call:
    callee: str
    args: list[str]


def call_args(body: str, callee: str) -> list[str] | None:
    """Arguments of the first call of `callee` in a function's text (its body only, so the
    declarator never counts); None when it does not call it."""
    brace = body.find("{")
    if brace < 0:
        return None
    pattern = re.compile(rf"(?<![\w.>])(?:[\w]+::)*{re.escape(callee)}\s*(?:<[^<>;{{}}]*>)?\s*\(")
    m = pattern.search(body, brace)
    return paren_args(body, m.end() - 1) if m else None


def paren_args(text: str, open_at: int) -> list[str] | None:
    """The top-level arguments between the `(` at `open_at` and its `)`, spaces collapsed."""
    depth = 0
    for j in range(open_at, len(text)):
        depth += (text[j] == "(") - (text[j] == ")")
        if depth == 0:
            return [" ".join(a.split()) for a in split_top(text[open_at + 1 : j])]
    return None


def plain_name(expr: str) -> str | None:
    """The parameter an argument expression passes on unchanged in value, or None."""
    expr = expr.strip()
    for _ in range(8):
        if re.fullmatch(r"[A-Za-z_]\w*", expr):
            return expr
        for pattern in (_PARENS, *_KEEP_VALUE):
            m = pattern.match(expr)
            if m:
                expr = m.group(1).strip()
                break
        else:
            return None
    return None


def invert(caller_params: list[str], callee_params: list[str], args: list[str]) -> dict[str, int]:
    """caller parameter → index of the callee parameter that receives it unchanged."""
    out: dict[str, int] = {}
    for i, arg in enumerate(args[: len(callee_params)]):
        name = plain_name(arg)
        if name in caller_params and name not in out:
            out[name] = i
    return out


def names_in(expr: str) -> set[str]:
    """Unqualified identifiers an expression reads (not members, not `ns::` parts)."""
    return set(_IDENT.findall(expr)) - CPP_KEYWORDS - {"true", "false", "nullptr"}


def substitute(expr: str, mapping: dict[str, str]) -> str:
    """`expr` with every free occurrence of a mapped identifier replaced."""
    return _IDENT.sub(lambda m: mapping.get(m.group(0), m.group(0)), expr)


def locals_of(body: str) -> set[str]:
    """Names a function body declares or assigns (`int n = ...`, `auto t = ...`)."""
    brace = body.find("{")
    text = body[brace:] if brace >= 0 else body
    found = set(re.findall(r"[\w>&*]\s+([A-Za-z_]\w*)\s*(?:=[^=]|;|\{|\()", text))
    return found - CPP_KEYWORDS


@dataclass
class Step:
    """`caller` (with these parameter names) calls `callee` with `args`."""

    caller: str
    caller_params: list[str]
    callee: str
    callee_params: list[str]
    args: list[str]


_CAT = re.compile(r"^(?:at|torch)::cat\s*\(\s*\{(.*)\}\s*(?:,\s*(-?\d+)\s*)?\)$", re.DOTALL)
_UNSQUEEZE = re.compile(r"^([A-Za-z_]\w*)\s*\.\s*unsqueeze\s*\(\s*(-?\d+)\s*\)$")


def local_values(body: str) -> dict[str, str]:
    """A function's locals assigned once, by name: the expression each holds."""
    brace = body.find("{")
    found: dict[str, list[str]] = {}
    for m in re.finditer(
        r"(?<=[;{}])\s*(?:const\s+)?(?:auto|[\w:]*Tensor)\s+([A-Za-z_]\w*)\s*=(?!=)"
        r"\s*([^;]+);",
        body[max(brace, 0) :],
    ):
        found.setdefault(m.group(1), []).append(" ".join(m.group(2).split()))
    return {k: v[0] for k, v in found.items() if len(v) == 1}


def unjoined(joined: str, expr: str) -> dict[str, str]:
    """Each parameter an `at::cat` of parameters joins, as a view of the joined tensor
    (`joined`): `at::cat({dets, scores.unsqueeze(1)}, 1)` gives `dets` as
    `b.narrow(1, 0, b.size(1) - 1)` and `scores` as `b.select(1, b.size(1) - 1)`. Only a join
    whose parts have known widths but one (an unsqueezed part is one wide) can be undone."""
    m = _CAT.match(expr.strip())
    if not m:
        return {}
    dim = int(m.group(2) or 0)
    parts: list[tuple[str, bool]] = []  # (parameter, one wide)
    for part in split_top(m.group(1)):
        one = _UNSQUEEZE.match(part.strip())
        if one and int(one.group(2)) == dim:
            parts.append((one.group(1), True))
        elif re.fullmatch(r"[A-Za-z_]\w*", part.strip()):
            parts.append((part.strip(), False))
        else:
            return {}
    if sum(not one for _, one in parts) > 1 or len({n for n, _ in parts}) < len(parts):
        return {}
    x = joined if re.fullmatch(r"[A-Za-z_]\w*", joined) else f"({joined})"
    size = f"{x}.size({dim})"
    wide = next((i for i, (_, one) in enumerate(parts) if not one), len(parts))
    out = {}
    for i, (name, one) in enumerate(parts):
        if not one:
            out[name] = f"{x}.narrow({dim}, {i}, {size} - {len(parts) - 1})"
        elif i < wide:
            out[name] = f"{x}.select({dim}, {i})"
        else:
            out[name] = f"{x}.select({dim}, {size} - {len(parts) - i})"
    return out


def map_arguments(
    steps: list[Step],
    exposed_params: list[str],
    cpu_args: list[str],
    bridge_locals: set[str],
    cpu_fn: str,
    bridge_values: dict[str, str] | None = None,
) -> list[str] | str:
    """The CPU call's arguments over the exposed function's parameters, or why there are none.

    `steps` go upward: steps[0].callee is the exposed function, steps[-1].caller the bridge (the
    function whose parameters `cpu_args` are written in). With no steps the exposed function is
    the bridge itself. `bridge_values` (the bridge's locals: `local_values`) undo a join of the
    bridge's parameters that it passes on (`unjoined`)."""
    env = {p: p for p in exposed_params if p}
    bridge = steps[-1].caller if steps else ""
    for step in steps:
        back = invert(step.caller_params, step.callee_params, step.args)
        below, env = (
            env,
            {
                p: env[step.callee_params[i]]
                for p, i in back.items()
                if step.callee_params[i] in env
            },
        )
    if steps and bridge_values:
        last = steps[-1]
        for arg, param in zip(last.args, last.callee_params, strict=False):
            name = plain_name(arg)
            if name in bridge_values and param in below:
                for part, view in unjoined(below[param], bridge_values[name]).items():
                    if part in last.caller_params:
                        env.setdefault(part, view)
    params = set(steps[-1].caller_params) if steps else set(exposed_params)
    out = []
    for arg in cpu_args:
        if arg.strip() in params - set(env) and _PARALLELISM.match(arg.strip()):
            out.append("1")  # radius_cpu's num_workers, which the CUDA path has no use for
            continue
        for name in sorted(names_in(arg)):
            if name in env:
                continue
            if name in params:
                last = steps[-1] if steps else None
                seen = [a for a in (last.args if last else []) if name in names_in(a)]
                how = f"only as `{'`, `'.join(seen)}`" if seen else "not at all"
                return (
                    f"not invertible: {bridge}'s parameter `{name}` (an argument of {cpu_fn}) "
                    f"reaches {last.callee if last else bridge} {how}"
                )
            if name in bridge_locals:
                return f"not invertible: {cpu_fn} gets `{arg}`, a local value of {bridge}"
        out.append(substitute(arg, env))
    return out


def core_type(type_text: str) -> str:
    """A parameter type without qualifiers and references, for comparing signatures."""
    text = re.sub(r"\b(const|volatile|typename|struct)\b|&", " ", type_text)
    return " ".join(text.replace("*", " * ").split()).replace("< ", "<").replace(" >", ">")


def declared(exposed: Signature, enums: frozenset[str]) -> tuple[list[str], dict[str, str]]:
    """The exposed function's parameters as an adapter declares them, and the casts its calls
    make: an enum parameter is taken as an integer, as the label's binding takes it."""
    decl, cast = [], {}
    for t, n in exposed.params:
        c = core_type(t)
        if c in enums:
            decl.append(f"int64_t {n}")
            cast[n] = f"static_cast<{c}>({n})"
        else:
            decl.append(f"{t} {n}")
    return decl, cast


def adapter(
    exposed: Signature,
    cpu: str,
    args: list[str],
    enums: frozenset[str],
    cpu_sig: Signature | None,
    note: str,
    widen_ints: bool = False,
) -> tuple[str, str]:
    """(C++ code, what `m.def("reference", ...)` binds). The CPU function itself when it has
    the exposed signature (`cpu_sig`, None when overloaded) and takes it unchanged; else
    `kminer_ref::reference(<exposed parameters>)` calling it with `args`. Enum parameters are
    taken as integers, as the label's binding does. `widen_ints`: a CPU side reached from
    other Python than the CUDA side may take its indices as int64 where the CUDA side takes
    int32 (torch-points-kernels' `knn_interpolate` reads the Long indices its CPU knn made,
    `three_interpolate` the Int ones of its CUDA one): refused for that alone, the call is
    made again with the int32 tensors widened."""
    core = [core_type(t) for t, _ in exposed.params]
    if (
        not widen_ints
        and cpu_sig is not None
        and args == [n for _, n in exposed.params]
        and [core_type(t) for t, _ in cpu_sig.params] == core
        and core_type(cpu_sig.returns) == core_type(exposed.returns)
        and not enums.intersection(core)
    ):
        return "", f"&{cpu}"
    decl, cast = declared(exposed, enums)
    call = f"{cpu}({', '.join(substitute(a, cast) for a in args)})"
    ret = "" if exposed.returns == "void" else "return "
    body = f"  {ret}{call};\n"
    if widen_ints:
        tensors = {
            n: f"kminer_widen({n})" for t, n in exposed.params if core_type(t).endswith("Tensor")
        }
        wide = f"{cpu}({', '.join(substitute(substitute(a, cast), tensors) for a in args)})"
        done = "" if ret else " return;"
        body = (
            f"  try {{ {ret}{call};{done} }} catch (const c10::Error& e) {{\n"
            '    if (std::string(e.what()).find("expected scalar type Long but found Int")'
            " == std::string::npos) throw;\n  }\n"
            f"  {ret}{wide};\n"
        )
        body = (
            "  auto kminer_widen = [](const at::Tensor& t) {\n"
            "    return t.scalar_type() == at::kInt ? t.to(at::kLong) : t;\n  };\n" + body
        )
    code = (
        f"// kminer: {note}\nnamespace kminer_ref {{\nusing at::Tensor;\n"
        f"{exposed.returns} reference({', '.join(decl)}) {{\n{body}}}\n"
        "}  // namespace kminer_ref\n"
    )
    return code, "&kminer_ref::reference"
