"""Evaluate `#if` conditions the way nvcc's host+device passes would, with a third value.

`UNKNOWN` stands for what differs between compiler passes (`__CUDA_ARCH__`): such branches are
kept and re-emitted under their original guard, so the unit behaves like the repository on
every architecture. Everything else follows C: an undefined name is 0.
"""

from __future__ import annotations

import re
from typing import Final


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = _Unknown()
Value = int | _Unknown

# Names whose value depends on the compiler pass or the target GPU.
PASS_DEPENDENT = re.compile(r"^__CUDA_ARCH\w*__$|^__CUDA_ARCH_FEAT_\w+$|^__NVCC_DIAG_PRAGMA\w*")

_TOKEN = re.compile(
    r"\s*(?:(?P<num>0[xX][0-9a-fA-F]+|\d+)[uUlL]*|(?P<id>[A-Za-z_]\w*)|"
    r"(?P<op>&&|\|\||==|!=|<=|>=|<<|>>|[-+*/%<>!~&|^?:(),]))"
)


class MacroEnv:
    """Macro values visible at a point of the simulated preprocessor run."""

    def __init__(self, defines: dict[str, tuple[list[str] | None, str]] | None = None):
        self.defs: dict[str, tuple[list[str] | None, str]] = dict(defines or {})

    def define(self, name: str, params: list[str] | None, body: str) -> None:
        self.defs[name] = (params, body)

    def undef(self, name: str) -> None:
        self.defs.pop(name, None)

    def is_defined(self, name: str) -> Value:
        if PASS_DEPENDENT.match(name):
            return UNKNOWN
        return int(name in self.defs)

    def copy(self) -> MacroEnv:
        return MacroEnv(self.defs)


def tokenize(text: str) -> list[str]:
    text = re.sub(r"/\*.*?\*/|//.*", " ", text.replace("\\\n", " "), flags=re.DOTALL)
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"cannot read #if condition near {text[pos : pos + 20]!r}")
        tokens.append(m.group("num") or m.group("id") or m.group("op"))
        pos = m.end()
    return tokens


def _expand(tokens: list[str], env: MacroEnv, depth: int = 0) -> list:
    """Replace defined() and object-like macros; unknown function-like calls become UNKNOWN."""
    out: list = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "defined":
            if i + 1 < len(tokens) and tokens[i + 1] == "(":
                name, i = tokens[i + 2], i + 4
            else:
                name, i = tokens[i + 1], i + 2
            out.append(env.is_defined(name))
            continue
        if isinstance(tok, str) and (tok[0].isalpha() or tok[0] == "_"):
            if PASS_DEPENDENT.match(tok):
                out.append(UNKNOWN)
                i += 1
                continue
            definition = env.defs.get(tok)
            if definition is not None and depth < 16:
                params, body = definition
                if params is None:
                    out.extend(_expand(tokenize(body), env, depth + 1) or [0])
                    i += 1
                    continue
                # function-like macro: skip its arguments, value unknown
                if i + 1 < len(tokens) and tokens[i + 1] == "(":
                    i = _skip_parens(tokens, i + 1)
                    out.append(UNKNOWN)
                    continue
            if i + 1 < len(tokens) and tokens[i + 1] == "(":  # undefined function-like
                i = _skip_parens(tokens, i + 1)
                out.append(UNKNOWN)
                continue
            out.append(0 if tok not in ("true",) else 1)
            i += 1
            continue
        out.append(tok)
        i += 1
    return out


