"""tree-sitter-cuda → FileModel: one parse per file, top-level structure walked in Python.

Only what sits at file scope (inside namespaces, `extern "C"` and `#if` blocks) is visited;
function and class bodies stay as spans. Offsets are mapped back through the alias rewrite, so
every span points into the original file.
"""

from __future__ import annotations

import re

import tree_sitter as ts
import tree_sitter_cuda

from miner.cpp_expr import UNKNOWN, cuda_env, evaluate
from miner.filemodel import (
    Cond,
    Define,
    FileModel,
    Include,
    Item,
    KernelDef,
    PragmaOnce,
    Undef,
    refs_in,
)
from miner.textprep import LineIndex, RewrittenText, blank_bare_macro_calls

LANGUAGE = ts.Language(tree_sitter_cuda.language())
# a variable definition the grammar could not parse, read from its text
_VARIABLE = re.compile(
    r"\s*(?:(?:static|const|constexpr|inline|extern)\s+)*[A-Za-z_][\w:]*\s*(?:<[^;{}()]*>)?"
    r"[\s*&]+([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*(?:=|;)"
)


_DEFINE_HEAD = re.compile(r"[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(\([^)\n]*\))?")
MIN_PASTED = 6  # characters of a pasted fragment that name a family of macros
_PASTE = re.compile(r"(\w+)\s*##\s*(?=(\w+))")  # `PREFIX_##x`, `x##_SUFFIX`: pasted names


def _define_end(code: str, start: int) -> int:
    """Where the `#define` at `start` ends: the first line that does not continue with a
    backslash (comments are blanked in `code`, so `/* ... */ \\` continues too)."""
    pos = start
    while True:
        nl = code.find("\n", pos)
        if nl < 0:
            return len(code)
        if not code[pos:nl].rstrip().endswith("\\"):
            return nl
        pos = nl + 1


_RECORD_TYPES = ("struct_specifier", "class_specifier", "union_specifier", "enum_specifier")


class FileParser:
    """Turns one file's (possibly alias-rewritten) text into a FileModel."""

    def __init__(self) -> None:
        self.parser = ts.Parser(LANGUAGE)

    def parse(self, rel: str, text: str, code: str, rewritten: RewrittenText | None) -> FileModel:
        source = _blank_define_ends(rewritten.text if rewritten else text)
        tree = self.parser.parse(source.encode("latin-1"))
        # an #if inside a statement, a macro statement without its semicolon: the grammar
        # cannot see them; the reading the grammar loses less of is kept
        for fix in (resolve_inline_conditionals, blank_bare_macro_calls):
            if not tree.root_node.has_error:
                break
            resolved = fix(source)
            if resolved != source:
                again = self.parser.parse(resolved.encode("latin-1"))
                if _error_bytes(again.root_node) < _error_bytes(tree.root_node):
                    source, tree = resolved, again
        model = FileModel(rel, text, code, lines=LineIndex(text))
        walker = _Walker(model, source, rewritten)
        model.events = walker.walk(tree.root_node.children, ())
        model.error_count = walker.errors
        return model


_EMPTY_DEFINE = re.compile(
    r"^([ \t]*#[ \t]*define[ \t]+\w+(?:\([^)\n]*\))?)([ \t]+)\n", re.MULTILINE
)


def _blank_define_ends(source: str) -> str:
    """`#define ROCM_ONLY(x) ` (an empty body, then a blank) makes the grammar take the next
    line (`#else`) as the body: the blanks move past the newline, so every offset but theirs
    stays where it was."""
    if "define" not in source:
        return source
    return _EMPTY_DEFINE.sub(lambda m: f"{m.group(1)}\n{m.group(2)}", source)


_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b(.*)$")


def _error_bytes(node) -> int:
    """How much of the file the grammar could not read."""
    if node.type == "ERROR":
        return node.end_byte - node.start_byte
    return sum(_error_bytes(c) for c in node.children) if node.has_error else 0


