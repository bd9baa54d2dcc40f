"""The objects of a repository's own bound classes that its extension calls take, and how each
came to be what it was at the call.

Some ops take an object whose state earlier calls built: SparseConvNet's convolutions take a
`Metadata_2` that `InputLayer_updateOutput(metadata, ...)` filled with the input's sites and
that each convolution extends with the rule books it computes; MinkowskiEngine's take a
coordinate manager filled by `manager.insert_and_map(coords, ...)`. A snapshot of such an
object is meaningless (its state is C++ memory), but the calls that made it are not. So every
call that makes or takes such an object (a constructor, a function of the extension, a method
of the object) is a step, in the order the program made them, its arguments snapshot as
for a recorded call; an object in an argument is a marker naming the step whose result holds it
(`{"kminer_object": "Metadata_2", "made_by": 3, "path": [0]}`). A recorded call that takes
objects keeps its setup: every earlier step that made or took one of them, and, through those
steps' own objects, the objects they depend on. Replaying the setup in order remakes the state.

Part of `recorder.py`, imported beside it as a sibling (standard library and torch only).
"""

from __future__ import annotations

import functools

MAX_STEPS = 4096  # steps kept per recorded file; later ones make their objects unreplayable
_BROKEN = -1  # `made_by` of an object whose making was not recorded whole


class _Objects:
    def __init__(self, snapshot, too_big) -> None:
        self._snapshot, self._too_big = snapshot, too_big
        self.steps: list = []  # (callable name, args, kwargs): names "f", "Class", "Class.method"
        self._classes: dict[type, str] = {}  # the bound classes, by their name in the module
        self._made: dict[int, tuple] = {}  # id(object) -> (class name, made_by, path)
        self._alive: list = []  # the objects seen, kept alive so that their ids stay theirs
        self._touched: dict[int, list[int]] = {}  # made_by of an object -> steps that took it

    def watch(self, module) -> None:
        """Record the making and the method calls of every class `module` binds."""
        for name in dir(module):
            cls = getattr(module, name, None)
            if isinstance(cls, type) and cls not in self._classes and _bound_here(cls, module):
                self._classes[cls] = name
                for attr, value in list(vars(cls).items()):
                    if not attr.startswith("__") and callable(value):
                        setattr(cls, attr, self._recording_method(f"{name}.{attr}", value))

    def is_class(self, value) -> bool:
        return isinstance(value, type) and value in self._classes

    def involved(self, args: tuple, kwargs: dict) -> bool:
        return any(self.holds(v) for v in (*args, *kwargs.values()))

    def holds(self, value) -> bool:
        """Whether `value` is an object, or a list or tuple holding one."""
        if type(value) in self._classes:
            return True
        return isinstance(value, (list, tuple)) and any(self.holds(v) for v in value)

    def marked(self, value):
        """`value` with each object it holds (at the top, or in a list or tuple) as a marker."""
        if type(value) in self._classes:
            unmade = (self._classes[type(value)], _BROKEN, ())
            name, made_by, path = self._made.get(id(value), unmade)
            return {"kminer_object": name, "made_by": made_by, "path": list(path)}
        if isinstance(value, (list, tuple)) and self.holds(value):
            return type(value)(self.marked(v) for v in value)
        return value

    def step(self, name: str, args: tuple, kwargs: dict) -> int:
        """A step made now; its index (`_BROKEN` when it cannot be replayed: too many steps,
        a tensor too large to keep, an object whose own making was not kept)."""
        snap = [self._snapshot(self.marked(a)) for a in args]
        named = {k: self._snapshot(self.marked(v)) for k, v in kwargs.items()}
        values = [*snap, *named.values()]
        if len(self.steps) >= MAX_STEPS or any(v is self._too_big for v in values):
            return _BROKEN
        if any(m["made_by"] == _BROKEN for m in _markers(values)):
            return _BROKEN
        self.steps.append((name, snap, named))
        index = len(self.steps) - 1
        for m in _markers(values):
            self._touched.setdefault(m["made_by"], []).append(index)
        return index

    def made(self, index: int, result, path: tuple = ()) -> None:
        """The objects `result` of step `index` holds (itself, or inside tuples and lists)."""
        if type(result) in self._classes:
            self._alive.append(result)
            self._made[id(result)] = (self._classes[type(result)], index, path)
        elif isinstance(result, (list, tuple)):
            for i, value in enumerate(result):
                self.made(index, value, (*path, i))

    def setup(self, values: list, before: int) -> list[int] | None:
        """The steps before step `before` that remake the objects `values` hold (markers);
        None when one of them cannot be remade (or the call itself was no step)."""
        if before == _BROKEN:
            return None
        needed: set[int] = set()
        todo = [m["made_by"] for m in _markers(values)]
        seen: set[int] = set()
        while todo:
            made_by = todo.pop()
            if made_by == _BROKEN:
                return None
            if made_by in seen:
                continue
            seen.add(made_by)
            for k in [made_by, *self._touched.get(made_by, [])]:
                if k < before and k not in needed:
                    needed.add(k)
                    todo += [m["made_by"] for m in _markers(self.steps[k][1:])]
        return sorted(needed)

    def _recording_method(self, name: str, method):
        objects = self

        @functools.wraps(method)
        def recorded(this, *args, **kwargs):
            index = objects.step(name, (this, *args), kwargs)
            result = method(this, *args, **kwargs)
            objects.made(index, result)
            return result

        return recorded


def _bound_here(cls: type, module) -> bool:
    """A class the extension binds (pybind's, or the module's own), not one it re-exports
    (torch.Tensor, an enum of the standard library)."""
    own = getattr(module, "__name__", "")
    return cls.__module__ == own or cls.__module__.split(".")[-1] == own.split(".")[-1]


def is_marker(value) -> bool:
    """Whether a recorded value stands for an object (see `_Objects.marked`)."""
    return isinstance(value, dict) and "kminer_object" in value


def _markers(values) -> list[dict]:
    found = []
    for v in values:
        if is_marker(v):
            found.append(v)
        elif isinstance(v, dict):
            found += _markers(list(v.values()))
        elif isinstance(v, (list, tuple)):
            found += _markers(v)
    return found


def kept_steps(steps: list, calls: list) -> tuple[list, list]:
    """The steps the kept `calls` need (their setups, element 5 of each), renumbered in order,
    with each call's setup and every marker pointing at the new numbers."""
    needed = sorted({k for c in calls for k in (c[5] if len(c) > 5 else [])})
    number = {k: i for i, k in enumerate(needed)}

    def renumber(value):
        if is_marker(value):
            return {**value, "made_by": number.get(value["made_by"], _BROKEN)}
        if isinstance(value, list):
            return [renumber(v) for v in value]
        if isinstance(value, tuple):
            return tuple(renumber(v) for v in value)
        if isinstance(value, dict):
            return {k: renumber(v) for k, v in value.items()}
        return value

    out_steps = [renumber(list(steps[k])) for k in needed]
    out_calls = [
        (*renumber(list(c[:5])), [number[k] for k in c[5]], *c[6:]) if len(c) > 5 else c
        for c in calls
    ]
    return out_steps, out_calls
