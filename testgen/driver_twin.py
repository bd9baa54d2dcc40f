"""The repository's CPU driver of an op: a Python function beside the CUDA one, with the same
parameters, that runs the op on CPU tensors through a CPU binding.

mmcv's `points_in_boxes_all(points, boxes)` allocates `box_idxs_of_pts` (B, N, M), hands it
with the two inputs to the CUDA binding `points_in_boxes_all_forward` and returns it. Beside it,
`points_in_boxes_cpu(points, boxes)` takes the same parameters, loops over the batch and calls the
CPU binding `points_in_boxes_cpu_forward` on each sample with the output transposed ((M, N) a
sample). No C++ links the two and their bindings take different shapes; the Python does, by
giving the two functions the same parameters and naming one for the CPU. That function is the
op's reference, vendored as the repository wrote it, with its extension module bound to the CPU
binding's C++ function (and its closure), built beside it on first use.

Its arguments come from the CUDA driver's call of the binding: each binding argument a parameter
of the driver (`boxes.contiguous()`), or the tensor the driver returns (the output, which the
reference's result is copied into). A driver that computes an argument any other way gives no
twin. A pairing of the wrong two functions (mmcv's `points_in_boxes_part` takes the same
parameters and writes a (B, N) output) fails the reference's check on the recorded calls.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from testgen import pysources
from testgen.carry import Unmappable, bound_function, carry_down
from testgen.python_reference import Pairing, checked_reference
from testgen.vendor import vendor_function

_KEEPS = {"contiguous", "float", "detach", "clone"}  # what the driver does to a parameter
_CPU_WORDS = ("cpu", "host")


@dataclass(frozen=True)
class DriverTwin:
    """The CPU driver of the op a CUDA driver runs, and how the CUDA binding's arguments map
    onto its parameters: per binding argument, ("param", name) or ("output",)."""

    file: str  # relative to the repository
    cuda_driver: str
    cpu_driver: str
    module: str  # the name the CPU driver reaches its extension by (`ext_module`)
    cpu_binding: str
    cpp: str  # the C++ function the CPU binding exposes
    args: tuple  # the CUDA binding's arguments' sources


def _module_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _binding_calls(fn: ast.FunctionDef) -> list[tuple[str, str, ast.Call]]:
    """(module name, binding, call) of every `<name>.<binding>(...)` in the function."""
    out = []
    for node in ast.walk(fn):
        f = node.func if isinstance(node, ast.Call) else None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            out.append((f.value.id, f.attr, node))
    return out


def _params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.args]


def _returned(fn: ast.FunctionDef) -> set[str]:
    return {
        n.value.id
        for n in ast.walk(fn)
        if isinstance(n, ast.Return) and isinstance(n.value, ast.Name)
    }


def _arg_source(node: ast.expr, params: list[str], returned: set[str]) -> tuple | None:
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _KEEPS
        and not node.args
    ):
        node = node.func.value
    if isinstance(node, ast.Name) and node.id in params:
        return ("param", node.id)
    if isinstance(node, ast.Name) and node.id in returned:
        return ("output",)
    return None


def driver_twins(refs, binding: str) -> list[DriverTwin]:
    """Every CPU driver beside a module-level Python function that calls `binding`."""
    root = Path(refs.disc.root)
    found = []
    for path in sorted(root.rglob("*.py")):  # text and trees cached per process (pysources)
        source = pysources.text(path) if ".git" not in path.parts else None
        tree = pysources.tree(path) if source and binding in source else None
        if tree is None:
            continue
        fns = _module_functions(tree)
        for name, fn in fns.items():
            calls = [c for _, b, c in _binding_calls(fn) if b == binding]
            if len(calls) != 1:
                continue
            params, returned = _params(fn), _returned(fn)
            args = tuple(_arg_source(a, params, returned) for a in calls[0].args)
            if not args or None in args or calls[0].keywords or ("output",) not in args:
                continue
            for other, ofn in fns.items():
                if other == name or _params(ofn) != params:
                    continue
                if not any(w in other.lower().split("_") for w in _CPU_WORDS):
                    continue
                for module, cpu_binding, _ in _binding_calls(ofn):
                    cpp = bound_function(refs, cpu_binding, cpu_side=True)
                    item = refs.definition(cpp, host_side=True) if cpp else None
                    if item is None or cpu_binding == binding:
                        continue
                    rel = str(path.relative_to(root))
                    found.append(DriverTwin(rel, name, other, module, cpu_binding, cpp, args))
                    break
    return found


_LOADER = """

_KMINER_CPU_SOURCE = {source!r}