def resolve_inline_conditionals(source: str) -> str:
    """The source with each `#if` group that splits a statement (a constructor's initializer
    list with a CUDA and a ROCm line, mamba's reverse_scan.cuh) reduced to the branch nvcc
    takes: the other branches and the directives become blanks, so every offset stays. Groups
    between statements stay whole (the linearizer decides those)."""
    lines = source.split("\n")
    out = list(lines)
    i, last_code = 0, ""
    while i < len(lines):
        m = _DIRECTIVE.match(lines[i])
        if not m or m.group(1) not in ("if", "ifdef", "ifndef"):
            stripped = lines[i].split("//")[0].strip()
            if stripped and not stripped.startswith("#"):
                last_code = stripped
            i += 1
            continue
        end, branches = _group(lines, i)
        if end is None:
            break
        if last_code and last_code[-1] not in ";{}:" and not last_code.startswith("*"):
            taken = _taken(branches)
            for start, stop, _ in branches:
                for j in range(start, stop):
                    if (start, stop) != taken or j == start:
                        out[j] = " " * len(lines[j])
            out[end] = " " * len(lines[end])
        i = end + 1
    return "\n".join(out)


def _group(lines: list[str], at: int) -> tuple[int | None, list]:
    """(line of the #endif, [(first line, end line, condition) per branch]) of the group at
    `at`, nested groups skipped."""
    branches, depth, start, cond = [], 0, at, _cond(lines[at])
    for j in range(at + 1, len(lines)):
        m = _DIRECTIVE.match(lines[j])
        if not m:
            continue
        word = m.group(1)
        if word in ("if", "ifdef", "ifndef"):
            depth += 1
        elif word == "endif" and depth:
            depth -= 1
        elif depth == 0 and word in ("elif", "else", "endif"):
            branches.append((start, j, cond))
            if word == "endif":
                return j, branches
            start, cond = j, ("1" if word == "else" else m.group(2).strip())
    return None, branches


def _cond(line: str) -> str:
    m = _DIRECTIVE.match(line)
    word, rest = m.group(1), m.group(2).strip()
    if word == "ifdef":
        return f"defined({rest})"
    if word == "ifndef":
        return f"!defined({rest})"
    return rest


def _taken(branches: list) -> tuple[int, int] | None:
    """The branch nvcc would compile (an unknown macro is not defined); None: none is."""
    env = cuda_env()
    for start, stop, cond in branches:
        value = evaluate(cond, env)
        if value is not UNKNOWN and value:
            return start, stop
    return None


