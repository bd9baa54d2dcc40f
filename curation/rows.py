"""One dataset row per accepted candidate, under a schema written out in full.

The schema is explicit so a row's types never depend on which values a batch happens to hold
(an all-null `kernel_time_us` column would otherwise load as `null`), and so the card can print
it. Every row can be rebuilt from (repo, commit, path, toolchain): the text fields are the files
kminer wrote for the candidate, read back as they are, except that a repository mined from a
local path is named in their comments by its public URL (a row names no path of this machine).
"""

from __future__ import annotations

from pathlib import Path

from datasets import Features, Sequence, Value

from curation.instructions import Instructions
from miner import __version__
from miner.candidate import Candidate, StageName

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
    "kernel_name": "the __global__ function's name",
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
    "kill_rate": "share of deliberately wrong kernels (no write, off by one, swapped op) the "
    "test fails",
    "kernel_time_us": "median kernel time of the typical case on `gpu` (CUDA events)",
    "gpu": "the GPU the label was verified on",
    "toolchain": "nvcc, torch and CUDA versions of the verification",
    "strategy": "how the host function was made: mined (the repository's launcher), rule, llm",
    "cases_source": "who made the inputs: mined (the repository's tests), rule, llm",
    "description_source": "where the description in instruction_complete comes from: llm, "
    "comment, docstring, or empty",
    "instruction_edited": "a curator edited the instructions",
    "curator": "who accepted the row",
    "reviewed_at": "when it was accepted (ISO 8601, UTC)",
    "kminer_version": "the kminer version that exported it",
}


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
) -> dict:
    verify = cand.stage(StageName.VERIFY)
    metrics = verify.metrics if verify else {}
    k = cand.kernel
    mined_from = cand.provenance.repo_url

    def public(text: str) -> str:  # the files' headers name the repository as it was mined
        return text.replace(mined_from, repo_url) if mined_from != repo_url else text

    return {
        "id": cand.id,
        "instruction": inst.instruction,
        "instruction_complete": inst.instruction_complete,
        "label": public(label_text),
        "test_code": public(_text(workdir, cand.tests.path)),
        "reference_code": public(_text(workdir, cand.reference.path)),
        "reference_kind": cand.reference.kind,
        "kernel_name": k.name,
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
