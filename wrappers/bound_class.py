"""Objects of the repository's own bound classes, made from what pybind can pass.

Some launchers take an object: torchsparse's `build_kernel_map_subm_hashmap(hashtable &table,
...)` launches its kernels on the table's device view. Others are methods of one:
`GPUHashTable<K, V>::insert_vals(keys)` launches `insert_kernel` on the table's members.
pybind cannot pass such an object to a label that does not bind its class. The repository
already says how Python makes one: `py::class_<hashtable>(m, "GPUHashTable")
.def(py::init<torch::Tensor, torch::Tensor>())`. So the adapter takes that constructor's
arguments in the object's place and builds the object in C++.

A constructor from tensors is preferred. The object's state then lives in tensors the test
passes and can compare (the table's keys and values). A constructor from sizes keeps that
state in memory the test never sees.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from miner.textprep import split_top
from wrappers.signature import Signature, bindable_type, parse_signature

_CLASS = re.compile(
    r"py::class_\s*<\s*([\w:]+(?:\s*<[^<>;]*>)?)\s*(?:,[^>]*)?>\s*\(\s*\w+\s*,\s*\""
)
_INIT = re.compile(r"py::init\s*<([^;]*?)>\s*\(\s*\)")
_WORD = re.compile(r"\W+")
_TENSORS = re.compile(r"^(?:const\s+)?(?:at::|torch::)?Tensor\s*&?$")


@dataclass(eq=False)  # one object per class, whichever key finds it
class BoundClass:
    bound: str  # the type as the binding names it: "hashtable"
    concrete: str  # through the repository's aliases: "GPUHashTable<int64_t, int>"
    ctor: list[tuple[str, str]]  # the constructor the adapter calls: (type, name)

    @property
    def template(self) -> str:
        return self.concrete.split("<", 1)[0].strip().split("::")[-1]


def _ctor_names(code: str, template: str, types: list[str]) -> list[str]:
    """The parameter names of the class's constructor taking `types`, as its definition
    writes them; `arg{i}` where no definition says."""
    for m in re.finditer(rf"(?<![\w:~]){re.escape(template)}\s*\(([^()]*)\)\s*[:{{]", code):
        params = [p for p in split_top(m.group(1)) if p.strip()]
        if len(params) != len(types):
            continue
        sig = parse_signature(f"void f({m.group(1)})", "f")
        if sig is not None and all(n for _, n in sig.params):
            return [n for _, n in sig.params]
    return [f"arg{i}" for i in range(len(types))]


def bound_classes(code: str, names: dict[str, str]) -> dict[str, BoundClass]:
    """Every class the repository's `code` (all its files) binds with a constructor pybind can
    call, keyed by the bound name and by its concrete type; `names` are its type aliases."""
    found: dict[str, BoundClass] = {}
    for m in _CLASS.finditer(code):
        bound = " ".join(m.group(1).split())
        chain = code[m.end() : code.find(";", m.end())]
        ctors = [
            [t.strip() for t in split_top(i.group(1)) if t.strip()] for i in _INIT.finditer(chain)
        ]
        ctors = [c for c in ctors if c and all(bindable_type(t) for t in c)]
        if not ctors:
            continue
        ctors.sort(key=lambda c: not all(_TENSORS.match(t) for t in c))  # tensors first
        cls = BoundClass(bound, names.get(bound, bound), [])
        cls.ctor = list(zip(ctors[0], _ctor_names(code, cls.template, ctors[0]), strict=True))
        found.setdefault(bound, cls)
        found.setdefault(" ".join(cls.concrete.split()), cls)
    return found


def object_type(type_text: str) -> str:
    """`hashtable` for `hashtable &`, `const hashtable*` or `hashtable`."""
    core = re.sub(r"\b(const|volatile)\b|[&*]", " ", type_text)
    return " ".join(core.split())


def construct(cls: BoundClass, var: str) -> tuple[list[tuple[str, str]], str]:
    """The adapter's parameters standing for an object `var` and the line that makes it."""
    params = [(t, f"{var}_{n}") for t, n in cls.ctor]
    args = ", ".join(n for _, n in params)
    return params, f"  {cls.concrete} {var}({args});\n"


def method_signature(code: str, name: str, template: str) -> Signature | None:
    """A method defined outside its class (`template <...> void GPUHashTable<K, V>::insert_vals
    (at::Tensor keys) {...}`), as a plain signature with the class's template header dropped."""
    qualifier = re.compile(
        rf"\b{re.escape(template)}\s*(?:<[^<>(){{}};]*>)?\s*::\s*(?={name}\s*\()"
    )
    if not qualifier.search(code):
        return None
    sig = parse_signature(qualifier.sub("", code, count=1), name)
    if sig is None:
        return None
    sig.template = ""
    return sig


def method_adapter(cls: BoundClass, sig: Signature) -> tuple[Signature, str] | None:
    """`kminer_<class>_<method>(<constructor args>, <method args>)`: the object made as Python
    would make it, then the method called on it."""
    if not all(bindable_type(t) and n for t, n in sig.params):
        return None
    if sig.returns != "void" and not bindable_type(sig.returns):
        return None
    params, make = construct(cls, "self")
    params += sig.params
    name = f"kminer_{_WORD.sub('_', cls.bound)}_{sig.name}"
    give = "" if sig.returns == "void" else "return "
    call = ", ".join(n for _, n in sig.params)
    decl = ", ".join(f"{t} {n}" for t, n in params)
    text = (
        f"// kminer adapter: {sig.name} is a method of {cls.bound}, made here from what Python\n"
        f"// passes to its constructor\n"
        f"{sig.returns} {name}({decl}) {{\n{make}  {give}self.{sig.name}({call});\n}}\n"
    )
    return Signature(name, name, sig.returns, params), text
