"""The house's shape, checked: floors that follow the pipeline, no import cycles, and the files
that travel to a GPU box importing nothing a GPU box lacks.

Every import counts, wherever it sits (inside a function or under TYPE_CHECKING too): an import
hidden in a function to dodge a cycle is still the cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS = {"miner": 0, "wrappers": 1, "testgen": 2, "curation": 3}
UPWARD_ALLOWED = ("miner.cli",)  # the CLI assembles the commands from every floor
TRAVELLERS = [
    *sorted((ROOT / "testgen" / "standalone").glob("*.py")),
    ROOT / "wrappers" / "batching.py",
    ROOT / "miner" / "toolchain.py",
    ROOT / "miner" / "sandbox.py",
    ROOT / "miner" / "supervisor.py",
]
SIBLINGS = {path.stem for path in TRAVELLERS} - {"__init__"}  # they import each other
TRAVEL_OK = {"torch", "pytest", "numpy", "clang", "miner", "wrappers", "testgen"} | SIBLINGS
TRAVEL_OK |= {"setuptools"}  # torch needs it on Python >= 3.12; setup.py files import it anyway


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.glob("*/**/*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[0] not in FLOORS:
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """kminer modules `name` imports (the deepest known module of each import)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_no_floor_imports_a_higher_one_outside_the_cli():
    upward = [
        f"{a} -> {b}"
        for a, targets in _graph().items()
        for b in targets
        if FLOORS[b.split(".")[0]] > FLOORS[a.split(".")[0]] and not a.startswith(UPWARD_ALLOWED)
    ]
    assert upward == []


def test_the_checks_see_a_cycle_and_an_upward_import():
    graph = {"miner.a": {"miner.b"}, "miner.b": {"miner.a"}, "miner.c": set()}
    assert _cycles(graph) == [["miner.a", "miner.b"]]
    known = {"miner.x": ROOT / "miner" / "store.py", "curation.reviews": ROOT}
    assert _imports("miner.x", ROOT / "miner" / "store.py", known) == set()
    reviews = ROOT / "curation" / "reviews.py"
    assert "miner.store" in _imports("curation.reviews", reviews, _modules())


def test_files_that_travel_import_only_what_a_gpu_box_has():
    for path in TRAVELLERS:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in TRAVEL_OK, f"{path}: {name}"
                if top in FLOORS:  # only kminer's own travellers, which sit beside it too
                    assert set(name.split(".")[-2:]) & SIBLINGS, f"{path}: {name}"
