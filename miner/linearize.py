"""Simulate the preprocessor over a translation unit: which items are active, in which order.

Starting at one file we follow `#include`s through the repository, keep a macro environment,
and evaluate `#if` chains with it. The result is the unit's items in the order the compiler sees
them, each with the `#if` guards that stayed undecided (`__CUDA_ARCH__`). Only this list is ever
searched for names, so a helper from a header the kernel never includes cannot leak in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from miner.cpp_expr import UNKNOWN, MacroEnv, cuda_env, evaluate
from miner.filemodel import Cond, Define, FileModel, Include, Item, PragmaOnce, Undef
from miner.includes import MAX_INCLUDE_DEPTH, IncludeResolver


@dataclass(frozen=True)
class Entry:
    item: Item
    guards: tuple[str, ...]


@dataclass(frozen=True)
class ExternalInclude:
    header: str
    angle: bool
    guards: tuple[str, ...]
    from_file: str


@dataclass
class Linear:
    root: str
    entries: list[Entry] = field(default_factory=list)
    externals: list[ExternalInclude] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # include closure, in first-visit order
    include_offsets: dict[str, int] = field(default_factory=dict)  # file → entries before it
    too_deep: str = ""  # the include chain that went past MAX_INCLUDE_DEPTH, when one did


# the switches a CUDA build of the extension defines (setup.py's `define_macros=[("WITH_CUDA",
# None)]`, CMake's `-DUSE_CUDA`): a kernel's own .cu file compiles only in such a build
CUDA_SWITCH = re.compile(
    r"\b((?:[A-Z][A-Z0-9]*_)*(?:WITH|USE|HAVE|ENABLE)_(?:CUDA|GPU)|GOOGLE_CUDA)\b"
)
CUDA_SOURCES = (".cu", ".cuh")


class Linearizer:
    def __init__(
        self,
        models: dict[str, FileModel],
        resolver: IncludeResolver,
        env: MacroEnv | None = None,
        undefined: set[str] | None = None,
        cuda_switches: bool = False,
    ) -> None:
        self.models = models
        self.resolver = resolver
        self.base_env = env or cuda_env()
        self.undefined = undefined or set()
        self._cache: dict[str, Linear] = {}
        # a .cu root is compiled by the CUDA build only: its switches are on (detectron2's
        # nms_rotated_cuda.cu includes its box IoU helpers under `#ifdef WITH_CUDA`); a host
        # file is left as it was, since it is compiled either way
        self.device_env = _switched(self.base_env, models) if cuda_switches else self.base_env

    def linear(self, root: str) -> Linear:
        if root not in self._cache:
            env = self.device_env if root.endswith(CUDA_SOURCES) else self.base_env
            self._cache[root] = _Run(self, root, env).result
        return self._cache[root]


def _switched(env: MacroEnv, models: dict[str, FileModel]) -> MacroEnv:
    """`env` with every CUDA build switch the repository's `#if`s test defined as 1."""
    names: set[str] = set()

    def walk(events: list) -> None:
        for ev in events:
            if isinstance(ev, Cond):
                for _, text, inner in ev.branches:
                    names.update(CUDA_SWITCH.findall(text))
                    walk(inner)

    for model in models.values():
        walk(model.events)
    out = env.copy()
    for name in sorted(names):
        out.define(name, None, "1")
    return out


class _Run:
    def __init__(self, owner: Linearizer, root: str, env: MacroEnv) -> None:
        self.o = owner
        self.env = env.copy()
        self.uncertain: set[str] = set()
        self.once: set[str] = set()
        self.stack: list[str] = []
        self.result = Linear(root)
        self.visit_file(root, ())

    def visit_file(self, rel: str, guards: tuple[str, ...]) -> None:
        model = self.o.models.get(rel)
        if model is None or rel in self.once or rel in self.stack:
            return
        if len(self.stack) >= MAX_INCLUDE_DEPTH:
            if not self.result.too_deep:
                self.result.too_deep = f"{self.stack[0]} -> ... -> {self.stack[-1]} -> {rel}"
            return
        if rel not in self.result.include_offsets:
            self.result.include_offsets[rel] = len(self.result.entries)
            self.result.files.append(rel)
        self.stack.append(rel)
        self.visit(model.events, rel, guards)
        self.stack.pop()

    def visit(self, events: list, rel: str, guards: tuple[str, ...]) -> None:
        for ev in events:
            if isinstance(ev, Item):
                self.result.entries.append(Entry(ev, guards))
            elif isinstance(ev, Define):
                if ev.name not in self.o.undefined:
                    self.env.define(ev.name, ev.params, ev.body)
                    if guards and ev.body.strip():  # include guards stay certain
                        self.uncertain.add(ev.name)
                self.result.entries.append(Entry(ev.item, guards))
            elif isinstance(ev, Undef):
                self.env.undef(ev.name)
            elif isinstance(ev, Include):
                target = self.o.resolver.resolve(rel, ev.path, ev.angle)
                if target is None:
                    self.result.externals.append(ExternalInclude(ev.path, ev.angle, guards, rel))
                else:
                    self.visit_file(target, guards)
            elif isinstance(ev, PragmaOnce):
                self.once.add(rel)
            elif isinstance(ev, Cond):
                self.conditional(ev, rel, guards)

    def conditional(self, cond: Cond, rel: str, guards: tuple[str, ...]) -> None:
        pending: list[str] = []  # undecided earlier branches, negated for later ones
        for directive, text, events in cond.branches:
            expr = _as_expression(directive, text)
            value = 1 if directive == "else" else self.value(expr)
            negations = tuple(f"!({p})" for p in pending)
            if value is UNKNOWN:
                self.visit(events, rel, (*guards, *negations, expr))
                pending.append(expr)
            elif value:
                self.visit(events, rel, (*guards, *negations))
                return

    def value(self, expr: str):
        if self.uncertain and self.uncertain & set(_WORD.findall(expr)):
            return UNKNOWN  # a macro defined under an undecided guard decides nothing
        return evaluate(expr, self.env)


_WORD = re.compile(r"[A-Za-z_]\w*")


def _as_expression(directive: str, text: str) -> str:
    text = " ".join(text.replace("\\\n", " ").split())
    if directive == "ifdef":
        return f"defined({text})"
    if directive == "ifndef":
        return f"!defined({text})"
    if directive == "elifdef":
        return f"defined({text})"
    if directive == "elifndef":
        return f"!defined({text})"
    return text