class _Walker:
    def __init__(self, model: FileModel, source: str, rewritten: RewrittenText | None) -> None:
        self.m = model
        self.src = source
        self.rw = rewritten
        self.errors = 0
        self.define_until = 0  # offset up to which a #define extends past its parsed end
        self.seq = 0

    # offsets -------------------------------------------------------------------------------
    def orig(self, offset: int) -> int:
        return self.rw.to_original(offset) if self.rw else offset

    def span(self, node: ts.Node, end_node: ts.Node | None = None) -> tuple[int, int]:
        end = (end_node or node).end_byte
        return self.orig(node.start_byte), self.orig(end)

    def txt(self, node: ts.Node | None) -> str:
        return "" if node is None else self.src[node.start_byte : node.end_byte]

    def make_item(self, kind: str, names, start: int, end: int, ns, **kw) -> Item:
        self.seq += 1
        item = Item(
            kind,
            tuple(n for n in names if n),
            self.m.rel,
            start,
            end,
            self.m.lines.line(start),
            tuple(ns),
            refs_in(self.m.code, start, end),
            seq=self.seq,
            **kw,
        )
        self.m.items.append(item)
        return item

    # walking -------------------------------------------------------------------------------
    def walk(self, nodes, ns) -> list:
        events: list = []
        nodes = list(nodes)
        i = 0
        while i < len(nodes):
            node = nodes[i]
            nxt = nodes[i + 1] if i + 1 < len(nodes) else None
            semi = nxt if nxt is not None and nxt.type == ";" else None
            if semi is not None:
                i += 1
            i += 1
            if self.orig(node.start_byte) < self.define_until:
                continue  # the rest of a #define the grammar cut short at a comment
            ev = self.event(node, ns, semi)
            if isinstance(ev, list):
                events.extend(ev)
            elif ev is not None:
                events.append(ev)
        return events

    def event(self, node: ts.Node, ns, semi: ts.Node | None):
        t = node.type
        if node.has_error:
            self.errors += 1
        if t in ("comment", ";", "{", "}", "\n"):
            return None
        if t == "preproc_include":
            path_node = node.child_by_field_name("path")
            raw = self.txt(path_node).strip()
            angle = raw.startswith("<")
            return Include(raw.strip('<>"'), angle, self.m.lines.line(self.orig(node.start_byte)))
        if t in ("preproc_def", "preproc_function_def"):
            return self.define(node, ns)
        if t == "preproc_call":
            directive = self.txt(node.child_by_field_name("directive")).lstrip("#").strip()
            arg = self.txt(node.child_by_field_name("argument")).strip()
            if directive == "undef":
                return Undef(arg.split()[0] if arg else "")
            if directive == "pragma" and arg.split()[:1] == ["once"]:
                return PragmaOnce()
            return None
        if t in ("preproc_if", "preproc_ifdef"):
            return self.conditional(node, ns)
        if t == "namespace_definition":
            name = self.txt(node.child_by_field_name("name"))
            body = node.child_by_field_name("body")
            return self.walk(body.children, (*ns, name)) if body is not None else None
        if t == "linkage_specification":
            body = node.child_by_field_name("body")
            if body is None:
                return None
            inner = body.children if body.type == "declaration_list" else [body]
            return self.walk(inner, (*ns, 'extern "C"'))
        return self.item(node, ns, semi)

    def define(self, node: ts.Node, ns) -> Define:
        name = self.txt(node.child_by_field_name("name"))
        params_node = node.child_by_field_name("parameters")
        params = None
        if params_node is not None:
            params = [p.strip() for p in self.txt(params_node).strip("()").split(",") if p.strip()]
        value = node.child_by_field_name("value")
        body = self.txt(value)
        start, end = self.span(node)
        full = _define_end(self.m.code, start)
        head = _DEFINE_HEAD.match(self.m.code, start)
        if head and (full > end or node.has_error):  # a comment in the body confuses the
            end = self.define_until = max(end, full)  # grammar: it may end the macro there,
            name = head.group(1)  # or name it after a later word
            if head.group(2) is not None:
                params = [p.strip() for p in head.group(2).strip("()").split(",") if p.strip()]
            body = self.m.text[head.end() : end]
        item = self.make_item("macro", [name], start, end, ())
        # the macro's own name and parameters are not references; a name it pastes together
        # is a reference to whatever the repository defines by that prefix or suffix
        item.refs = item.refs - {name} - set(params or ()) | pasted_refs(body, params or ())
        return Define(name, params, body, item)

    def conditional(self, node: ts.Node, ns) -> Cond:
        branches: list[tuple[str, str, list]] = []
        line = self.m.lines.line(self.orig(node.start_byte))
        cur: ts.Node | None = node
        while cur is not None:
            directive = self.txt(cur.children[0]).lstrip("#").strip() if cur.children else ""
            if cur.type == "preproc_ifdef" or cur.type == "preproc_elifdef":
                cond = self.txt(cur.child_by_field_name("name"))
            elif cur.type == "preproc_else":
                cond = ""
            else:
                cond = self.txt(cur.child_by_field_name("condition"))
            alternative = cur.child_by_field_name("alternative")
            skip = {"condition", "name", "alternative"}
            body = [
                c
                for i, c in enumerate(cur.children)
                if i > 0
                and cur.field_name_for_child(i) not in skip
                and c.type not in ("#endif", "\n")
            ]
            branches.append((directive, cond, self.walk(body, ns)))
            cur = alternative
        return Cond(branches, line)

    # items ---------------------------------------------------------------------------------
    def item(self, node: ts.Node, ns, semi: ts.Node | None):
        start, end = self.span(node, semi)
        t = node.type
        inner = node
        template_params: list[dict] = []
        if t == "template_declaration":
            template_params = self.template_params(node.child_by_field_name("parameters"))
            inner = next(
                (c for c in reversed(node.named_children) if c.type != "template_parameter_list"),
                node,
            )
        it = inner.type
        if it == "function_definition":
            explicit = t == "template_declaration" and not template_params
            return self.function(node, inner, ns, start, end, template_params, explicit)
        if it == "declaration":
            return self.declaration(inner, ns, start, end)
        if it in _RECORD_TYPES:
            names = [self.txt(inner.child_by_field_name("name")).split("<")[0].split("::")[-1]]
            if it == "enum_specifier":
                body = inner.child_by_field_name("body")
                if body is not None:
                    names += [
                        self.txt(e.child_by_field_name("name"))
                        for e in body.named_children
                        if e.type == "enumerator"
                    ]
            return self.make_item("type", names, start, end, ns)
        if it == "type_definition":
            names = [self.declarator_name(d) for d in inner.children_by_field_name("declarator")]
            return self.make_item("typedef", names, start, end, ns)
        if it == "alias_declaration":
            return self.make_item(
                "typedef", [self.txt(inner.child_by_field_name("name"))], start, end, ns
            )
        if it == "using_declaration":
            named = inner.named_children
            target = self.txt(named[-1]) if named else ""
            if any(c.type == "namespace" for c in inner.children):
                return self.make_item("using_ns", [], start, end, ns, target=target)
            return self.make_item("using", [target.split("::")[-1]], start, end, ns, target=target)
        if it == "namespace_alias_definition":
            return self.make_item(
                "ns_alias", [self.txt(inner.child_by_field_name("name"))], start, end, ns
            )
        if it == "template_instantiation":
            name = self.declarator_name(inner.child_by_field_name("declarator"))
            self.m.excluded_spans.append((start, end, name))
            return self.make_item("other", [], start, end, ns)
        if it == "ERROR":
            self.errors += 1
        if it in ("ERROR", "expression_statement"):
            m = _VARIABLE.match(self.m.code[start:end])
            if m and ">>>" in m.group(0):  # `std::vector<std::vector<Int>>> offsets = {...};`:
                # the grammar reads `>>>` as a launch's end (anything else is a fragment)
                return self.make_item("variable", [m.group(1)], start, end, ns)
        return self.make_item("other", [], start, end, ns)

    def function(self, node, fn, ns, start, end, template_params, explicit=False) -> Item:
        tokens = {c.type for c in fn.children if not c.is_named}
        quals = [
            self.txt(c)
            for c in fn.children
            if c.type in ("storage_class_specifier", "launch_bounds")
        ]
        declarator = fn.child_by_field_name("declarator")
        name = self.declarator_name(declarator)
        device = bool(tokens & {"__device__", "__global__"})
        kind = "kernel" if "__global__" in tokens else "function"
        item = self.make_item(kind, [name], start, end, ns, device=device)
        owner = self.owner_class(declarator)
        body = fn.child_by_field_name("body")
        if owner or name.startswith("operator"):
            sig_end = self.orig(body.start_byte) if body is not None else end
            keys = (
                set(refs_in(self.m.code, start, sig_end)) if name.startswith("operator") else set()
            )
            # an operator is wanted by the types it takes, never by its parameters' names: a
            # vendored `operator==(const optional<T>& a, nullopt_t b)` is not what `b` means
            keys -= self.parameter_names(declarator) | {tp["name"] for tp in template_params}
            item.keys = tuple(sorted(keys | ({owner} if owner else set())))
        if kind == "kernel":
            self.kernel(node, fn, declarator, item, ns, template_params, quals, explicit)
        return item

    def kernel(self, node, fn, declarator, item, ns, template_params, quals, explicit) -> None:
        fdecl = declarator
        while fdecl is not None and fdecl.type != "function_declarator":
            fdecl = fdecl.child_by_field_name("declarator")
        spec = ""
        name_node = fdecl.child_by_field_name("declarator") if fdecl is not None else None
        while name_node is not None and name_node.type == "qualified_identifier":
            name_node = name_node.child_by_field_name("name")
        if name_node is not None and name_node.type == "template_function":
            spec = self.txt(name_node.child_by_field_name("arguments"))[1:-1].strip()
        if explicit and not spec:
            spec = "<>"  # template <> with arguments deduced from the parameters
        params = []
        plist = fdecl.child_by_field_name("parameters") if fdecl is not None else None
        for p in plist.named_children if plist is not None else []:
            if p.type == "comment":
                continue
            ptext = " ".join(self.txt(p).split())
            pname = self.declarator_name(p.child_by_field_name("declarator"))
            ptype = ptext
            if pname and ptext.endswith(pname):
                ptype = ptext[: -len(pname)].rstrip()
            elif pname:
                ptype = re.sub(rf"\b{re.escape(pname)}\b", "", ptext, count=1).strip()
            params.append((" ".join(ptype.split()), pname, ptext))
        item.spec = spec
        glob = next(c for c in fn.children if c.type == "__global__")
        kdef = KernelDef(
            name=item.names[0] if item.names else "",
            namespace=tuple(ns),
            start=item.start,
            end=item.end,
            global_offset=self.orig(glob.start_byte),
            params=params,
            template_params=template_params,
            specialization=spec,
            qualifiers=quals,
            item=item,
            has_error=node.has_error,
        )
        self.m.kernels.append(kdef)

    def declaration(self, decl, ns, start, end) -> Item:
        tokens = {c.type for c in decl.children if not c.is_named}
        quals = {self.txt(c) for c in decl.children if c.type == "type_qualifier"}
        names = []
        is_function = False
        for d in decl.children_by_field_name("declarator"):
            names.append(self.declarator_name(d))
            probe = d
            while probe is not None and probe.type not in ("function_declarator", "identifier"):
                probe = probe.child_by_field_name("declarator")
            is_function = is_function or (probe is not None and probe.type == "function_declarator")
        type_node = decl.child_by_field_name("type")
        if (
            type_node is not None
            and type_node.type in _RECORD_TYPES
            and type_node.child_by_field_name("body") is not None
        ):
            names.append(self.txt(type_node.child_by_field_name("name")))
        device = bool(tokens & {"__device__", "__global__"}) or bool(
            quals & {"__constant__", "__device__", "__shared__", "__managed__", "constexpr"}
        )
        if is_function and "__global__" not in tokens and self.braced_body(decl):
            return self.make_item("function", names, start, end, ns, device=device)
        if is_function:
            if "__global__" in tokens:
                for n in names:
                    self.m.excluded_spans.append((start, end, n))
            return self.make_item("decl", names, start, end, ns, device=device)
        return self.make_item("variable", names, start, end, ns, device=device)

    def braced_body(self, decl) -> bool:
        """A function whose body the grammar read as a braced initializer: statements that
        are macro calls (`TILE(4) else TILE(1)`) are no C++ it can parse, and it falls back
        to a declaration `f(...) {...}`, which is a definition."""
        declarators = decl.children_by_field_name("declarator")
        if len(declarators) != 1 or declarators[0].type != "init_declarator":
            return False
        inner = declarators[0].child_by_field_name("declarator")
        value = declarators[0].child_by_field_name("value")
        return (
            inner is not None
            and inner.type == "function_declarator"
            and value is not None
            and value.type == "initializer_list"
        )

    def owner_class(self, declarator: ts.Node | None) -> str:
        """`Foo` for an out-of-class member definition `T Foo<T>::get() {...}`."""
        node = declarator
        while node is not None and node.type != "function_declarator":
            node = node.child_by_field_name("declarator")
        name = node.child_by_field_name("declarator") if node is not None else None
        if name is None or name.type != "qualified_identifier":
            return ""
        scope = name.child_by_field_name("scope")
        if scope is None:
            return ""
        if scope.type == "template_type":
            scope = scope.child_by_field_name("name")
        return self.txt(scope).split("::")[-1]

    def parameter_names(self, declarator: ts.Node | None) -> set[str]:
        """The names a function declarator gives its parameters."""
        node = declarator
        while node is not None and node.type != "function_declarator":
            node = node.child_by_field_name("declarator")
        params = node.child_by_field_name("parameters") if node is not None else None
        names = set()
        for p in params.named_children if params is not None else []:
            d = p.child_by_field_name("declarator")
            if d is not None:
                names.add(self.declarator_name(d))
        return names

    def declarator_name(self, node: ts.Node | None) -> str:
        while node is not None:
            t = node.type
            if t in (
                "identifier",
                "type_identifier",
                "field_identifier",
                "namespace_identifier",
                "operator_name",
                "destructor_name",
            ):
                return self.txt(node)
            if t == "template_function" or t == "template_type":
                node = node.child_by_field_name("name")
                continue
            if t == "qualified_identifier":
                node = node.child_by_field_name("name")
                continue
            nxt = node.child_by_field_name("declarator")
            if nxt is None:
                nxt = next(
                    (
                        c
                        for c in node.named_children
                        if c.type
                        in (
                            "identifier",
                            "type_identifier",
                            "field_identifier",
                            "qualified_identifier",
                            "template_function",
                        )
                    ),
                    None,
                )
            node = nxt
        return ""

    def template_params(self, plist: ts.Node | None) -> list[dict]:
        out: list[dict] = []
        for p in plist.named_children if plist is not None else []:
            text = " ".join(self.txt(p).split())
            t = p.type
            kind, name, ptype, default = "", text.split()[-1] if text else "", "", ""
            if t in ("type_parameter_declaration", "optional_type_parameter_declaration"):
                kind = "type"
                name = self.txt(p.child_by_field_name("name")) or (
                    self.txt(p.named_children[0]) if p.named_children else ""
                )
                default = self.txt(p.child_by_field_name("default_type"))
            elif t == "variadic_type_parameter_declaration":
                kind, name = "pack", name.lstrip(".")
            elif t == "template_template_parameter_declaration":
                kind = "template"
            elif t.endswith("parameter_declaration"):  # value, optional value, value pack
                kind = "pack" if t.startswith("variadic") else "value"
                name = self.declarator_name(p.child_by_field_name("declarator"))
                ptype = self.txt(p.child_by_field_name("type"))
                default = self.txt(p.child_by_field_name("default_value"))
            if kind:
                out.append(
                    {"kind": kind, "name": name, "type": ptype, "default": default, "text": text}
                )
        return out


def pasted_refs(body: str, params) -> frozenset[str]:
    """`PREFIX*` and `*SUFFIX` for the names a macro body makes by token pasting: robin_hood's
    `#define ROBIN_HOOD(x) ROBIN_HOOD_PRIVATE_DEFINITION_##x()` names every
    `ROBIN_HOOD_PRIVATE_DEFINITION_CXX14` it may expand to, and the closure takes each
    macro with that prefix (miner.closure). Short fragments (`_t`) would take too much."""
    out = set()
    for left, right in _PASTE.findall(body):
        if left not in params and len(left) >= MIN_PASTED:
            out.add(left + "*")
        if right not in params and left in params and len(right) >= MIN_PASTED:
            out.add("*" + right)
    return frozenset(out)
