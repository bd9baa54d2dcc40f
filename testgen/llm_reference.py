"""A PyTorch CPU reference written by a model, for a kernel whose repository has no CPU code.

Third in the order of references (after the repository's CPU function and its own PyTorch code):
the model reads the label (kernel, device helpers, host function) and writes `reference` with
the host function's parameters, in plain PyTorch. The repository's pure-PyTorch functions that
look like the same op (`multi_scale_deformable_attn_pytorch`, `_upfirdn2d_ref`...) are shown to
it; an answer that uses one is kind `python` (the repository's code, adapted), else `llm`.

Nothing is trusted unchecked: the answer must parse, define `reference` with the right
parameters and import only torch and the standard library, then run in the sandbox on the
recorded calls and do something (refcheck.py). Every answer is an attempt row; a failed check
goes back to the model as the next turn, up to `max_attempts` answers. The client caches, so a
rerun asks nothing. The GPU verdict (and the wrong variants) judge the reference further: a
reference that disagrees with the kernel makes a test that fails, never one that passes.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from miner.candidate import Candidate, Reference
from testgen.sandbox import run_checker
from testgen.standalone import REFCHECK
from wrappers.llm import turns
from wrappers.llm.client import LLMClient

TEMPLATE = "llm_reference.v1.j2"
CHECK_TIMEOUT_S = 120.0
_REF_NAME = re.compile(r"(?:_ref|_reference|_pytorch|_torch|_naive|_cpu|_python)$")
_GENERIC = {
    "cuda",
    "kernel",
    "forward",
    "backward",
    "cpu",
    "gpu",
    "ref",
    "reference",
    "pytorch",
    "torch",
    "naive",
    "launcher",
    "impl",
    "op",
    "ops",
    "python",
    "func",
    "the",
    "fwd",
    "bwd",
}
MAX_SOURCE = 4000  # characters of a repository function shown to the model


@dataclass(frozen=True)
class PyRef:
    name: str
    file: str  # relative to the repository root
    source: str


@functools.cache
def repo_python_refs(root: str) -> tuple[PyRef, ...]:
    """The repository's functions named like a reference implementation, outside its tests."""
    out = []
    for path in sorted(Path(root).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if ".git" in path.parts or re.search(r"(^|/)tests?/|(^|/)test_", rel):
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
            tree = ast.parse(text)
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and _REF_NAME.search(node.name):
                source = ast.get_source_segment(text, node) or ""
                if source and len(source) <= MAX_SOURCE:
                    out.append(PyRef(node.name, rel, source))
    return tuple(out)


def _words(name: str) -> set[str]:
    return {w for w in re.split(r"[_\W\d]+", name.lower()) if len(w) >= 3} - _GENERIC


def related_refs(cand: Candidate, refs: tuple[PyRef, ...], limit: int = 2) -> list[PyRef]:
    """The repository references sharing the most name words with the kernel and its op."""
    mine = _words(cand.kernel.name) | _words(cand.wrapper.op_map.get("python_name") or "")
    scored = [(len(mine & _words(r.name)), r) for r in refs]
    scored = [(s, r) for s, r in scored if s > 0]
    scored.sort(key=lambda sr: (-sr[0], sr[1].name))
    return [r for _, r in scored[:limit]]


def _describe(value) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        text = f"tensor of shape {list(value.shape)}, {str(value.dtype).removeprefix('torch.')}"
        if value.numel() and not value.is_floating_point():
            text += f", values {int(value.min())}..{int(value.max())}"
        elif value.numel():
            text += f", values {float(value.min()):.3g}..{float(value.max()):.3g}"
        return text
    return repr(value)[:120]


def contract_problem(code: str, params: list[str]) -> str:
    """The first rule `reference` breaks that running it would not show ('' when none)."""
    return turns.contract_problem(code, "reference", params)


def run_check(code: str, calls: list) -> str:
    """Run the code on the recorded calls in the sandbox: '' when it works, else the problem."""
    files = {"reference.py": code, "calls.pt": calls}
    done = run_checker(
        REFCHECK, files, "running `reference` on the recorded calls", CHECK_TIMEOUT_S
    )
    return done if isinstance(done, str) else ""


def write_llm_reference(
    cand: Candidate,
    label_text: str,
    params: list[tuple[str, str]],
    calls: list[list],
    *,
    client: LLMClient,
    store,
    workdir: Path,
    repo_root: Path,
    max_attempts: int = 3,
) -> Reference | str:
    """Write `references/<id>.py` from the model's answer and describe it, or say why not."""
    names = [n for _, n in params]
    shown = related_refs(cand, repo_python_refs(str(repo_root)))
    context = dict(
        kernel=cand.kernel,
        function=(cand.wrapper.functions or [cand.wrapper.launcher])[0],
        repo_url=cand.provenance.repo_url,
        label_code=label_text,
        params=[{"name": n, "type": t} for t, n in params],
        example=[{"name": n, "text": _describe(v)} for n, v in zip(names, calls[0], strict=False)],
        python_refs=shown,
    )
    answer = turns.ask_checked(
        client,
        store,
        cand,
        step="reference",
        template=TEMPLATE,
        context=context,
        check=lambda code: contract_problem(code, names) or run_check(code, calls),
        max_attempts=max_attempts,
    )
    if isinstance(answer, str):
        return answer
    return _write(cand, answer.code, answer.strategy, params, shown, client.model, workdir)


def origin(ref: Reference, by: str = "a model") -> str:
    """Where a written reference comes from, in words (its file header, the test's docstring)."""
    if ref.kind == "python":
        return f"adapted by {by} from the repository's `{ref.function}` ({ref.file})"
    return f"written by {by} from the kernel and its host function"


def _write(cand, code, strategy, params, shown, model, workdir: Path) -> Reference:
    used = next((r for r in shown if re.search(rf"\b{re.escape(r.name)}\b", code)), None)
    ref = Reference(
        kind="python" if used else "llm",
        function=used.name if used else "reference",
        file=used.file if used else "",
        path=f"references/{cand.id}.py",
        exposed="reference",
        signature=[t for t, _ in params],
    )
    prov = cand.provenance
    text = (
        f"# kminer reference {cand.id}: a PyTorch CPU reference for {cand.kernel.name},\n"
        f"# {origin(ref, model)}.\n"
        f"# from {prov.repo_url} @ {prov.commit[:12]}  license: {prov.license}\n"
        f"# The model's account: {' '.join(strategy.split())[:300]}\n\n{code.strip()}\n"
    )
    (workdir / "references").mkdir(parents=True, exist_ok=True)
    (workdir / ref.path).write_text(text, encoding="utf-8")
    ref.hash = hashlib.sha256(text.encode()).hexdigest()[:20]
    return ref
