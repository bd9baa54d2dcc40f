"""The CPU op's own loop over the rule book its CUDA twin hands a pointer launcher.

A sparse convolution's CUDA op builds a rule book (lists of input/output row pairs, one list per
filter offset) and hands it, with raw pointers into its tensors and numbers read off their
shapes, to a launcher that runs one kernel per list (SparseConvNet's
`dConvolution_forward2(iF, oF, w, _rules, ip, ip * nGroups, op, op * nGroups, nGroups)`). Its
CPU twin gets the same rule book by the same call (`m.getRuleBook(inputSize, outputSize, ...)`)
and loops over it with tensor code (`rule_index_select`, `at::matmul`, `rule_index_add_`). No
CPU function takes what the launcher takes, but that loop computes what the launcher computes,
given the CPU op's tensors back. Those come from the launcher's arguments: the tensor whose
`data_ptr` a pointer argument is, viewed in the shape the CUDA op gives it (`weight.size(2)` is
`ip`, passed as `input_nPlanes`; `output_features.resize_({nActiveOut, op * nGroups})` and
`op * nGroups` passed as `output_stride`). The helper made here has the launcher's parameters,
tensors in place of pointers, and runs the lifted declarations and loop; the relations the CUDA
op guarantees between the numbers and the shapes are checked, so a drafted call no CUDA op could
make is refused by the reference rather than blamed on the kernel.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from miner.filemodel import Item
from miner.textprep import IDENT, bracket_end, split_top
from testgen.argmap import call_args, names_in, plain_name
from testgen.grad_reference import grad_base
from testgen.group_twin import _LOOPS, groups_index
from testgen.probe_slots import group_width
from wrappers.opmap import TWINS

_DEFINITION = re.compile(
    r"(?:^|(?<=[;{}]))\s*(?:const\s+)?[A-Za-z_][\w:<>,\s]*?[\s&*]+([A-Za-z_]\w*)\s*=\s*([^;{}]+);"
)
_POINTER = re.compile(r"^([A-Za-z_]\w*)\s*\.\s*(?:data_ptr|data)\s*(?:<[^<>()]*>)?\s*\(\s*\)$")
_SIZE = re.compile(r"([A-Za-z_]\w*)\s*\.\s*size\s*\(\s*(\d+)\s*\)")
_RESIZE = re.compile(r"\b([A-Za-z_]\w*)\s*\.\s*resize_\s*\(\s*\{([^{}]*)\}\s*\)")
_CALLED = re.compile(r"(?<![\w.:>])([A-Za-z_]\w*)\s*(?:<[^<>;(){}]*>)?\s*\(")
_RETURN = re.compile(r"\breturn\s+([A-Za-z_]\w*)\s*;")


def _flat(expr: str) -> str:
    """The expression without spaces or the parentheses around all of it."""
    flat = "".join(expr.split())
    while flat.startswith("(") and bracket_end(flat, 0, "(", ")") == len(flat):
        flat = flat[1:-1]
    return flat


def definitions(body: str) -> dict[str, tuple[str, int, int]]:
    """name -> (initializer, start, end) of each local defined with a type (`auto &r = ...;`,
    `Int ip = w.size(2);`), the first definition of a name only."""
    out: dict[str, tuple[str, int, int]] = {}
    for m in _DEFINITION.finditer(body):
        out.setdefault(m.group(1), (m.group(2).strip(), m.start(), m.end()))
    return out


_SIMPLE = re.compile(r"[\w.:]+\s*(?:<[^<>()]*>)?\s*(?:\([^()]*\))?")


def _expand(expr: str, defs: dict, depth: int = 3) -> str:
    """`expr` with the locals it reads replaced by their initializers, `depth` levels down
    (parenthesized unless one term: `ip * nGroups` -> `weight.size(2) * weight.size(1)`)."""

    def initializer(m: re.Match) -> str:
        if m.group(0) not in defs:
            return m.group(0)
        init = defs[m.group(0)][0]
        return init if _SIMPLE.fullmatch(init) else f"({init})"

    for _ in range(depth):
        new = IDENT.sub(initializer, expr)
        if new == expr:
            break
        expr = new
    return expr


def op_loop(
    refs,
    launcher: Item,
    params: list[tuple[str, str]],
    paths: list[list[Item]],
    host_side: Callable[[Item], bool],
) -> tuple[Item, str, str, list[str]] | str | None:
    """(the CPU op, the helper's name, its code, the repository functions it calls) when a CUDA
    op hands `launcher` (exposed by an adapter of `params`) a rule book its CPU twin loops over;
    a reason when the twin is there but its loop cannot be rebuilt; else None."""
    groups = groups_index(params)
    if groups is None:
        return _one_group(refs, launcher, params, paths, host_side)
    why = None
    for path in paths:
        if len(path) < 2 or path[0] is not launcher:
            continue
        caller = path[1]
        args = call_args(refs.body(caller), launcher.names[0])
        if args is None or len(args) != len(params):
            continue
        for item in cpu_twins(refs, caller, host_side):
            found = lift(refs, launcher, params, groups, refs.body(caller), args, item)
            if isinstance(found, tuple):
                return (item, *found)
            why = why or found
    return why


def cpu_twins(refs, caller: Item, host_side: Callable[[Item], bool]) -> list[Item]:
    """The host-side definitions named as `caller`'s CPU twins by the repository's CUDA → CPU
    naming (wrappers.opmap.TWINS: `cuda_Convolution_updateOutput`, `cpu_...`)."""
    out = []
    for a, b in TWINS:
        name = caller.names[0].replace(a, b)
        item = refs.definition(name, host_side=True) if name != caller.names[0] else None
        if item is not None and host_side(item):
            out.append(item)
    return out


def _one_group(refs, launcher: Item, params: list, paths: list, host_side) -> tuple | str | None:
    """A launcher taking one group (a pointer and a count: `dConvolution_forward(iF, oF, w,
    rbB, nHotB, ...)`) that a rule-book launcher calls once per group with its own other
    arguments: the rule-book launcher's helper on a book of that one group."""
    l_sig = refs.signature(launcher)
    why = None
    for path in paths:
        if len(path) < 3 or path[0] is not launcher or l_sig is None:
            continue
        outer = path[1]
        args = call_args(refs.body(outer), launcher.names[0])
        o_sig = refs.signature(outer)
        if args is None or o_sig is None or len(args) != len(params):
            continue
        o_names = [n for _, n in o_sig.params]
        passed = [plain_name(a) for a in args]
        odd = [k for k, name in enumerate(passed) if name not in o_names]
        missing = [n for n in o_names if n not in passed]
        if len(odd) != 2 or odd[1] != odd[0] + 1 or len(missing) != 1:
            continue
        pointer, count = l_sig.params[odd[0]][0], l_sig.params[odd[1]][0]
        if "*" not in pointer or "*" in count:
            continue
        o_params = [
            ("std::vector<std::vector<int32_t>>", n)
            if n == missing[0]
            else ("at::Tensor" if "*" in t else "int64_t", n)
            for t, n in o_sig.params
        ]
        found = op_loop(
            refs, outer, o_params, [q[1:] for q in paths if q[1:2] == [outer]], host_side
        )
        if not isinstance(found, tuple):
            why = why or found
            continue
        cpu, outer_helper, outer_code, called = found
        width = group_width(outer_code, missing[0])
        if width is None:
            return f"no entry width of {missing[0]} in {cpu.names[0]}'s loop"
        element = re.sub(r"\bconst\b|\*", " ", pointer).strip()
        mine = {passed[k]: params[k][1] for k in range(len(params)) if k not in odd}
        group, hot = params[odd[0]][1], params[odd[1]][1]
        book = f"kminer_book_{launcher.names[0]}"
        outer_args = ", ".join(book if n == missing[0] else mine.get(n, n) for _, n in o_sig.params)
        returns = l_sig.returns.strip()
        types = _TYPENAME.findall(l_sig.template or "")
        outer_helper += f"<{types[0]}>" if types else ""
        body = (
            f'  TORCH_CHECK({group}.numel() >= {width} * {hot}, "kminer: {hot} entries of '
            f'{width} indices");\n'
            f"  auto kminer_first = {group}.data_ptr<{element}>();\n"
            f"  std::vector<std::vector<{element}>> {book}{{\n"
            f"      std::vector<{element}>(kminer_first, kminer_first + {width} * {hot})}};\n"
            f"  {'' if returns == 'void' else 'return '}{outer_helper}({outer_args});\n"
        )
        name = f"kminer_onegroup_{launcher.names[0]}"
        code = outer_code + helper_code(name, l_sig, params, None, body)
        return cpu, name, code, called
    return why


def lift(refs, launcher, params, groups, cuda_body, args, cpu) -> tuple[str, str, list[str]] | str:
    """The helper lifting `cpu`'s loop over the rule book `args[groups]` gives the launcher."""
    cuda_defs = definitions(cuda_body)
    source = _flat(_expand(args[groups], cuda_defs))
    cpu_code = refs.body(cpu)
    cpu_defs = definitions(cpu_code)
    rules = next((n for n, (e, *_) in cpu_defs.items() if _flat(e) == source), None)
    if rules is None:
        return f"{cpu.names[0]} does not get its groups as {launcher.names[0]}'s caller does"
    loop = next((m for r in _LOOPS for m in r.finditer(cpu_code) if m.group("g") == rules), None)
    if loop is None:
        return f"{cpu.names[0]} has no loop over {rules}"
    end = bracket_end(cpu_code, loop.end() - 1, "{", "}")
    if not end:
        return f"{cpu.names[0]}'s loop over {rules} does not close"
    return lift_span(
        refs, launcher, params, groups, cuda_body, args, cpu, (loop.start(), end), rules
    )


def lift_span(
    refs,
    launcher,
    params,
    groups,
    cuda_body,
    args,
    cpu,
    span: tuple[int, int],
    rules: str = "",
    in_place: bool = False,
) -> tuple[str, str, list[str]] | str:
    """The helper running the CPU op's code at `span` of its body (a loop over the rule book
    `rules`, a statement) on the CPU op's tensors rebuilt from the launcher's arguments `args`
    (as the CUDA op `cuda_body` passes them), with the declarations before it that it reads;
    `in_place`: refusing a call on which that code resizes one of those tensors."""
    cuda_defs = definitions(cuda_body)
    cpu_code, cpu_text = refs.body(cpu), refs.text(cpu)
    cpu_defs = definitions(cpu_code)
    start, end = span
    tensors: dict[str, str] = {}  # CPU op tensor -> the launcher parameter holding its data
    passed: list[tuple[str, str]] = []  # (flattened expression over the op's tensors, param)
    sizes: dict[str, dict[int, str]] = {}
    for k, ((type_, name), arg) in enumerate(zip(params, args, strict=True)):
        if k == groups:
            continue
        expanded = _expand(arg.strip(), cuda_defs)
        pointer = _POINTER.match(expanded)
        if pointer:
            tensors[pointer.group(1)] = name
            continue
        if "*" in type_ or "Tensor" in type_:
            return f"{launcher.names[0]}'s `{name}` is `{arg}`, no tensor's data"
        passed.append((_flat(expanded), name))
        one = _SIZE.fullmatch(expanded.strip())
        if one:
            sizes.setdefault(one.group(1), {}).setdefault(int(one.group(2)), name)
    numbers: dict[str, str] = {}  # each expression -> the first parameter given its value
    for expr, name in passed:
        numbers.setdefault(expr, name)
    ranks: dict[str, int] = {}
    for m in _RESIZE.finditer(cuda_body):
        dims = split_top(m.group(2))
        ranks[m.group(1)] = len(dims)
        for d, dim in enumerate(dims):
            name = numbers.get(_flat(_expand(dim, cuda_defs)))
            if name:
                sizes.setdefault(m.group(1), {}).setdefault(d, name)
    for tensor in tensors:  # a gradient has its tensor's shape, and the tensor its gradient's
        for other in tensors:
            related = grad_base(tensor) == other or grad_base(other) == tensor
            if related and tensor not in sizes and tensor not in ranks:
                if other in ranks:
                    ranks[tensor] = ranks[other]
                if other in sizes:
                    sizes[tensor] = dict(sizes[other])
    tail = _RETURN.search(cpu_code, end)
    kept = _kept_definitions(cpu_defs, cpu_code[start:end], tail, rules, start)
    lifted = "".join(f"  {cpu_text[s:e].strip()}\n" for s, e in kept)
    lifted += f"  {cpu_text[start:end].strip()}\n"
    l_sig = refs.signature(launcher)
    if l_sig and l_sig.returns.strip() != "void":
        if not tail:
            return f"{launcher.names[0]} returns a value {cpu.names[0]} does not"
        lifted += f"  return {tail.group(1)};\n"
    cpu_sig = refs.signature(cpu)
    if cpu_sig is None or l_sig is None:
        return f"cannot read the signatures of {cpu.names[0]} and {launcher.names[0]}"
    lifted = _renamed_types(lifted, cpu_sig.template, l_sig.template)
    if isinstance(lifted, tuple):
        return f"{cpu.names[0]}'s loop reads its template parameter `{lifted[0]}`"
    read = names_in(lifted) & {n for _, n in cpu_sig.params}
    views, defined = [], set()
    for tensor in sorted(set(tensors) | read):
        if tensor not in tensors:
            return f"not invertible: {cpu.names[0]}'s loop reads `{tensor}`, no launcher argument"
        known = sizes.get(tensor, {})
        rank = ranks.get(tensor, max(known, default=-1) + 1)
        shape = [known.get(d, "-1") for d in range(rank)]
        if shape.count("-1") > 1:
            if tensor in read:
                return (
                    f"not invertible: `{tensor}`'s shape is not in {launcher.names[0]}'s arguments"
                )
            continue
        src = tensors[tensor]
        view = f"{src}.view({{{', '.join(shape)}}})" if shape else src
        views.append(f"  auto {tensor} = {view};\n")
        defined.add(tensor)
    taken = {n for _, n in params}  # a CPU tensor named as a launcher parameter is renamed
    clash = {t: f"kminer_{t}" for t in defined if t in taken}
    checks = _checks(passed, sizes, defined) + _cleared(lifted, tensors, defined)
    if clash:
        views = [IDENT.sub(lambda m: clash.get(m[0], m[0]), v, count=1) for v in views]
        checks = IDENT.sub(lambda m: clash.get(m[0], m[0]), checks)
        lifted = IDENT.sub(lambda m: clash.get(m[0], m[0]), lifted)
    if in_place and l_sig.returns.strip() == "void":
        kept, lifted = _in_place([clash.get(t, t) for t in sorted(defined)], lifted)
        checks += kept
    name = f"kminer_oploop_{launcher.names[0]}"
    called = sorted({m.group(1) for m in _CALLED.finditer(lifted)} & set(refs.defs))
    code = helper_code(name, l_sig, params, groups, "".join(views) + checks + lifted)
    return name, code, called


def _in_place(tensors: list[str], lifted: str) -> tuple[str, str]:
    """(lines noting each tensor's shape, the lifted code followed by checks that it kept
    them): a launcher writes through its pointers in place, so a statement that resizes a
    tensor rebuilt from one (`at::sum_out` into a bias gradient drafted as long as a flat
    `d_output_features`) computes what no launch can, and the draft is refused."""
    before = "".join(f"  const auto kminer_sizes_{t} = {t}.sizes().vec();\n" for t in tensors)
    after = "".join(
        f'  TORCH_CHECK({t}.sizes().vec() == kminer_sizes_{t}, "kminer: {t} resized");\n'
        for t in tensors
    )
    return before, lifted + after


_TYPENAME = re.compile(r"\b(?:typename|class)\s+([A-Za-z_]\w*)")
_NONTYPE = re.compile(r"\b(?:int|long|Int|size_t|int64_t|int32_t|bool|unsigned)\s+([A-Za-z_]\w*)")


def _renamed_types(code: str, cpu_template: str, launcher_template: str) -> str | tuple[str]:
    """The lifted code with the CPU op's type parameter named as the launcher's; a 1-tuple of
    a template parameter the helper cannot have (`Dimension`) when the code reads one."""
    ours = _TYPENAME.findall(cpu_template or "")
    theirs = _TYPENAME.findall(launcher_template or "")
    table = dict(zip(ours, theirs, strict=False))
    read = names_in(code)
    for name in [*ours[len(theirs) :], *_NONTYPE.findall(cpu_template or "")]:
        if name in read and name not in theirs:
            return (name,)
    return IDENT.sub(lambda m: table.get(m.group(0), m.group(0)), code)


def _kept_definitions(defs: dict, loop: str, tail, rules: str, loop_at: int) -> list[tuple]:
    """Spans of the declarations before the loop that the loop (or the value returned) reads,
    and those they read: the rule book itself and whatever the loop never reads stay out."""
    wanted = names_in(loop) | ({tail.group(1)} if tail else set())
    kept: dict[str, tuple[int, int]] = {}
    todo = [n for n in wanted if n in defs and n != rules]
    while todo:
        n = todo.pop()
        init, start, stop = defs[n]
        if n in kept or start > loop_at:
            continue
        kept[n] = (start, stop)
        todo += [m for m in names_in(init) if m in defs and m != rules and m not in kept]
    return sorted(kept.values())


def _checks(passed: list, sizes: dict, defined: set[str]) -> str:
    """TORCH_CHECKs of what the CUDA op guarantees between the launcher's numbers: one it gets
    as a product of the op's sizes (`ip * nGroups` as `input_stride`) is that product of the
    parameters holding those sizes (`input_stride == input_nPlanes * nGroups`), one it gets as
    the size another holds is that one, so a call no CUDA op makes is refused (and the probe
    makes the number from the others)."""
    lines = []
    for expr, name in passed:
        read = {m.group(1) for m in _SIZE.finditer(expr)}
        if not read or not read <= defined:
            continue
        known = lambda m: sizes.get(m[1], {}).get(int(m[2]), m[0])  # noqa: E731
        product = _SIZE.sub(known, expr)
        if product != name and re.fullmatch(r"[A-Za-z_]\w*(?:\*[A-Za-z_]\w*)*", product):
            factors = " * ".join(product.split("*"))
            lines.append(f'  TORCH_CHECK({name} == {factors}, "kminer: not {factors}");\n')
    return "".join(lines)


_OUT_CALL = re.compile(r"\b\w+_out\s*\(\s*([A-Za-z_]\w*)\s*,")
_SLICE = r"\s*=\s*([A-Za-z_]\w*)\s*(?:\.\s*(?:select|narrow|slice|view)\s*\(|\[)"


def _cleared(lifted: str, tensors: dict, defined: set[str]) -> str:
    """A tensor the loop overwrites (`at::matmul_out(dw, ...)` into `d_weight.select(0, i)`)
    where the kernel may add to what it holds: the CUDA op's caller hands it cleared, so the
    reference refuses a call that does not (and the probe drafts it as zeros)."""
    lines = []
    for m in _OUT_CALL.finditer(lifted):
        target = m[1]
        whole = re.search(rf"\b{re.escape(target)}{_SLICE}", lifted)
        tensor = whole[1] if whole else target
        if tensor in defined and tensor in tensors:
            name = tensors[tensor]
            lines.append(
                f'  TORCH_CHECK({name}.eq(0).all().item<bool>(), "kminer: {name} != 0");\n'
            )
    return "".join(dict.fromkeys(lines))


def helper_code(name, l_sig, params, groups: int | None, body: str) -> str:
    """The launcher's template header and the adapter's parameters (pointers as tensors), the
    rule book at `groups` (None: none) taken as whatever list of lists the adapter passes."""
    template = (l_sig.template if l_sig else "") or ""
    inner = re.fullmatch(r"\s*template\s*<(.*)>\s*", template, re.DOTALL)
    inner = inner.group(1).strip() if inner else ""
    extra = "typename KminerGroups" if groups is not None else ""
    header = f"template <{', '.join(p for p in (inner, extra) if p)}>" if inner or extra else ""
    decl = [
        f"const KminerGroups &{n}" if i == groups else f"{t} {n}" for i, (t, n) in enumerate(params)
    ]
    returns = l_sig.returns.strip() if l_sig else "void"
    return f"{header}\n{returns} {name}({', '.join(decl)}) {{\n{body}}}\n"
