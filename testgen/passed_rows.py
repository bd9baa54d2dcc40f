"""The row width of a tensor's data, read where the host code hands the data to a function.

Host code often passes `rois.data<T>()` straight to a kernel launch or a CPU loop, and only
there is the data stepped by rows: `offset_rois = bottom_rois + n * 5`, `boxes[i * 7 + 2]`, or
by a local constant (`int roi_cols = 5; ... bottom_rois + n * roi_cols`). Without that width a
probe drafts the tensor with one dimension, every draft reads past its end, and the calls that
are left (a dimension more, rows as wide as the draft's size) say nothing of the real layout.
The data may go through a launching function first (torch-points-kernels' host function hands
`idx.DATA_PTR<int>()` to `three_interpolate_kernel_wrapper`, which hands it on to the kernel
that reads `idx[j * 3 + 0]`), and the data call may be spelled through a macro that picks
`data` or `data_ptr` by torch version.
"""

from __future__ import annotations

import re

from miner.textprep import bracket_end, split_top

DATA = r"(?:data_ptr|data|mutable_data_ptr|const_data_ptr)"  # the calls giving a tensor's data
_QUALIFIERS = re.compile(r"\s*(?:const\b|noexcept\b|override\b|\s)*")
_TYPES = r"(?:const\s+|constexpr\s+|static\s+)*(?:int|int64_t|int32_t|long|size_t|auto|unsigned)"
MAX_WIDTH = 64
PASS_DEPTH = 2  # functions a pointer is handed on through before one steps it


def data_macros(code: str) -> str:
    """`code` with each object-like macro that stands for a data call (`#define DATA_PTR
    data_ptr`, one definition per torch version) spelled as that call."""
    names = {
        m[1] for m in re.finditer(rf"#\s*define\s+([A-Za-z_]\w*)[ \t]+{DATA}[ \t]*$", code, re.M)
    }
    if not names:
        return code
    spelled = rf"((?:\.|->)\s*)(?:{'|'.join(map(re.escape, sorted(names)))})\b"
    return re.sub(spelled, r"\1data_ptr", code)


def passed_row(code: str, name: str) -> int | None:
    """The one literal row width the functions `code` hands `name`'s data to step it by
    (1 < width <= MAX_WIDTH), else None (none found, or several that disagree)."""
    handed = rf"\b{re.escape(name)}\s*(?:\.\s*contiguous\s*\(\s*\)\s*)?(?:\.|->)\s*{DATA}"
    handed += r"\s*(?:<[^<>()]+>)?\s*\(\s*\)"
    widths: set[int] = set()
    for m in re.finditer(handed, code):
        at = _argument(code, m.start())
        if at is not None:
            widths |= _widths_in(code, *at)
    return single_width(widths)


def _widths_in(code: str, callee: str, index: int, depth: int = 0) -> set[int]:
    """Widths argument `index` of `callee` is stepped by: in its body, else in the functions
    the body hands that parameter on to whole (a launcher passing its pointer to the kernel)."""
    widths: set[int] = set()
    for param, body in _definitions(code, callee, index):
        found = row_widths(body, param, code)
        if not found and depth < PASS_DEPTH:
            for m in re.finditer(rf"(?<=[(,])\s*{re.escape(param)}\s*(?=[,)])", body):
                at = _argument(body, m.start() + 1)
                if at is not None and at[0] != callee:
                    found |= _widths_in(code, *at, depth=depth + 1)
        widths |= found
    return widths


def single_width(widths: set[int]) -> int | None:
    """The width, where the code steps by one only and it is a plausible row."""
    if len(widths) == 1 and 1 < (width := next(iter(widths))) <= MAX_WIDTH:
        return width
    return None


def _argument(code: str, start: int) -> tuple[str, int] | None:
    """(callee, argument index) of the call whose argument begins or holds offset `start`."""
    depth = 0
    for i in range(start - 1, max(-1, start - 4000), -1):
        ch = code[i]
        if ch in ")]}":
            depth += 1
        elif ch in "([{":
            if depth == 0:
                if ch != "(":
                    return None
                index = len(split_top(code[i + 1 : start] + "x", angle=False)) - 1
                callee = _callee(code[:i])
                return (callee, index) if callee else None
            depth -= 1
        elif ch == ";" and depth == 0:
            return None
    return None


def _callee(before: str) -> str | None:
    """The function named just before a call's `(`: past a launch's `<<<...>>>` and template
    arguments."""
    text = before.rstrip()
    if text.endswith(">>>"):
        opened = text.rfind("<<<")
        if opened < 0:
            return None
        text = text[:opened].rstrip()
    if text.endswith(">"):
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            depth += {">": 1, "<": -1}.get(text[i], 0)
            if depth == 0:
                text = text[:i].rstrip()
                break
        else:
            return None
    m = re.search(r"([A-Za-z_]\w*)$", text)
    keywords = {"if", "for", "while", "switch", "return", "sizeof", "decltype"}
    return m[1] if m and m[1] not in keywords else None


def _definitions(code: str, callee: str, index: int):
    """(name of parameter `index`, body) of each definition of `callee` in `code`."""
    for m in re.finditer(rf"\b{re.escape(callee)}\s*(?:<[^;{{}}()]*>)?\s*\(", code):
        close = bracket_end(code, m.end() - 1, "(", ")")
        if close is None:
            continue
        after = _QUALIFIERS.match(code, close).end()
        if after >= len(code) or code[after] != "{":
            continue  # a call or a declaration
        params = split_top(code[m.end() : close - 1])
        if index >= len(params):
            continue
        named = re.search(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$", params[index].split("=")[0])
        end = bracket_end(code, after, "{", "}")
        if named and end:
            yield named[1], code[after:end]


def row_widths(body: str, param: str, code: str) -> set[int]:
    """Widths `param` is stepped by in `body`: `param + i * W`, `param[i * W + k]`, W a literal
    or a name given one literal value (in the body, else anywhere in `code`)."""
    stepped = rf"\b{re.escape(param)}\s*(?:\+|\[)\s*(\w+)\s*\*\s*(\w+)\b(?!\s*[*(])"
    widths = set()
    for m in re.finditer(stepped, body):
        values = [_literal(t, body, code) for t in (m[1], m[2])]
        known = [v for v in values if v is not None and v > 1]  # not an index starting at 0
        if len(known) == 1:
            widths.add(known[0])
    return widths


def _literal(token: str, body: str, code: str) -> int | None:
    if token.isdigit():
        return int(token)
    for text in (body, code):
        given = {
            int(m[1])
            for m in re.finditer(rf"\b{_TYPES}\s+{re.escape(token)}\s*=\s*(\d+)\s*;", text)
            if not re.search(r"\bfor\s*\(\s*$", text[max(0, m.start() - 20) : m.start()])
        } | {int(m[1]) for m in re.finditer(rf"#\s*define\s+{re.escape(token)}\s+(\d+)\b", text)}
        if given:
            return given.pop() if len(given) == 1 else None
    return None