def _kminer_cpu_module():
    \"\"\"The repository's CPU binding `{binding}` ({cpp}, {file}), built from its C++ when this
    module is imported (CPU only; in KMINER_BUILD_DIR when set, so a test's run phase finds
    what its build phase built, and the reference's time limit never counts a build).\"\"\"
    import hashlib
    import os
    import tempfile
    from pathlib import Path

    from torch.utils import cpp_extension

    digest = hashlib.sha256(_KMINER_CPU_SOURCE.encode()).hexdigest()[:16]
    base = Path(os.environ.get("KMINER_BUILD_DIR") or tempfile.gettempdir())
    where = base / f"kminer_cpu_{{digest}}"
    where.mkdir(parents=True, exist_ok=True)
    src = where / "cpu.cpp"
    if not src.exists() or src.read_text() != _KMINER_CPU_SOURCE:
        src.write_text(_KMINER_CPU_SOURCE)
    return cpp_extension.load(
        name=f"kminer_cpu_{{digest}}", sources=[str(src)], build_directory=str(where))


{module} = _kminer_cpu_module()
"""


def _positions(calls: list, hosts: list) -> dict[int, int] | None:
    """Binding argument -> the exposed function's argument holding that very tensor, the same
    in every carried call; None where a tensor argument has no such place."""
    import torch

    found: dict[int, int] | None = None
    for call, host in zip(calls, hosts, strict=True):
        here = {}
        for j, a in enumerate(call.args):
            if not isinstance(a, torch.Tensor):
                continue
            same = [k for k, h in enumerate(host) if h is a]
            if len(same) != 1:
                return None
            here[j] = same[0]
        if found is not None and here != found:
            return None
        found = here
    return found


def _adapter(twin: DriverTwin, host: list[str], at: dict[int, int]) -> str | None:
    kwargs, out = [], None
    for j, src in enumerate(twin.args):
        if src[0] == "param":
            if j not in at:
                return None
            kwargs.append(f"{src[1]}=args[{at[j]}]")
        else:
            out = at.get(j)
    lines = [
        "",
        "",
        f"# kminer's adapter: the label's arguments, as {twin.cuda_driver} hands them to the CUDA",
        f"# binding, given to {twin.cpu_driver}; its result goes where the CUDA binding writes.",
        f"def reference({', '.join(host)}):",
        f"    args = [{', '.join(host)}]",
        f"    result = {twin.cpu_driver}({', '.join(kwargs)})",
    ]
    if out is None:
        lines.append("    return result")
    else:
        lines += [
            f"    if tuple(result.shape) != tuple(args[{out}].shape):",
            "        raise RuntimeError(f'kminer: {tuple(result.shape)} from the CPU driver, "
            f"{{tuple(args[{out}].shape)}} written by the binding')",
            f"    args[{out}].copy_(result)",
        ]
    return "\n".join(lines) + "\n"


def driver_reference(cand, refs, recorded, bindings: list[str], host, workdir: Path):
    """(Reference, recorded calls) from the CPU driver beside the CUDA driver of one of
    `bindings`, or why there is none. `host`: the exposed function's (type, name) pairs."""
    from testgen.reference import module_source

    problems = []
    repo = Path(refs.disc.root)
    for binding in bindings:
        calls = [c for c in recorded.get(binding, []) if not c.kwargs]
        carried = []
        for c in calls:
            try:
                carried.append((c, carry_down(c, cand, refs)))
            except Unmappable:
                continue
        for twin in driver_twins(refs, binding):
            at = _positions([c for c, _ in carried], [h for _, h in carried]) if carried else None
            if at is None:
                problems.append(
                    f"{twin.cpu_driver}: no recorded call of {binding} maps its tensors"
                )
                continue
            body = vendor_function(repo, twin.file, twin.cpu_driver, given=(twin.module,))
            if body.startswith("!"):
                problems.append(f"{twin.cpu_driver}: {body[1:]}")
                continue
            item = refs.definition(twin.cpp, host_side=True)
            adapter = _adapter(twin, [n for _, n in host], at)
            if adapter is None:
                problems.append(f"{twin.cpu_driver}: a parameter the label does not take")
                continue
            loader = _LOADER.format(
                source=module_source(refs, item, twin.cpu_binding),
                binding=twin.cpu_binding,
                cpp=twin.cpp,
                file=item.file,
                module=twin.module,
            )
            code = (
                f'"""The repository\'s CPU driver `{twin.cpu_driver}` ({twin.file}), vendored with '
                f"what it needs,\nas the CPU reference of `{twin.cuda_driver}`'s binding "
                f'`{binding}`; paired by kminer (testgen.driver_twin)."""\n\n'
                + body
                + loader
                + adapter
            )
            pairing = Pairing(twin.cpu_driver, twin.file)
            hosts = [h for _, h in carried]
            ref = checked_reference(cand, code, pairing, host, workdir, hosts, twin.cpu_driver)
            if isinstance(ref, str):
                problems.append(f"{twin.cpu_driver}: {ref}")
                continue
            return ref, [c for c, _ in carried]
    return "; ".join(problems) or "no CPU driver beside the Python that calls " + (
        " or ".join(bindings) or "the op"
    )
