"""Op-level rows: one task for a host function that launches several kernels.

When a repository's launcher runs several kernels (scan then gather, a mask then its reduction,
one variant per block size), each of them is mined with the same label (the whole host function
with all its kernels) and the same test against the op's CPU implementation: a test can judge
only what the op returns. That label is an op-level task, so it is exported once more as an op
row (`level: op`) whose instruction asks for the host function and all its kernels. Each kernel
keeps its kernel-level row where it verified: its instruction gives the rest of the file and
asks for that kernel's body alone, and its kill rate was measured on wrong versions of that one
kernel. Where there are several, the op row's kill rate is the lowest of its kernels'.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from miner.candidate import Candidate, StageName
from miner.textprep import blank_comments_and_strings, bracket_end

BODY_BEGIN = "// kminer-label-body-begin"
_GLOBAL = re.compile(r"\b__global__\b")
_OPEN = re.compile(r"__launch_bounds__\s*\(|\(")
_NAME = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^;{}()]*>)?\s*$")
ELIDED = "{\n  // your code here\n}"


@dataclass(frozen=True)
class KernelSpan:
    name: str
    start: int  # the `__global__` token (a template header before it is not included)
    body: int  # the `{` that opens its body
    end: int  # just past the `}` that closes it


def body(label_text: str) -> str:
    """The part of a label that is the task (kernels, device code, host function), without
    the header comment that names the candidate."""
    return label_text.split(BODY_BEGIN, 1)[-1]


def kernel_spans(text: str) -> list[KernelSpan]:
    """Every `__global__` function the text defines (declarations without a body are not)."""
    code = blank_comments_and_strings(text)
    spans = []
    for m in _GLOBAL.finditer(code):
        pos = m.end()
        paren = _OPEN.search(code, pos)
        while paren is not None and paren.group(0) != "(":  # __launch_bounds__(...)
            close = bracket_end(code, paren.end() - 1, "(", ")")
            paren = _OPEN.search(code, close) if close else None
        if paren is None:
            continue
        name = _NAME.search(code, pos, paren.start())
        close = bracket_end(code, paren.start(), "(", ")")
        if name is None or close is None:
            continue
        rest = code[close:].lstrip()
        if not rest.startswith("{"):
            continue  # a declaration
        brace = close + (len(code) - close - len(rest))
        end = bracket_end(code, brace, "{", "}")
        if end is not None:
            spans.append(KernelSpan(name.group(1), m.start(), brace, end))
    return spans


def kernels(label_text: str) -> list[str]:
    """The kernels a label defines, in order, each once."""
    return list(dict.fromkeys(s.name for s in kernel_spans(body(label_text))))


def heads(label_text: str) -> dict[str, str]:
    """Each kernel's declaration as written, without its body, on one line."""
    text = body(label_text)
    code = blank_comments_and_strings(text)
    out: dict[str, str] = {}
    for s in kernel_spans(text):
        template = re.search(r"template\s*<[^{};]*>\s*$", code[max(0, s.start - 400) : s.start])
        start = s.start - (len(template.group(0)) if template else 0)
        out.setdefault(s.name, " ".join(code[start : s.body].split()))
    return out


def with_kernel_elided(label_text: str, kernel: str) -> str | None:
    """The label's task text with `kernel`'s body replaced by a placeholder: what a
    kernel-level row of a multi-kernel op gives, so that only that kernel is asked for. None
    when the label does not define it exactly once."""
    text = body(label_text)
    spans = [s for s in kernel_spans(text) if s.name == kernel]
    if len(spans) != 1:
        return None
    s = spans[0]
    return (text[: s.body] + ELIDED + text[s.end :]).strip("\n") + "\n"


def op_key(label_text: str) -> str:
    """Candidates whose labels have the same task text are one op."""
    return hashlib.sha256(body(label_text).encode()).hexdigest()[:16]


def op_id(repo_url: str, commit: str, function: str, names: list[str]) -> str:
    """Stable over reruns, like a candidate's id: the op's host function and its kernels."""
    key = "|".join(["op", repo_url, commit, function, ",".join(names)])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Member:
    """A candidate whose label is the op's (accepted or not): what its own test showed."""

    id: str
    kernel: str
    outcome: str  # the verify outcome, "not verified" when there was none
    kill_rate: float | None


@dataclass
class Op:
    key: str
    kernels: list[str]
    members: list[Member]

    def incomplete(self) -> list[str]:
        """Why there is no op row: each kernel of the label whose test with this label did not
        pass, or that no test with this label ran (its wrong versions were never tried)."""
        why = [f"{m.kernel}: {m.outcome}" for m in self.members if m.outcome != "pass"]
        tested = {m.kernel for m in self.members}
        return why + [f"{n}: not tested with this label" for n in self.kernels if n not in tested]

    def kill_rate(self) -> float | None:
        kills = [m.kill_rate for m in self.members]
        return None if None in kills or not kills else min(kills)


def collect(ops_by_key: dict[str, Op], cand: Candidate, label_text: str) -> None:
    """Add `cand` to its op in `ops_by_key` when its label holds several kernels."""
    names = kernels(label_text)
    if len(names) < 2:
        return
    verify = cand.stage(StageName.VERIFY)
    metrics = verify.metrics if verify else {}
    op = ops_by_key.setdefault(op_key(label_text), Op(op_key(label_text), names, []))
    outcome = metrics.get("outcome") or "not verified"
    op.members.append(Member(cand.id, cand.kernel.name, outcome, metrics.get("kill_rate")))
