"""Deliberately wrong versions of a label: a test that passes one of them is `weak_test`.

A test can only be trusted if it notices a wrong kernel, so each label gets a few mutants of the
kernel it is about (the `__global__` definition named in its first line; helpers, host code and
binding stay byte-identical): `no_write` (returns before doing anything), `off_by_one` (a loop or
guard bound moved by one) and `op_swap` (one arithmetic operator on the data flow into an output
store). Sites come from tree-sitter (the grammar `miner.treewalk` uses, qualifier macros
substituted the way discovery does) and edits are made by byte offset on the original text.

Several variants per kind come back, most reliable first, so one that does not compile or happens
to be equivalent on the test inputs can be replaced by the next. Output is deterministic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

import tree_sitter as ts

from miner.aliases import collect_aliases
from miner.textprep import blank_comments_and_strings, bracket_end, split_top
from miner.treewalk import LANGUAGE

MAX_PER_KIND = 3
_STEP = 10  # added to an op_swap site's rank when it only shifts by one (see is_unit_step)
# `*` becomes `+` and `/` becomes `-`: no division by zero, and the result still changes when a
# side is 0 or the divisor 1 (`/ count` with one sample: `* count` would be the same)
_SWAP = {"+": "-", "-": "+", "*": "+", "/": "-", "+=": "-=", "-=": "+=", "*=": "+=", "/=": "-="}
_PRIMARY = {"identifier", "number_literal", "field_expression", "subscript_expression"}
_PRIMARY |= {"call_expression", "parenthesized_expression", "qualified_identifier"}
_INT_TYPE = re.compile(r"\b(int|long|short|unsigned|size_t|u?int\d+_t|index_t|bool)\b")
_ATOMIC = re.compile(r"(atomic|gpuAtomic|fastAtomic)\w*")
_LOAD = re.compile(r"__ld\w*|\w*[Ll]oad\w*")  # calls that only read through a pointer
_STORE = re.compile(r"store|write|save|scatter", re.IGNORECASE)  # calls named as writing one
_DATA = re.compile(r"data|data_ptr|ptr")  # `t.data()`, `info.data`: pointers
_MACRO_BOUND = re.compile(r"<=?\s*\(*\s*([A-Za-z_]\w*)")  # `i < (n)` in a loop macro's body
_NESTING = {"compound_statement", "if_statement", "for_statement", "while_statement"}
_NESTING |= {"do_statement", "function_definition", "for_range_loop"}
_NAMES = ("identifier", "qualified_identifier", "template_function")
_JUMPS = ("return_statement", "break_statement", "continue_statement")


class VariantKind(StrEnum):
    NO_WRITE = "no_write"
    OFF_BY_ONE = "off_by_one"
    OP_SWAP = "op_swap"


@dataclass(frozen=True)
class Variant:
    kind: VariantKind
    description: str  # one line, also written into the text as `// kminer variant: ...`
    text: str


@dataclass(frozen=True)
class _Site:
    key: tuple  # lower: more likely to change the output and still compile
    start: int  # the replaced span, original offsets
    end: int
    new: str
    what: str
    group: int  # its statement: alternates prefer other statements


@dataclass
class _Def:
    name: str  # the variable written; "" for a store to global memory
    values: list[ts.Node]
    op: ts.Node | None = None  # the assignment operator (`+=` is itself a swap site)
    target: ts.Node | None = None  # a global store's lvalue or address (helper call: the call)
    stores: bool = False  # a helper call named as a store (`store_output<K>(out, vals, ...)`)


def derive_variants(
    label_text: str, kernel_name: str, dead: list[tuple[int, int]] = ()
) -> list[Variant]:
    """Wrong variants of `kernel_name` in the label: by kind, each kind best first; none in a
    `dead` span (a branch the test's inputs never take, see testgen.reach)."""
    k = _Kernel(label_text, kernel_name.split("::")[-1])
    out = []
    for kind, sites in [
        (VariantKind.NO_WRITE, k.no_write_sites()),
        (VariantKind.OFF_BY_ONE, k.off_by_one_sites()),
        (VariantKind.OP_SWAP, k.op_swap_sites()),
    ]:
        live = [s for s in sites if s and not any(a <= s.start < b for a, b in dead)]
        for s in _choose(live):
            desc = f"{s.what} (line {label_text.count(chr(10), 0, s.start) + 2})"
            head, _, rest = (label_text[: s.start] + s.new + label_text[s.end :]).partition("\n")
            out.append(Variant(kind, desc, f"{head}\n// kminer variant: {kind}: {desc}\n{rest}"))
    return out


def _choose(sites: list[_Site | None]) -> list[_Site]:
    """The best site, then alternates from other statements, then the rest; one per span."""
    ranked: dict[tuple[int, int], _Site] = {}
    for s in sorted((s for s in sites if s), key=lambda s: (s.key, s.start)):
        ranked.setdefault((s.start, s.end), s)
    picked: list[_Site] = []
    for s in ranked.values():
        if len(picked) < MAX_PER_KIND and s.group not in {p.group for p in picked}:
            picked.append(s)
    return picked + [s for s in ranked.values() if s not in picked][: MAX_PER_KIND - len(picked)]


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _walk(node: ts.Node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def _decl_name(node: ts.Node | None) -> tuple[str, set[str]]:
    """(name, node kinds on the way) of a declarator: `*p[4]` → p with pointer and array;
    `k<float>` → k with template_function; `ns::k` → k."""
    kinds: set[str] = set()
    while node is not None and node.type not in ("identifier", "field_identifier"):
        kinds.add(node.type)
        inner = (c for c in node.named_children if c.type in _NAMES)
        node = node.child_by_field_name("declarator") or next(inner, None)
    return (node.text.decode("latin-1") if node is not None else ""), kinds


def _kernel_only(src: str, name: str) -> str:
    """`src` with everything but its preprocessor lines and the `__global__` definitions of
    `name` blanked, offsets kept: SparseConvNet's `FOO(T, 64, 16)` statements (a macro call
    with no semicolon) make the grammar lose every definition after them."""
    code = blank_comments_and_strings(src)
    keep = [False] * len(src)
    for m in re.finditer(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", code, re.MULTILINE):
        keep[m.start() : m.end()] = [True] * (m.end() - m.start())
    head = r"(?:template\s*<[^{};]*>\s*)?__global__\b[^{};]*?\b"
    for m in re.finditer(head + re.escape(name) + r"\s*\(", code):
        open_at = code.find("{", m.end())
        end = bracket_end(code, open_at, "{", "}") if open_at >= 0 else None
        if end:
            keep[m.start() : end] = [True] * (end - m.start())
    return "".join(c if k or c == "\n" else " " for c, k in zip(src, keep, strict=True))


class _Kernel:
    """The parsed label and its kernel: body, pointers, locals, stores and definitions."""

    def _definitions(self, src: str, name: str) -> tuple:
        """(the parse's root, the `__global__` definitions of `name` in it, primary first)."""
        root = ts.Parser(LANGUAGE).parse(src.encode("latin-1")).root_node
        found = []  # the primary definition: explicit specializations only if nothing else
        for n in _walk(root):
            if n.type == "function_definition" and any(c.type == "__global__" for c in n.children):
                fname, kinds = _decl_name(n.child_by_field_name("declarator"))
                tmpl = self.txt(n.parent.child_by_field_name("parameters")).replace(" ", "")
                if fname == name:
                    found.append(("template_function" in kinds or tmpl == "<>", n.start_byte, n))
        return root, found

    def __init__(self, text: str, name: str) -> None:
        self.text, self.name = text, name
        code = blank_comments_and_strings(text)
        self.rw = collect_aliases([code]).rewrite(text, code)
        self.src = self.rw.text if self.rw else text
        root, found = self._definitions(self.src, name)
        if not found:  # a statement the grammar cannot read (a macro call with no `;`) earlier
            root, found = self._definitions(_kernel_only(self.src, name), name)
        if not found:
            raise ValueError(f"no __global__ definition of {name!r} in the label")
        fn = min(found, key=lambda f: f[:2])[2]
        self.body = fn.child_by_field_name("body")
        self.macros = self._loop_macros(root)
        # pointers: what `+`/`-` treat as pointer arithmetic; arrays: local and __shared__
        # arrays (stores into them are value flow); globals: a store through them is an output
        self.pointers, self.arrays, self.ints, params = set(), set(), set(), set()
        for d in _walk(fn):
            if d.type in ("parameter_declaration", "declaration"):
                local = d.type == "declaration"
                is_int = bool(_INT_TYPE.search(self.txt(d.child_by_field_name("type"))))
                for decl in d.children_by_field_name("declarator"):
                    (vname, kinds), value = _decl_name(decl), decl.child_by_field_name("value")
                    if not local:
                        params.add(vname)
                    if local and "array_declarator" in kinds:
                        self.arrays.add(vname)
                    if kinds & {"pointer_declarator", "array_declarator"} or (
                        value and self.is_pointer(value)  # `auto p = out + i;`
                    ):
                        self.pointers.add(vname)
                    elif is_int:
                        self.ints.add(vname)
        self.globals = (params | self.pointers) - self.arrays
        self.defs, self.stores, self.helper_stores = self._collect()

    def txt(self, node: ts.Node | None) -> str:
        return "" if node is None else self.src[node.start_byte : node.end_byte]

    def site(self, node: ts.Node, new: str, what: str, key: tuple) -> _Site | None:
        """An edit replacing `node`; None when the alias rewrite touched it."""
        s, e = node.start_byte, node.end_byte
        if self.rw:
            s, e = self.rw.to_original(s), self.rw.to_original(e)
        if self.text[s:e] != self.txt(node):
            return None
        return _Site(key, s, e, new, what, self.statement(node).start_byte)

    # structure -----------------------------------------------------------------------------
    def _loop_macros(self, root: ts.Node) -> dict[str, list[int]]:
        """Function-like macros that are loops: name → indices of the arguments bounding them."""
        out = {}
        for m in (m for m in _walk(root) if m.type == "preproc_function_def"):
            body = self.txt(m.child_by_field_name("value"))
            params = [self.txt(p) for p in m.child_by_field_name("parameters").named_children]
            bounds = [params.index(b) for b in _MACRO_BOUND.findall(body) if b in params]
            if "for" in body and bounds:
                out[self.txt(m.child_by_field_name("name"))] = list(dict.fromkeys(bounds))
        return out

    def statement(self, node: ts.Node) -> ts.Node:
        """The statement `node` is part of (for a declaration in a for header: the for)."""
        n = node
        while n.parent is not None and n.parent != self.body:
            if n.type == "declaration" and n.parent.type != "for_statement":
                break
            if n.type.endswith("_statement") and n.type != "compound_statement":
                break
            n = n.parent
        return n

    def ancestors(self, node: ts.Node):
        n = node.parent
        while n is not None and n != self.body:
            yield n
            n = n.parent

    def in_loop_header(self, node: ts.Node) -> bool:
        return any(
            a.type in ("for_statement", "for_range_loop")
            and node.end_byte <= a.child_by_field_name("body").start_byte
            for a in self.ancestors(node)
        )

    def root(self, node: ts.Node | None) -> str:
        """The variable an lvalue or address lives in: `out[i].x`, `*(out + i)`, `&s[i]` → name."""
        while node is not None and node.type != "identifier":
            if node.type == "parenthesized_expression":
                node = node.named_children[0] if node.named_children else None
            else:
                field = {"binary_expression": "left", "cast_expression": "value"}.get(node.type)
                node = node.child_by_field_name(field or "argument")
        return self.txt(node)

    def is_pointer(self, node: ts.Node) -> bool:
        while node.type == "parenthesized_expression" and node.named_children:
            node = node.named_children[0]
        op = self.txt(node.child_by_field_name("operator"))
        if node.type == "identifier":
            return self.txt(node) in self.pointers
        if node.type in ("call_expression", "field_expression"):
            last = re.split(r"\.|->", self.txt(node.child_by_field_name("function") or node))[-1]
            return bool(_DATA.fullmatch(last.split("<")[0].strip()))
        if node.type == "binary_expression" and op in ("+", "-"):
            return any(self.is_pointer(node.child_by_field_name(f)) for f in ("left", "right"))
        return node.type == "pointer_expression" and op == "&"

    def _collect(self) -> tuple[dict[str, list[_Def]], list[_Def], list[_Def]]:
        """Definitions by variable, stores to global memory, and helper calls handed a
        global pointer (stand-ins for stores when the kernel makes none itself)."""
        defs: dict[str, list[_Def]] = {}
        stores, helper_stores = [], []
        for n in _walk(self.body):
            if n.type == "assignment_expression":
                left, op = n.child_by_field_name("left"), n.child_by_field_name("operator")
                d = _Def(self.root(left), [n.child_by_field_name("right")], op, left)
                if left.type != "identifier" and d.name in self.globals:
                    stores.append(_Def("", d.values, op, left))
                else:
                    defs.setdefault(d.name, []).append(d)
            elif n.type == "init_declarator" and n.child_by_field_name("value") is not None:
                name = _decl_name(n)[0]
                defs.setdefault(name, []).append(_Def(name, [n.child_by_field_name("value")]))
            elif n.type == "call_expression" and (args := n.child_by_field_name("arguments")):
                fname = self.txt(n.child_by_field_name("function")).split("<", 1)[0].strip()
                args = [a for a in args.named_children if a.type != "comment"]
                if _ATOMIC.fullmatch(fname) and args:
                    name = self.root(args[0])
                    if name in self.globals:
                        stores.append(_Def("", args[1:], target=args[0]))
                    else:
                        defs.setdefault(name, []).append(_Def(name, args[1:]))
                elif not _LOAD.fullmatch(fname) and any(
                    self.is_pointer(a) and self.root(a) in self.globals for a in args
                ):
                    values = [a for a in args if not self.is_pointer(a)]
                    helper_stores.append(
                        _Def("", values, target=n, stores=bool(_STORE.search(fname)))
                    )
        return defs, stores, helper_stores

    # no_write ------------------------------------------------------------------------------
    def no_write_sites(self) -> list[_Site | None]:
        """`return;` as the first statement: legal before any declaration, __shared__ ones too."""
        first = next((c for c in self.body.named_children if c.type != "comment"), None)
        if first is None:
            return []
        indent = self.src[self.src.rfind("\n", 0, first.start_byte) + 1 : first.start_byte]
        new = "{\n" + (indent if indent.isspace() else "  ") + "return;"
        return [self.site(self.body.children[0], new, f"`return;` first in {self.name}", ())]

    # off_by_one ----------------------------------------------------------------------------
    def off_by_one_sites(self) -> list[_Site | None]:
        """Loop-macro bounds, then comparisons in loop and if conditions (outermost first), then
        other comparisons; the index of an output store only when there is no comparison."""
        sites: list[_Site | None] = []
        for n in _walk(self.body):
            # `CUDA_1D_KERNEL_LOOP(i, n) {...}` parses as a nested function definition, or as a
            # call statement when an argument is an expression
            call = n.type == "call_expression" and n.parent.type == "expression_statement"
            decl = (n.type == "function_definition" and n.child_by_field_name("declarator")) or n
            macro = self.txt(decl.child_by_field_name("function" if call else "declarator"))
            if (call or decl != n) and (macro in self.macros or macro.endswith("KERNEL_LOOP")):
                args = decl.child_by_field_name("arguments" if call else "parameters")
                if sp := self.site(args, "", "", ()):
                    spans, pos = [], sp.start
                    for part in split_top(self.text[sp.start + 1 : sp.end - 1], angle=False):
                        pos = self.text.index(part, pos)
                        spans.append((pos, pos + len(part)))
                        pos += len(part)  # `(index, n)`: n is not the n in index
                    bounds = [i for i in self.macros.get(macro, [1]) if i < len(spans)]
                    for rank, (a, b) in enumerate(spans[i] for i in bounds):
                        arg = self.text[a:b]
                        what = f"{macro} bound {_short(arg)} -> ({_short(arg)}) - 1"
                        sites.append(_Site((0, rank), a, b, f"({arg}) - 1", what, args.start_byte))
            elif n.type == "binary_expression" and not n.has_error:
                sites.append(self.bound_site(n))
        for d in [] if any(sites) else self.stores:
            t = d.target
            while t is not None and t.type not in ("subscript_expression", "binary_expression"):
                t = t.named_children[0] if t.named_children else None
            idx = t and (t.child_by_field_name("indices") or t.child_by_field_name("right"))
            if idx is not None and idx.type == "subscript_argument_list" and idx.named_children:
                idx = idx.named_children[0]
            if idx is not None:
                i = self.txt(idx)
                new = f"{i} + 1" if idx.type in _PRIMARY else f"({i}) + 1"
                what = f"store index `{_short(self.txt(t))}`: {_short(i)} -> {_short(new)}"
                sites.append(self.site(idx, new, what, (9,)))
        return sites

    def bound_site(self, n: ts.Node) -> _Site | None:
        """`i < n` → `i < n - 1`: the bound moves so that the range where the condition lets
        the work run shrinks (no out-of-bounds access, no endless `s > 0` halving loop)."""
        op, right = self.txt(n.child_by_field_name("operator")), n.child_by_field_name("right")
        if op not in ("<", "<=", ">", ">=") or right is None:
            return None
        control, work = self.condition_role(n)
        delta = "- 1" if (op in ("<", "<=")) == work else "+ 1"
        r, left = self.txt(right), self.txt(n.child_by_field_name("left"))
        new = f"{r} {delta}" if right.type in _PRIMARY else f"({r}) {delta}"
        what = f"bound `{_short(f'{left} {op} {r}')}` -> `{_short(f'{left} {op} {new}')}`"
        literal = right.type == "number_literal" or (
            right.type == "unary_expression" and right.named_children[-1].type == "number_literal"
        )
        depth = sum(a.type in _NESTING for a in self.ancestors(n))
        return self.site(right, new, what, (1 + 2 * (not control) + literal, depth))

    def condition_role(self, node: ts.Node) -> tuple[bool, bool]:
        """(in a loop or if condition, true means the work runs): an `if` whose branch ends in
        return, break or continue is a skip condition; `!` flips."""
        work = True
        for a in self.ancestors(node):
            if a.type == "unary_expression" and self.txt(a.child_by_field_name("operator")) == "!":
                work = not work
            elif a.type == "condition_clause":
                then = a.parent.child_by_field_name("consequence")
                body = [c for c in then.named_children if c.type != "comment"] if then else []
                last = body[-1] if then and then.type == "compound_statement" and body else then
                return True, work != (a.parent.type == "if_statement" and last.type in _JUMPS)
            elif a.type in ("for_statement", "do_statement"):
                cond = a.child_by_field_name("condition")
                return cond is not None and cond.start_byte <= node.start_byte < cond.end_byte, work
            elif self.statement(a) == a:
                break
        return False, work

    # op_swap -------------------------------------------------------------------------------
    def op_swap_sites(self) -> list[_Site | None]:
        """Operators on the data flow into output stores, nearest the store and outermost
        first, value variables before integer ones; only when there is none, operators in
        index expressions on that flow; last, any operator of the body."""
        steps: list[_Site | None] = []  # `x + 1` -> `x - 1`: last, after every other tier
        for tier, index in ((0, False), (2, True)):
            sites, seen = [], set()
            named = [d for d in self.helper_stores if d.stores]  # beside the direct stores: an
            # output written only through `store_output(...)` gets its operators too (mamba)
            frontier = [(d, 0) for d in (self.stores + named) or self.helper_stores]
            while frontier:
                nxt = []
                for d, dist in frontier:
                    moved = d.name in self.pointers - self.arrays
                    if moved and not index:
                        continue  # moving a pointer is an index change
                    ops, names, counts = [], set(), []
                    target = [d.target] if index and d.target else []
                    if target and d.target.type == "call_expression":  # a helper's arguments
                        args = d.target.child_by_field_name("arguments")
                        target = [a for a in args.named_children if a not in d.values]
                    for v in d.values + target:
                        if d.stores and self.is_count(v):  # `store(out, vals, n - chunk * k)`
                            self.scan(v, counts, set(), index)
                        else:
                            self.scan(v, ops, names, index)
                    if d.op is not None and self.txt(d.op) in _SWAP:
                        ops.append(d.op)
                    key = (tier + (moved or d.name in self.ints), dist)
                    sites += [self.swap_site(o, key) for o in ops if not self.in_loop_header(o)]
                    # how many elements a store helper writes: tried after every value
                    sites += [self.swap_site(o, (tier + _STEP, dist)) for o in counts]
                    for name in sorted(names - seen):
                        seen.add(name)
                        nxt += [(dd, dist + 1) for dd in self.defs.get(name, [])]
                frontier = nxt
            steps += [x for x in sites if x and x.key[0] >= _STEP]
            if any(x for x in sites if x and x.key[0] < _STEP):
                return [x for x in sites if x and x.key[0] < _STEP] + steps
        kinds = ("binary_expression", "assignment_expression")
        ops = [n.child_by_field_name("operator") for n in _walk(self.body) if n.type in kinds]
        rest = [
            self.swap_site(o, (4 + self.in_loop_header(o), self.is_pointer(o.parent)))
            for o in ops
            if self.txt(o) in _SWAP
        ]
        return [x for x in rest if x and x.key[0] < _STEP] + steps

    def is_count(self, node: ts.Node) -> bool:
        """An argument of integers alone (`params.seqlen - chunk * kChunkSize`): how many
        elements a helper stores, not what. Swapped, it often changes nothing the inputs show
        (one chunk: `chunk` is 0), so such sites come last."""
        ids = [self.txt(n) for n in _walk(node) if n.type == "identifier"]
        if node.type == "identifier" or not ids or any(n.type == "subscript_expression"
                                                        for n in _walk(node)):  # fmt: skip
            return False
        return not (set(ids) & self.arrays) and bool(set(ids) & self.ints)

    def swap_site(self, op: ts.Node, key: tuple) -> _Site | None:
        if self.is_identity(op):
            return None
        depth, n = 0, op.parent.parent  # outermost operators first
        while n is not None and n.type in ("binary_expression", "parenthesized_expression"):
            depth, n = depth + (n.type == "binary_expression"), n.parent
        what = f"`{self.txt(op)}` -> `{_SWAP[self.txt(op)]}` in `{_short(self.txt(op.parent))}`"
        if self.is_unit_step(op):
            key = (key[0] + _STEP, *key[1:])
        return self.site(op, _SWAP[self.txt(op)], what, (*key, depth))

    def is_unit_step(self, op: ts.Node) -> bool:
        """`i + 1` / `i - 1`: swapped, a shift by two, which in triangle loops (NMS's `start =
        tid + 1`, skipping the box itself) often changes nothing the outputs show."""
        if self.txt(op).rstrip("=") not in ("+", "-"):
            return False
        sides = [op.parent.child_by_field_name(f) for f in ("left", "right")]
        return any(n is not None and self.txt(n).rstrip("uUlL") == "1" for n in sides)

    def is_identity(self, op: ts.Node) -> bool:
        """`x + 0`, `x - 0`, `0 + x`, `x * 1`, `x / 1` (and `+= 0`, ...): swapping the operator
        of these gives `x - 0`, `x + 1` ...; the first changes nothing, so it is no variant."""
        parent, o = op.parent, self.txt(op).rstrip("=")
        right = parent.child_by_field_name("right")
        left = parent.child_by_field_name("left")

        def literal(node, value: float) -> bool:
            if node is None or node.type != "number_literal":
                return False
            try:
                return float(self.txt(node).rstrip("fFlLuU")) == value
            except ValueError:
                return False

        if o in ("+", "-"):
            return literal(right, 0) or (o == "+" and literal(left, 0))
        return o == "/" and literal(right, 1)

    def scan(self, node: ts.Node, ops: list[ts.Node], names: set[str], index: bool) -> None:
        """Arithmetic operators and variables a value depends on. Subscripts and pointer
        arithmetic are not the value (`index`: they are, pointer `+`/`-` itself excepted);
        callee names and template arguments never are."""
        stack = [node]
        while stack:
            n = stack.pop()
            if n is None or n.type in ("template_argument_list", "sizeof_expression"):
                continue
            if n.type == "call_expression" or (n.type == "subscript_expression" and not index):
                stack.append(
                    n.child_by_field_name("arguments") or n.child_by_field_name("argument")
                )
                continue
            if n.type == "conditional_expression":  # the condition selects, it is no value
                cond = n.child_by_field_name("condition")
                names.update(self.txt(i) for i in _walk(cond) if i.type == "identifier")
                stack += [
                    n.child_by_field_name("consequence"),
                    n.child_by_field_name("alternative"),
                ]
                continue
            op = n.child_by_field_name("operator") if n.type == "binary_expression" else None
            if op is not None and self.txt(op) in _SWAP:
                if self.txt(op) not in ("+", "-") or not self.is_pointer(n):
                    ops.append(op)
                elif not index:
                    continue  # pointer arithmetic: an address, not a value
            if n.type == "identifier":
                names.add(self.txt(n))
            stack += reversed(n.children)
