"""One dataset row per accepted candidate, under a schema written out in full.

The schema is explicit so a row's types never depend on which values a batch happens to hold
(an all-null `kernel_time_us` column would otherwise load as `null`), and so the card can print
it. Every row can be rebuilt from (repo, commit, path, toolchain): the text fields are the files
kminer wrote for the candidate, read back as they are, except that a repository mined from a
local path is named in their comments by its public URL (a row names no path of this machine).

A row claims only what was measured: `verification` says whether the label passed its test on a
GPU (`gpu_pass`) or a curator accepted it without that pass (`override`), and the figures
(kill rate, GPU, toolchain) are the verification's own, null or empty where none was recorded.
A row whose text holds something that looks like a credential is never written (`secret_in`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from datasets import Features, Sequence, Value

from curation.instructions import Instructions
from miner import __version__
from miner.candidate import Candidate, StageName
from testgen.standalone.runner import judged_cases, outside_cases

FEATURES = Features(
    {
        "id": Value("string"),
        "instruction": Value("string"),
        "instruction_complete": Value("string"),
        "label": Value("string"),
        "test_code": Value("string"),
        "reference_code": Value("string"),
        "reference_kind": Value("string"),
        "kernel_name": Value("string"),
        "level": Value("string"),
        "kernels": Sequence(Value("string")),
        "op": Value("string"),
        "filename": Value("string"),
        "repo": Value("string"),
        "commit": Value("string"),
        "path": Value("string"),
        "line_start": Value("int32"),
        "line_end": Value("int32"),
        "license": Value("string"),
        "dtypes": Sequence(Value("string")),
        "num_cases": Value("int32"),
        "num_shapes": Value("int32"),
        "verification": Value("string"),
        "kill_rate": Value("float64"),
        "kernel_time_us": Value("float64"),
        "gpu": Value("string"),
        "toolchain": {"nvcc": Value("string"), "torch": Value("string"), "cuda": Value("string")},
        "strategy": Value("string"),
        "cases_source": Value("string"),
        "description_source": Value("string"),
        "instruction_edited": Value("bool"),
        "curator": Value("string"),
        "reviewed_at": Value("string"),
        "kminer_version": Value("string"),
    }
)

DESCRIPTIONS = {  # the card's schema table
    "id": "stable id of the kernel: hash of (repo, commit, file, kernel name, parameter types)",
    "instruction": "short natural-language task, derived by rule from instruction_complete",
    "instruction_complete": "the full task: kernel and host signatures, parameter roles, "
    "template parameters and dtypes, launch configuration, shapes, tolerances, description",
    "label": "the reference solution: one .cu file (kernel, device code it needs, host "
    "function, PYBIND11_MODULE)",
    "test_code": "standalone pytest file that builds a .cu (KMINER_IMPL) and compares it with "
    "the CPU reference on fixed cases",
    "reference_code": "the CPU implementation the test compares with (also embedded in test_code)",
    "reference_kind": "cpp: the repository's CPU twin; python: its PyTorch ref; llm: written by "
    "a model and checked",
    "kernel_name": "the __global__ function's name (an op row: the kernel it was cut with)",
    "level": "kernel: the task is one kernel (when its host function launches others, the "
    "rest of the file is given in the instruction); op: the host function and every kernel it "
    "launches, judged by what the op returns (its kill rate is the lowest of its kernels')",
    "kernels": "the kernels the row asks for",
    "op": "the operator the kernel belongs to (the repository's binding name)",
    "filename": "the name of the file the kernel is defined in",
    "repo": "the repository's URL",
    "commit": "the commit the kernel was cut from",
    "path": "the kernel's file, relative to the repository root",
    "line_start": "first line of the kernel's definition (1-based)",
    "line_end": "last line of the kernel's definition",
    "license": "the repository's SPDX license id",
    "dtypes": "the dtypes the test runs",
    "num_cases": "cases in the test",
    "num_shapes": "distinct argument shapes among the cases",
    "verification": "gpu_pass: the label passed its test on `gpu`; override: a curator accepted "
    "the row without that pass (its other figures are only what was measured, if anything)",
    "kill_rate": "share of deliberately wrong kernels (no write, off by one, swapped op) the "
    "test fails; null when it was not measured",
    "kernel_time_us": "median kernel time of the typical case on `gpu` (CUDA events); null "
    "when not measured",
    "gpu": "the GPU the verification ran on; empty when none was recorded",
    "toolchain": "nvcc, torch and CUDA versions of the verification; empty when not recorded",
    "strategy": "how the host function was made: mined (the repository's launcher), rule, llm",
    "cases_source": "who made the inputs: mined (the repository's tests), forward (a "
    "backward's, from its forward's recorded calls), cpu_branch (the tests' calls of the CPU "
    "binding the repository's Python calls on CPU tensors instead), sibling (the recorded calls "
    "of an op of "
    "the same extension taking the same parameters), rule, probe (drafted, kept where the "
    "repository's CPU implementation built with AddressSanitizer ran them clean), llm",
    "description_source": "where the description in instruction_complete comes from: llm, "
    "comment, docstring, or empty",
    "instruction_edited": "a curator edited the instructions",
    "curator": "who accepted the row (an override is flagged in `verification`)",
    "reviewed_at": "when it was accepted (ISO 8601, UTC)",
    "kminer_version": "the kminer version that exported it",
}


GPU_PASS, OVERRIDE = "gpu_pass", "override"  # the values of `verification`

SECRET_PATTERNS = {  # kinds of credentials a row must never carry (values are never reported)
    "a Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}"),
    "an OpenAI key": re.compile(r"\bsk-(?:proj-|svcacct-)?[A-Za-z0-9_-]{20,}"),
    "a GitHub token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})"),
    "an AWS access key": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "a Slack token": re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    "a private key": re.compile(r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----"),
    "a password in a URL": re.compile(r"://[^/\s:@]{1,256}:[^/\s@]{1,256}@"),
}
_LITERALS = {  # a pattern runs only on a text holding one of its literals (`in` is fast)
    "a Hugging Face token": ("hf_",),
    "an OpenAI key": ("sk-",),
    "a GitHub token": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    "an AWS access key": ("AKIA", "ASIA"),
    "a Slack token": ("xox",),
    "a private key": ("PRIVATE KEY-----",),
    "a password in a URL": ("://",),
}
_SECRET_ENV = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY")


def verification(cand: Candidate, review: dict) -> tuple[str, str]:
    """(gpu_pass | override, why an override): a pass counts only when the verify stage recorded
    one and the curator did not have to override the checks to accept the row."""
    verify = cand.stage(StageName.VERIFY)
    metrics = verify.metrics if verify else {}
    outcome, kills = metrics.get("outcome") or "missing", metrics.get("kill_rate")
    measured = f"verify outcome {outcome}, kill rate {'none' if kills is None else kills}"
    if review.get("override"):
        return OVERRIDE, f"accepted by a curator's override ({measured})"
    if outcome != "pass":
        return OVERRIDE, f"accepted, but its {measured}: not a GPU pass"
    return GPU_PASS, ""


def environment_secrets() -> dict[str, str]:
    """Values of this process's credential-like environment variables (never to be exported)."""
    return {
        value: name
        for name, value in os.environ.items()
        if _SECRET_ENV.search(name.upper()) and len(value.strip()) >= 8
    }


