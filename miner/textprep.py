"""Text views of a source file that keep byte offsets, so every later answer points into the file.

Sources are decoded as latin-1: one character per byte, so string offsets equal byte offsets
and the original bytes (valid UTF-8 or not) come back unchanged with `.encode("latin-1")`.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

_LEXEMES = re.compile(
    r"""
      (?P<line_comment>//(?:[^\n\\]|\\.|\\\n)*)
    | (?P<block_comment>/\*.*?(?:\*/|\Z))
    | (?P<raw>\bR"(?P<delim>[^()\\\s"]{0,16})\(.*?\)(?P=delim)")
    | (?P<number>\b\d[\w']*(?:\.[\w']*)?)
    | (?P<string>"(?:[^"\\\n]|\\.|\\\n)*")
    | (?P<char>'(?:[^'\\\n]|\\.){1,8}')
    """,
    re.VERBOSE | re.DOTALL,
)
_NOT_NEWLINE = re.compile(r"[^\n]")


def decode(data: bytes) -> str:
    return data.decode("latin-1")


def encode(text: str) -> bytes:
    return text.encode("latin-1")


def readable(text: str) -> str:
    """Turn a latin-1 view back into proper text for humans and datasets."""
    return encode(text).decode("utf-8", errors="replace")


def blank_comments_and_strings(text: str) -> str:
    """Comments become spaces and literals lose their contents; newlines and length stay."""

    def repl(m: re.Match) -> str:
        kind = m.lastgroup
        s = m.group(0)
        if kind == "number":
            return s
        if kind in ("line_comment", "block_comment"):
            return _NOT_NEWLINE.sub(" ", s)
        # keep the quotes so the code still reads as a literal
        if kind == "raw" or kind == "delim":
            return 'R"' + _NOT_NEWLINE.sub(" ", s[2:-1]) + '"'
        return s[0] + _NOT_NEWLINE.sub(" ", s[1:-1]) + s[-1]

    return _LEXEMES.sub(repl, text)


_PP_LINE = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b.*$", re.MULTILINE)


def first_branch_view(code: str) -> str:
    """Blank every #elif/#else branch, keeping only the first branch of each conditional:
    braces then balance the way they do for a compiler that takes one path."""
    out = list(code)
    depth_skipping: list[bool] = []  # per open conditional: are we in a later branch?
    pos = 0
    for m in _PP_LINE.finditer(code):
        if any(depth_skipping):
            for i in range(pos, m.start()):
                if out[i] != "\n":
                    out[i] = " "
        kind = m.group(1)
        if kind in ("if", "ifdef", "ifndef"):
            depth_skipping.append(False)
        elif kind in ("elif", "else") and depth_skipping:
            depth_skipping[-1] = True
        elif kind == "endif" and depth_skipping:
            depth_skipping.pop()
        pos = m.end()
    return "".join(out)


class LineIndex:
    """Offset → line in O(log n), built once per file."""

    def __init__(self, text: str) -> None:
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def line(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset)


@dataclass
class Rewrite:
    """Replacements on a text, with a map from offsets in the new text back to the old one."""

    text: str
    edits: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, new)

    def apply(self) -> RewrittenText:
        parts: list[str] = []
        spans: list[tuple[int, int, int, int]] = []  # (new_start, new_end, old_start, old_end)
        pos = out_len = 0
        for start, end, new in sorted(self.edits):
            if start < pos:  # overlapping edit: the first one wins
                continue
            parts.append(self.text[pos:start])
            out_len += start - pos
            spans.append((out_len, out_len + len(new), start, end))
            parts.append(new)
            out_len += len(new)
            pos = end
        parts.append(self.text[pos:])
        return RewrittenText("".join(parts), spans)


@dataclass
class RewrittenText:
    text: str
    spans: list[tuple[int, int, int, int]]

    def __post_init__(self) -> None:
        self._new_starts = [s[0] for s in self.spans]

    def to_original(self, offset: int) -> int:
        i = bisect.bisect_right(self._new_starts, offset) - 1
        if i < 0:
            return offset
        new_start, new_end, old_start, old_end = self.spans[i]
        if offset < new_end:
            return old_start if offset == new_start else old_end
        return old_end + (offset - new_end)


IDENT = re.compile(r"(?<![\w.])(?<!->)(?<!\.\s)[A-Za-z_]\w*")


def split_top(text: str, angle: bool = True) -> list[str]:
    """Split on commas outside brackets (and outside `<...>` when `angle`: C++ template
    arguments; the preprocessor's macro arguments do not nest in `<>`). Empty parts dropped."""
    opening, closing = ("(<[{", ")>]}") if angle else ("([{", ")]}")
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in opening:
            depth += 1
        elif ch in closing:
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def bracket_end(code: str, i: int, op: str, cl: str, limit: int | None = None) -> int | None:
    """The offset just past the `cl` that closes the `op` at or after `i` (within `limit`
    characters when given), or None when it is not closed."""
    depth = 0
    stop = len(code) if limit is None else min(len(code), i + limit)
    for j in range(i, stop):
        if code[j] == op:
            depth += 1
        elif code[j] == cl:
            depth -= 1
            if depth == 0:
                return j + 1
    return None


_BARE_CALL = re.compile(r"(?<![\w.>:])([A-Z_][A-Z0-9_]+)\s*\(")


def enclosing_calls(code: str, pos: int) -> list[str]:
    """The names before the parentheses still open at `pos` within its statement, innermost
    first (`["", "TORCH_CHECK"]` inside `TORCH_CHECK((x.dim() >= 2) && ...)`, `["if"]` in an
    if's condition): what a condition there decides."""
    names, depth = [], 0
    for i in range(pos - 1, -1, -1):
        c = code[i]
        if c == ")":
            depth += 1
        elif c == "(":
            if depth == 0:
                end = i
                while end > 0 and code[end - 1].isspace():
                    end -= 1
                start = end
                while start > 0 and (code[start - 1].isalnum() or code[start - 1] == "_"):
                    start -= 1
                names.append(code[start:end])
            else:
                depth -= 1
        elif c in ";{}":
            break
    return names


def blank_bare_macro_calls(source: str) -> str:
    """The source with each statement that is only a macro call written without a semicolon
    (`FOO(T, 32, 8)` on its own line inside a function, as SparseConvNet expands its launch
    macros) turned into blanks, so that the grammar does not lose the rest of the file; every
    offset stays, and the text the refs are read from is not this one."""
    code = blank_comments_and_strings(source)
    out, seen = list(source), list(code)  # `seen`: the code as blanked so far
    depth, pos = 0, 0
    for m in _BARE_CALL.finditer(code):
        depth += code.count("{", pos, m.start()) - code.count("}", pos, m.start())
        pos = m.start()
        if depth <= 0:
            continue
        close = bracket_end(code, m.end() - 1, "(", ")")
        if close is None:
            continue
        j = m.start() - 1
        while j >= 0 and seen[j].isspace():
            j -= 1
        before = seen[j] if j >= 0 else ""
        after = code[close:].lstrip()[:1]
        if before in (";", "{", "}", "") and (after.isalpha() or after in ("_", "}", "#")):
            for i in range(m.start(), close):
                if out[i] != "\n":
                    out[i] = seen[i] = " "
    return "".join(out)
