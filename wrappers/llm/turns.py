"""Ask a model for code until an answer passes our checks: the loop both testgen LLM steps share.

A reference and a set of inputs are judged the same way: the answer must parse as the JSON object
asked for, keep a written contract and then run in the sandbox. Each answer is an attempt row;
a failed one goes back to the model as the next turn (the template's `fix` block), up to
`max_attempts` answers. The client caches answers, so a rerun asks nothing and, with the
attempts already logged, stores nothing new.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from wrappers.label import template_hash
from wrappers.llm.client import LLMClient, LLMUnavailable
from wrappers.llm.flow import log_attempt, render_messages
from wrappers.llm.parse import AnswerError, parse_object

PARAMS = {"temperature": 0.0, "max_tokens": 4096}
ALLOWED_IMPORTS = set(sys.stdlib_module_names) | {"torch"}


@dataclass
class Answer:
    code: str
    strategy: str


def contract_problem(code: str, function: str, params: list[str]) -> str:
    """The first rule the code breaks that running it would not show ('' when none): it parses,
    defines `function` with exactly `params`, imports only torch and the standard library and
    stays off CUDA (it runs on the CPU, in the sandbox)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return f"the code is not valid Python: {exc.msg} (line {exc.lineno})"
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    if not fns:
        return f"the code defines no top-level function `{function}`"
    got = [a.arg for a in fns[0].args.args]
    if len(got) != len(params) or fns[0].args.vararg:
        return f"`{function}` must take exactly ({', '.join(params)}), it takes ({', '.join(got)})"
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        bad = [n for n in names if n.split(".")[0] not in ALLOWED_IMPORTS]
        if bad:
            return f"the code imports {bad[0]}: only torch and the standard library are allowed"
    if re.search(r"\.cuda\(|['\"]cuda", code):
        return "the code uses CUDA: it runs on the CPU"
    return ""


def ask_checked(
    client: LLMClient,
    store,
    cand,
    *,
    step: str,
    template: str,
    context: dict,
    check: Callable[[str], str],
    max_attempts: int,
    field: str = "code",
) -> Answer | str:
    """The first answer whose `field` (its code, or a description) `check` passes (check
    returns '' or the problem), or the reason there is none (an `llm: ...` line)."""
    messages = render_messages(template, **context)
    logged = {(a["step"], a["prompt_hash"], a["passed"]) for a in store.attempts(cand.id)}
    problem = ""
    for attempt in range(1, max(1, max_attempts) + 1):
        try:
            reply = client.complete(
                messages, template_id=template, template_hash=template_hash(template), params=PARAMS
            )
        except LLMUnavailable as exc:
            return f"llm: {exc}"
        code, strategy, problem = _judge(reply.text, check, field)
        log_attempt(
            store,
            cand.id,
            logged,
            step,
            attempt,
            template,
            messages,
            reply,
            parsed={"strategy": strategy, field: code},
            strategy=strategy,
            build_log=problem,
            passed=not problem,
        )
        if not problem:
            return Answer(code, strategy)
        if attempt < max_attempts:
            fix = render_messages(
                template,
                "fix",
                kernel=cand.kernel,
                attempt=attempt + 1,
                max_attempts=max_attempts,
                problem=problem.splitlines()[0],
                log="\n".join(problem.splitlines()[1:]),
            )
            messages = [*messages, {"role": "assistant", "content": reply.text}, *fix]
    return f"llm: no usable {step} after {max_attempts} answers: {problem.splitlines()[0]}"


def _judge(text: str, check: Callable[[str], str], field: str) -> tuple[str, str, str]:
    """(the field's text, strategy, problem) of one answer."""
    try:
        obj = parse_object(text)
    except AnswerError as exc:
        return "", "", str(exc)
    code, strategy = obj.get(field), str(obj.get("strategy", ""))
    if not isinstance(code, str) or not code.strip():
        return "", strategy, f'the object needs a non-empty string "{field}"'
    return code, strategy, check(code)