def _skip_parens(tokens: list, i: int) -> int:
    depth = 0
    while i < len(tokens):
        if tokens[i] == "(":
            depth += 1
        elif tokens[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


_BINARY = [
    ("||",),
    ("&&",),
    ("|",),
    ("^",),
    ("&",),
    ("==", "!="),
    ("<", ">", "<=", ">="),
    ("<<", ">>"),
    ("+", "-"),
    ("*", "/", "%"),
]


class _Parser:
    def __init__(self, tokens: list) -> None:
        self.t = tokens
        self.i = 0

    def peek(self):
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self):
        tok = self.peek()
        self.i += 1
        return tok

    def parse(self) -> Value:
        value = self.ternary()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()!r} in #if condition")
        return value

    def ternary(self) -> Value:
        cond = self.binary(0)
        if self.peek() == "?":
            self.take()
            a = self.ternary()
            if self.take() != ":":
                raise ValueError("expected ':' in #if condition")
            b = self.ternary()
            if cond is UNKNOWN:
                return a if a == b and a is not UNKNOWN else UNKNOWN
            return a if cond else b
        return cond

    def binary(self, level: int) -> Value:
        if level == len(_BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek() in _BINARY[level]:
            op = self.take()
            right = self.binary(level + 1)
            left = _apply(op, left, right)
        return left

    def unary(self) -> Value:
        tok = self.take()
        if tok == "(":
            value = self.ternary()
            if self.take() != ")":
                raise ValueError("missing ')' in #if condition")
            return value
        if tok in ("!", "~", "-", "+"):
            v = self.unary()
            if v is UNKNOWN:
                return UNKNOWN
            return {"!": int(not v), "~": ~v, "-": -v, "+": v}[tok]
        if tok is UNKNOWN:
            return UNKNOWN
        if isinstance(tok, int):
            return tok
        if isinstance(tok, str) and tok[:1].isdigit():
            return (
                int(tok, 16)
                if tok.lower().startswith("0x")
                else int(tok, 8 if tok.startswith("0") and len(tok) > 1 else 10)
            )
        raise ValueError(f"unexpected {tok!r} in #if condition")


def _apply(op: str, a: Value, b: Value) -> Value:
    if op == "&&":
        if a == 0 or b == 0:
            return 0
        return UNKNOWN if UNKNOWN in (a, b) else 1
    if op == "||":
        if (a is not UNKNOWN and a) or (b is not UNKNOWN and b):
            return 1
        return UNKNOWN if UNKNOWN in (a, b) else 0
    if a is UNKNOWN or b is UNKNOWN:
        return UNKNOWN
    if op in ("/", "%") and b == 0:
        return 0
    return int(
        {
            "|": lambda: a | b,
            "^": lambda: a ^ b,
            "&": lambda: a & b,
            "==": lambda: a == b,
            "!=": lambda: a != b,
            "<": lambda: a < b,
            ">": lambda: a > b,
            "<=": lambda: a <= b,
            ">=": lambda: a >= b,
            "<<": lambda: a << b,
            ">>": lambda: a >> b,
            "+": lambda: a + b,
            "-": lambda: a - b,
            "*": lambda: a * b,
            "/": lambda: int(a / b),
            "%": lambda: a % b,
        }[op]()
    )


def evaluate(condition: str, env: MacroEnv) -> Value:
    """Value of an `#if` condition: 0, non-zero, or UNKNOWN (also when it cannot be read)."""
    try:
        return _Parser(_expand(tokenize(condition), env)).parse()
    except (ValueError, IndexError, TypeError):
        return UNKNOWN


def cuda_env() -> MacroEnv:
    """What nvcc -std=c++17 predefines on Linux; `__CUDA_ARCH__` stays UNKNOWN."""
    env = MacroEnv()
    for name, value in {
        "__CUDACC__": "1",
        "__NVCC__": "1",
        "__cplusplus": "201703L",
        "__CUDACC_VER_MAJOR__": "13",
        "__CUDACC_VER_MINOR__": "0",
        "CUDA_VERSION": "13000",
        "CUDART_VERSION": "13000",
        "__CUDA_API_VERSION": "13000",
        "__linux__": "1",
        "__GNUC__": "12",
        "__x86_64__": "1",
        "__CUDACC_RELAXED_CONSTEXPR__": "1",
        "__STDC__": "1",
    }.items():
        env.define(name, None, value)
    return env
