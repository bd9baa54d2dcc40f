"""Read a host function's signature from its text and decide whether pybind can expose it.

A mined wrapper is bound with the launcher's own signature, so that signature must consist of
types torch's pybind casters understand (tensors, scalars, vectors, optionals, strings).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from miner.textprep import split_top

_SCALARS = frozenset(
    """
int int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t long short unsigned signed
size_t float double bool char void uint ushort ulong
""".split()
)
_TENSORS = frozenset({"Tensor", "at::Tensor", "torch::Tensor"})
_WRAPPERS = re.compile(
    r"^(?:std::|c10::|at::|torch::)?(vector|optional|tuple|pair|ArrayRef|OptionalArrayRef)<(.*)>$"
)
_ARRAY_REFS = frozenset({"IntArrayRef", "at::IntArrayRef", "c10::IntArrayRef"})
_NAMED = frozenset(
    {
        "std::string",
        "string",
        "at::ScalarType",
        "c10::ScalarType",
        "ScalarType",
        "at::Scalar",
        "c10::Scalar",
        "Scalar",
        "at::Device",
        "c10::Device",
    }
)
_QUALS = re.compile(r"\b(const|volatile|inline|static|extern|__host__|constexpr|typename)\b|[&]")


@dataclass
class Signature:
    name: str
    qualified: str  # with the namespace path, for `&ns::f`
    returns: str
    params: list[tuple[str, str]] = field(default_factory=list)  # (type, name)
    template: str = ""  # "template <...>" header if any
    template_args: str = ""  # chosen instantiation of a function template, e.g. "3"

    def reference(self, enums: frozenset[str] = frozenset()) -> str:
        """What `m.def` binds: `&ns::f`, `&ns::f<3>`, or a lambda turning ints into enums."""
        target = self.qualified + (f"<{self.template_args}>" if self.template_args else "")
        enum_params = [i for i, (t, _) in enumerate(self.params) if _core(t) in enums]
        if not enum_params:
            return f"&{target}"
        decl, call = [], []
        for i, (t, _) in enumerate(self.params):
            if i in enum_params:
                decl.append(f"int64_t a{i}")
                call.append(f"static_cast<{_core(t)}>(a{i})")
            else:
                decl.append(f"{t} a{i}")
                call.append(f"a{i}")
        ret = "" if self.returns == "void" else "return "
        return f"[]({', '.join(decl)}) {{ {ret}{target}({', '.join(call)}); }}"


def specialized(sig: Signature) -> Signature | None:
    """The function template at the instantiation its label binds (`f<float>`), as a plain
    signature: what a caller of the bound function passes. None when there is none to take."""
    head = sig.template[sig.template.find("<") + 1 : sig.template.rfind(">")]
    names = [re.findall(r"[A-Za-z_]\w*", p.split("=")[0])[-1:] for p in split_top(head)]
    args = split_top(sig.template_args)
    if not sig.template_args or not all(names) or len(names) != len(args):
        return None
    subst = {n[0]: a.strip() for n, a in zip(names, args, strict=True)}
    word = re.compile(r"\b(" + "|".join(map(re.escape, subst)) + r")\b")

    def put(text: str) -> str:
        return word.sub(lambda m: subst[m.group(1)], text)

    return Signature(
        sig.name,
        sig.qualified + f"<{sig.template_args}>",
        put(sig.returns),
        [(put(t), n) for t, n in sig.params],
    )


def parse_signature(code: str, name: str, namespace: tuple[str, ...] = ()) -> Signature | None:
    """Signature of the function `name` whose definition starts `code` (comments blanked)."""
    m = re.search(rf"(?<![\w:])(?:\w+::)*{re.escape(name)}\s*\(", code)
    if not m:
        return None
    open_paren = m.end() - 1
    depth = 0
    for j in range(open_paren, len(code)):
        depth += (code[j] == "(") - (code[j] == ")")
        if depth == 0:
            break
    else:
        return None
    head = code[: m.start()].strip()
    template = ""
    t = re.match(r"template\s*<", head)
    if t:
        depth, k = 0, t.end() - 1
        for k in range(t.end() - 1, len(head)):
            depth += (head[k] == "<") - (head[k] == ">")
            if depth == 0:
                break
        template, head = head[: k + 1], head[k + 1 :].strip()
    returns = " ".join(_QUALS.sub(" ", head).split()) if head else "void"
    returns = " ".join(w for w in returns.split() if not w.startswith("__")) or "void"
    params = []
    for p in split_top(code[open_paren + 1 : j]):
        if p in ("", "void"):
            continue
        p = p.split("=")[0].strip()
        words = re.findall(r"[A-Za-z_]\w*", p)
        pname = words[-1] if len(words) > 1 and not p.endswith((">", "*", "&")) else ""
        ptype = p[: p.rfind(pname)].strip() if pname else p
        params.append((" ".join(ptype.split()), pname))
    ns = "::".join(n for n in namespace if n and not n.startswith("extern"))
    qualified = f"{ns}::{name}" if ns else name
    return Signature(name, qualified, returns, params, template)


def _core(type_text: str) -> str:
    return " ".join(_QUALS.sub(" ", type_text).replace("*", " * ").split())


def bindable_type(type_text: str, enums: frozenset[str] = frozenset()) -> bool:
    """True for what torch's pybind casters pass by value: tensors, scalars, containers of them
    (and the repository's enums, which the binding takes as integers)."""
    core = _core(type_text)
    if "*" in core:
        return False
    if core in enums:
        return True
    if core in _TENSORS or core in _NAMED or core in _ARRAY_REFS:
        return True
    if all(w in _SCALARS for w in core.split()):
        return True
    m = _WRAPPERS.match(core.replace(" ", "")) or _WRAPPERS.match(core)
    if m:
        return all(bindable_type(inner) for inner in split_top(m.group(2)))
    return False


def bindable(sig: Signature, enums: frozenset[str] = frozenset()) -> bool:
    if sig.template and not sig.template_args:
        return False
    return bindable_type(sig.returns) and all(bindable_type(t, enums) for t, _ in sig.params)
