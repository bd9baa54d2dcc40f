"""What a kernel computes, in words, for the `What it computes` section of its instruction.

A row's description comes from, in order: a model's answer already stored for the candidate (an
attempt of step `describe` that passed the checks), the comment block right above the kernel in
its file, or the docstring of the Python function or class that calls the op. The repository's
files are read, never run: the Python is parsed with `ast`. With an endpoint configured, `ask`
gets the model's description through the shared checked loop (cached, every answer stored).
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

from curation.instructions import (
    Description,
    complete_text,
    derive_instruction,
    function_of,
    read_label,
)
from miner.candidate import Candidate
from wrappers.llm.turns import Answer, ask_checked

STEP = "describe"
TEMPLATE = "llm_describe.v1.j2"
MAX_CHARS = 700
_SKIP_DIRS = {"tests", "test", ".git", "build", "docs", "examples"}
_LEGAL = re.compile(r"copyright|licen[sc]e|all rights reserved|spdx", re.I)


def stored(store, cand_id: str) -> str:
    """The model's description that passed the checks, latest first; '' when none."""
    passed = [a for a in store.attempts(cand_id) if a["step"] == STEP and a["passed"]]
    return (passed[-1]["parsed"] or {}).get("description", "") if passed else ""


def comment_above(root: Path, cand: Candidate) -> str:
    """The comment block that ends right above the kernel's definition (no license text)."""
    path = root / cand.kernel.file
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    block: list[str] = []
    i = cand.kernel.start_line - 2
    while i >= 0:
        text = lines[i].strip()
        if not (text.startswith(("//", "/*", "*")) or text.endswith("*/")):
            break
        block.insert(0, re.sub(r"^(/\*+|\*+/|//+|\*+)|\*+/$", "", text).strip())
        i -= 1
    words = " ".join(w for w in block if w)
    return "" if _LEGAL.search(words) or len(words) < 12 else words


@lru_cache(maxsize=16)
def docstrings(root: Path) -> dict[str, str]:
    """op name → the first paragraph of the docstring of the Python code that calls it
    (`ext_module.<op>(...)`): the calling function's, its class's, else the file's first class
    docstring (mmcv documents the nn.Module, not the autograd Function that calls the op)."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if _SKIP_DIRS & set(rel[:-1]) or path.stat().st_size > 512_000:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        first_class = next(
            (d for n in tree.body if isinstance(n, ast.ClassDef) and (d := ast.get_docstring(n))),
            "",
        )
        for node in tree.body:
            for inner, outer in _functions(node):
                doc = (
                    ast.get_docstring(inner) or (outer and ast.get_docstring(outer)) or first_class
                )
                if not doc:
                    continue
                for call in ast.walk(inner):
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
                        found.setdefault(call.func.attr, _paragraph(doc))
    return found


def _functions(node: ast.AST):
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        yield node, None
    elif isinstance(node, ast.ClassDef):
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                yield item, node


def _paragraph(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n", 1)[0].split())[:MAX_CHARS]


def from_repository(root: Path | None, cand: Candidate) -> Description:
    if root is None or not root.is_dir():
        return Description("", "")
    comment = comment_above(root, cand)
    if comment:
        return Description(comment, "comment")
    docs = docstrings(root)
    for name in (cand.wrapper.op_map.get("python_name"), function_of(cand), cand.kernel.name):
        if name and docs.get(name):
            return Description(docs[name], "docstring")
    return Description("", "")


def description(model_text: str, cand: Candidate, root: Path | None) -> Description:
    """The model's description when there is one (`stored`), else the repository's."""
    return Description(model_text, "llm") if model_text else from_repository(root, cand)


def check(text: str) -> str:
    """'' when the description is usable, else what is wrong with it (goes back to the model)."""
    if "```" in text or "__global__" in text:
        return "the description must be prose, without code"
    if len(text) > MAX_CHARS:
        return f"the description has {len(text)} characters; at most {MAX_CHARS}"
    if len(text.split()) < 8:
        return "the description is too short: say what each output holds"
    return ""


def ask(client, store, cand: Candidate, workdir: Path, root: Path | None, max_attempts: int) -> str:
    """Ask the model (unless a description already passed); '' or the `llm: ...` failure."""
    if stored(store, cand.id):
        return ""
    reference = workdir / cand.reference.path if cand.reference.path else None
    context = dict(
        kernel=cand.kernel,
        function=function_of(cand),
        repo_url=cand.provenance.repo_url,
        hint=from_repository(root, cand).text,
        label_code=read_label(workdir, cand),
        reference_code=reference.read_text(errors="replace")
        if reference and reference.is_file()
        else "",
        reference_lang="python" if cand.reference.path.endswith(".py") else "cpp",
        max_chars=MAX_CHARS,
    )
    got = ask_checked(
        client,
        store,
        cand,
        step=STEP,
        template=TEMPLATE,
        context=context,
        check=check,
        max_attempts=max_attempts,
        field="description",
    )
    return "" if isinstance(got, Answer) else got


def repo_root(store, cand: Candidate) -> Path | None:
    """Where the workdir keeps the candidate's repository checkout (None when it is gone)."""
    for row in store.repos():
        if (row.url, row.commit) == (cand.provenance.repo_url, cand.provenance.commit) and row.root:
            return Path(row.root)
    return None


def generated(store, cand: Candidate, workdir: Path | None) -> tuple[str, str]:
    """The rule-made (instruction_complete, instruction) of a candidate, as export writes them
    when no curator edited them: what the review page shows and edits start from."""
    label = read_label(Path(workdir), cand) if workdir else ""
    complete = complete_text(cand, label, description(stored(store, cand.id), cand,
                                                      repo_root(store, cand)))  # fmt: skip
    return complete, derive_instruction(complete)
