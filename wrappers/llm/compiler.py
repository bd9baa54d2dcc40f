"""The compiler's side of the reflection loop: what the model is shown of a failed build, and a
verdict cache so that the same label is never compiled twice.

nvcc reports lines of the batch file (`kminer_<id>.cu(N)`, counted from the label body); the
model only knows its own host_code, so we rewrite those to `host_code:K`, `device code:N` or
`binding`, and keep the first errors only: the first one usually explains the rest, and a long
log costs tokens and attention.
"""

from __future__ import annotations

import re

from wrappers.batching import split_label

LOG_LINES = 40
LINE_CHARS = 240
_ERROR = re.compile(r"(?:\(\d+\)|:\d+(?::\d+)?): (?:catastrophic |fatal )?error\b")


def error_excerpt(log: str, limit: int = LOG_LINES) -> str:
    """From the first error on, at most `limit` lines: each error once (a dispatch macro repeats
    it per dtype), no caret lines, long lines (macro expansions) clipped."""
    lines = [ln.rstrip() for ln in log.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if _ERROR.search(ln)), None)
    if start is None:
        return "\n".join(_clip(ln) for ln in lines[-limit:])
    out: list[str] = []
    seen: set[str] = set()
    repeated = False
    for line in lines[start:]:
        if _ERROR.search(line):
            repeated = line in seen
            seen.add(line)
        noise = set(line.strip()) <= {"^", "~"} or "detected in the compilation of" in line
        if not (repeated or noise):
            out.append(_clip(line))
        if len(out) == limit:
            break
    return "\n".join(out)


def _clip(line: str) -> str:
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + " [...]"


class LineMapper:
    """Rewrites label line references in nvcc output to places the model can find."""

    def __init__(self, label_text: str, host_code: str) -> None:
        body = split_label(label_text)[1].splitlines()
        host = host_code.splitlines()
        self.host_start = next(
            (i for i in range(len(body)) if host and body[i : i + len(host)] == host), -1
        )
        self.host_len = len(host)

    def where(self, line: int) -> str:
        index = line - 1
        if self.host_start < 0 or index < self.host_start:
            return f"device code:{line}"
        if index < self.host_start + self.host_len:
            return f"host_code:{index - self.host_start + 1}"
        return "binding"

    def apply(self, text: str, cid: str) -> str:
        pattern = rf"(?:\S*kminer_{re.escape(cid)}\.cu|\blabel\.cu)(?:\((\d+)\)|:(\d+)(?::\d+)?)"
        return re.sub(pattern, lambda m: self.where(int(m.group(1) or m.group(2))), text)