def _strings(value, where: str):
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield from _strings(inner, f"{where}.{key}")
    elif isinstance(value, list):
        for inner in value:
            yield from _strings(inner, where)


def secret_in(row: dict, env: dict[str, str] | None = None) -> str:
    """'' when no text of the row looks like a credential, else what and where (never the
    value): a known token format, or the value of a credential variable of this process."""
    env = environment_secrets() if env is None else env
    for field, text in _strings(row, ""):
        field = field.lstrip(".")
        for kind, pattern in SECRET_PATTERNS.items():
            if any(lit in text for lit in _LITERALS[kind]) and pattern.search(text):
                return f"{field} holds what looks like {kind}"
        for value, name in env.items():
            if value in text:
                return f"{field} holds the value of ${name}"
    return ""


def redact(value, env: dict[str, str] | None = None):
    """`value` (a text, or dicts and lists of them: a report) with everything `secret_in`
    would find replaced by [redacted]."""
    env = environment_secrets() if env is None else env
    if isinstance(value, dict):
        return {k: redact(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, env) for v in value]
    if not isinstance(value, str):
        return value
    for kind, pattern in SECRET_PATTERNS.items():
        if any(lit in value for lit in _LITERALS[kind]):
            value = pattern.sub("[redacted]", value)
    for secret in env:
        value = value.replace(secret, "[redacted]")
    return value


def public_url(url: str, sources: dict[str, str]) -> str:
    """The URL a row names for its repository: a mapping given for a local path, else the
    path's `origin` remote when it is a git checkout, else the path as mined; never with the
    credentials a clone URL may carry."""
    for local, public in sources.items():
        same = url == local if _is_url(url) else Path(url).resolve() == Path(local).resolve()
        if same:
            return _without_credentials(public)
    if _is_url(url):
        return _without_credentials(url)
    try:
        from git import Repo

        repo = Repo(url)
        return _without_credentials(repo.remotes.origin.url) if "origin" in repo.remotes else url
    except Exception:  # not a git folder, or gone: the path is all there is
        return url


def _without_credentials(url: str) -> str:
    """https://user:token@host/x → https://host/x; ssh's `git@host` user is kept."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    user, _, host = parts.netloc.rpartition("@")
    keep = parts.scheme not in ("http", "https") and ":" not in user
    return urlunsplit(parts._replace(netloc=f"{user}@{host}" if keep else host))


def _is_url(text: str) -> bool:
    return "://" in text or text.startswith("git@")


def with_calibration(test_code: str, cases: list) -> str:
    """The test as published, with what its label's verification found embedded: the cases
    outside the op's contract, left out as the verified run left them out, and the cases the
    label passed, on which a prediction that gives another result when run again fails (the
    repository's kernel gave one result there) instead of being excused as nondeterministic."""
    outside, judged = outside_cases(cases), judged_cases(cases)
    if outside:
        test_code = test_code.replace("\nOUTSIDE = {}\n", f"\nOUTSIDE = {json.dumps(outside)}\n", 1)
    if judged:
        test_code = test_code.replace(
            "\nJUDGED = set()\n", f"\nJUDGED = set({json.dumps(judged)})\n", 1
        )
    return test_code


def _text(workdir: Path, rel: str) -> str:
    path = workdir / rel if rel else None
    return path.read_text(encoding="utf-8", errors="replace") if path and path.is_file() else ""


def _utc(stamp: str | None) -> str:
    """ISO 8601 with its zone: the store keeps naive UTC times."""
    if not stamp:
        return ""
    return stamp if stamp.endswith("Z") or "+" in stamp[10:] else stamp + "+00:00"


def build_row(
    cand: Candidate,
    review: dict,
    repo_url: str,
    workdir: Path,
    label_text: str,
    inst: Instructions,
    op_kernels: list[str] | None = None,
) -> dict:
    """A kernel-level row, or with `op_kernels` the op-level row of the op whose label this is
    (curation.ops: its id and kill rate are the caller's to set)."""
    verify = cand.stage(StageName.VERIFY)
    metrics = verify.metrics if verify else {}
    verified, _ = verification(cand, review)
    k = cand.kernel
    mined_from = cand.provenance.repo_url

    def public(text: str) -> str:  # the files' headers name the repository as it was mined
        return text.replace(mined_from, repo_url) if mined_from != repo_url else text

    return {
        "id": cand.id,
        "instruction": inst.instruction,
        "instruction_complete": inst.instruction_complete,
        "label": public(label_text),
        "test_code": public(
            with_calibration(_text(workdir, cand.tests.path), metrics.get("cases"))
        ),
        "reference_code": public(_text(workdir, cand.reference.path)),
        "reference_kind": cand.reference.kind,
        "kernel_name": k.name,
        "level": "op" if op_kernels else "kernel",
        "kernels": list(op_kernels or [k.name]),
        "op": cand.wrapper.op_map.get("python_name") or (cand.wrapper.functions or [""])[0],
        "filename": Path(k.file).name,
        "repo": repo_url,
        "commit": cand.provenance.commit,
        "path": k.file,
        "line_start": k.start_line,
        "line_end": k.end_line,
        "license": cand.provenance.license,
        "dtypes": list(cand.tests.dtypes),
        "num_cases": cand.tests.num_cases,
        "num_shapes": cand.tests.num_shapes,
        "verification": verified,
        "kill_rate": metrics.get("kill_rate"),
        "kernel_time_us": metrics.get("kernel_time_us"),
        "gpu": metrics.get("gpu", ""),
        "toolchain": {key: str(metrics.get(key) or "") for key in ("nvcc", "torch", "cuda")},
        "strategy": cand.wrapper.strategy,
        "cases_source": cand.tests.cases_source,
        "description_source": inst.description_source,
        "instruction_edited": inst.edited,
        "curator": review.get("curator", ""),
        "reviewed_at": _utc(review.get("reviewed_at")),
        "kminer_version": __version__,
    }
