"""The one record that flows through every stage: a `Candidate` per discovered kernel.

Stages read a candidate, do their job, and write back their own `StageResult`; nothing else
passes between them, so any stage can be rerun or resumed from the store alone. Every stop or
failure names a `Reason` from a closed set, so the funnel and the review UI can count them.
"""

from __future__ import annotations

import fnmatch
import hashlib
from enum import StrEnum

from pydantic import BaseModel, Field


class StageName(StrEnum):
    DISCOVER = "discover"
    CLOSURE = "closure"
    COMPILE = "compile"
    WRAP = "wrap"
    BUILD = "build"
    TESTGEN = "testgen"
    VERIFY = "verify"


class Status(StrEnum):
    OK = "ok"
    ERROR = "error"
    SKIPPED = "skipped"


class Reason(StrEnum):
    """Why a stage did not end in plain `ok` (closed set: stats and UI group by it)."""

    # discover (flags, the kernel is kept)
    PARSE_FALLBACK = "parse_fallback"  # tree-sitter could not read it; a token scan did
    NOT_LAUNCHED = "not_launched"  # defined but never launched or referenced in the repo
    # closure
    EXTRACT_FAILED = "extract_failed"  # (stores before internal_error: a bug of the extractor)
    INCLUDE_OUTSIDE = "include_outside"  # an #include of an absolute path or out of the checkout
    INCLUDE_TOO_DEEP = "include_too_deep"  # an #include chain deeper than the compiler would go
    # compile
    COMPILE_ERROR = "compile_error"
    MISSING_HEADER = "missing_header"  # a header that is not in the repo nor on this machine
    COMPILE_TIMEOUT = "compile_timeout"
    PARTIAL_INSTANTIATION = "partial_instantiation"  # some requested dtypes did not compile
    UPSTREAM_FAILED = "upstream_failed"  # an earlier stage did not produce what this one needs
    NO_COMPILER = "no_compiler"
    # wrap
    NEEDS_LLM = "needs_llm"  # no launcher to mine and no rule fits; waits for an LLM endpoint
    LLM_FAILED = "llm_failed"  # the model's answers could not be used (parse, endpoint)
    # build
    BUILD_ERROR = "build_error"
    BUILD_TIMEOUT = "build_timeout"
    # testgen
    NO_REFERENCE = "no_reference"  # neither the repository nor an LLM gave a CPU reference
    NO_CASES = "no_cases"  # no inputs could be mined or generated for the signature
    REFERENCE_BUILD_ERROR = "reference_build_error"  # the mined CPU reference does not compile
    # verify (the outcome of the GPU run; `pass` is status ok)
    MISMATCH = "mismatch"
    IMPORT_ERROR = "import_error"
    CRASH = "crash"
    TIMEOUT = "timeout"
    WEAK_TEST = "weak_test"  # the test passed a deliberately wrong kernel
    # every differing case gave another result when the label or the reference ran again on
    # the same input: no case can judge the kernel (never called a mismatch)
    NONDETERMINISTIC = "nondeterministic"
    # the repository's kernel and its own reference disagree on most inputs kminer made and too
    # few cases are left to judge it: the reference computes something else (a sign, a layout),
    # or the made inputs break a contract neither side checks
    REFERENCE_DISAGREES = "reference_disagrees"
    NO_GPU = "no_gpu"
    # any stage: a bug of kminer's on this candidate (the traceback is in the run's log); the
    # result is not keyed, so the next run tries again
    INTERNAL_ERROR = "internal_error"


class FileSkip(StrEnum):
    """Why a file of the repository was not mined (counted in the funnel)."""

    NON_CUDA_BACKEND = "non_cuda_backend"  # .mu/.muh (MUSA), .mlu (Cambricon), .hip, ...
    BACKEND_DIR = "backend_dir"  # a folder of another backend (musa/, mlu/, npu/, hip/, ...)
    HIP_COPY = "hip_copy"  # a hipified twin such as foo_hip.cu
    BINARY = "binary"
    TOO_LARGE = "too_large"
    SYMLINK_OUTSIDE = "symlink_outside"
    UNREADABLE = "unreadable"
    VCS_DIR = "vcs_dir"


class StageResult(BaseModel):
    status: Status
    reason: Reason | None = None
    detail: str = ""  # first error line, counts, etc.: one short line for humans
    key: str = ""  # hash of the inputs that produced this result (resume / cache)
    seconds: float = 0.0
    # stage figures shown by `candidates --json`: testgen {num_cases, num_shapes,
    # reference_kind}, verify {kill_rate, kernel_time_us, gpu, torch, cuda, cases}
    metrics: dict = Field(default_factory=dict)


class Param(BaseModel):
    type: str
    name: str
    text: str  # as written, e.g. "const T* __restrict__ input"


class TemplateParam(BaseModel):
    kind: str  # "type" | "value" | "template" | "pack"
    name: str
    type: str = ""  # for value parameters: int, bool, ReductionType, ...
    default: str = ""
    text: str = ""


class LaunchSite(BaseModel):
    file: str
    line: int
    kind: str  # "chevron" | "launch_api" | "address" | "macro" | "reference"
    caller: str = ""  # enclosing function, when known
    template_args: str = ""  # as written at the site, e.g. "scalar_t, 256"
    config: str = ""  # the <<<...>>> arguments


class Kernel(BaseModel):
    name: str
    namespace: str = ""  # "a::b" or ""
    file: str  # relative to the repository root, posix
    line: int  # line of the __global__ token (1-based)
    start_line: int  # first line of the definition (template <...> included)
    end_line: int
    params: list[Param] = Field(default_factory=list)
    template_params: list[TemplateParam] = Field(default_factory=list)
    specialization: str = ""  # template arguments of an explicit specialization
    qualifiers: list[str] = Field(default_factory=list)  # static, inline, __launch_bounds__(..)
    source: str
    from_macro: str = ""  # the macro whose expansion defines this kernel
    parse_fallback: bool = False

    @property
    def templated(self) -> bool:
        return bool(self.template_params) or bool(self.specialization)


class Dep(BaseModel):
    kind: str  # function | template | type | macro | variable | using | namespace_alias
    name: str
    file: str
    line: int


class Unit(BaseModel):
    path: str = ""  # relative to the workdir
    hash: str = ""
    needs_torch: bool = False
    instantiations: list[str] = Field(default_factory=list)  # dtypes the launch stub asks for
    compiled_types: list[str] = Field(default_factory=list)
    unresolved: list[str] = Field(default_factory=list)
    # headers the closure includes that neither the repository nor this machine has (a git
    # submodule the checkout lacks, a library not installed): left out of the unit
    missing_headers: list[str] = Field(default_factory=list)


class Wrapper(BaseModel):
    """How the kernel got its tensor-level wrapper, and where the label is."""

    strategy: str = ""  # mined | rule | llm
    launcher: str = ""  # the repository function that launches the kernel
    chain: list[str] = Field(default_factory=list)  # launcher → callers → exposed function
    functions: list[str] = Field(default_factory=list)  # names the binding exposes
    label_path: str = ""  # relative to the workdir
    label_hash: str = ""
    template_id: str = ""  # llm: prompt template and its hash
    template_hash: str = ""
    attempts: int = 0
    op_map: dict = Field(default_factory=dict)  # the repository's op chain, for the tests


class Reference(BaseModel):
    """The CPU implementation the tests compare the kernel with (never the kernel itself)."""

    kind: str = ""  # cpp (the repository's CPU twin) | python (its PyTorch ref) | llm | ""
    function: str = ""  # the repository function that is the reference, e.g. roi_align_forward_cpu
    file: str = ""  # where it is defined, relative to the repository root
    path: str = ""  # the extracted reference source, relative to the workdir
    hash: str = ""
    exposed: str = ""  # the name the reference module exposes it under
    signature: list[str] = Field(default_factory=list)  # its parameter types, in order


class Tests(BaseModel):
    """The generated `test_code` and what it checks."""

    path: str = ""  # the standalone pytest file, relative to the workdir
    hash: str = ""
    cases_source: str = ""  # mined | forward | cpu_branch | sibling | rule | probe | llm
    num_cases: int = 0
    num_shapes: int = 0
    dtypes: list[str] = Field(default_factory=list)
    variants: list[str] = Field(default_factory=list)  # wrong-variant label paths (workdir)
    variant_kinds: list[str] = Field(default_factory=list)  # no_write | off_by_one | op_swap


class Provenance(BaseModel):
    repo_url: str
    commit: str
    license: str = "unknown"


class Candidate(BaseModel):
    id: str
    provenance: Provenance
    kernel: Kernel
    launches: list[LaunchSite] = Field(default_factory=list)
    closure: list[Dep] = Field(default_factory=list)
    unit: Unit = Field(default_factory=Unit)
    wrapper: Wrapper = Field(default_factory=Wrapper)
    reference: Reference = Field(default_factory=Reference)
    tests: Tests = Field(default_factory=Tests)
    stages: dict[str, StageResult] = Field(default_factory=dict)

    @property
    def launched(self) -> bool:
        return bool(self.launches)

    def matches(self, pattern: str | None) -> bool:
        """Whether `--filter` selects this candidate: a glob on its file, its kernel's name or
        `file::kernel` (no pattern: every candidate)."""
        if not pattern:
            return True
        k = self.kernel
        return any(fnmatch.fnmatch(s, pattern) for s in (k.file, k.name, f"{k.file}::{k.name}"))

    def set_stage(self, stage: StageName, result: StageResult) -> None:
        self.stages[stage.value] = result

    def stage(self, stage: StageName) -> StageResult | None:
        return self.stages.get(stage.value)

    def clear_stage(self, stage: StageName) -> None:
        """Forget a stage's result: what it was about has changed (a new test is unverified)."""
        self.stages.pop(stage.value, None)

    def summary(self) -> dict:
        """The stable JSON face of a candidate (`kminer candidates --json`)."""
        return {
            "id": self.id,
            "file": self.kernel.file,
            "line": self.kernel.line,
            "kernel": self.kernel.name,
            "namespace": self.kernel.namespace,
            "specialization": self.kernel.specialization,
            "templated": self.kernel.templated,
            "launched": self.launched,
            "from_macro": self.kernel.from_macro,
            "needs_torch": self.unit.needs_torch,
            "unit": self.unit.path,
            "label": self.wrapper.label_path,
            "strategy": self.wrapper.strategy,
            "stages": {name: self._stage_summary(name, r) for name, r in self.stages.items()},
        }

    def _stage_summary(self, name: str, r: StageResult) -> dict:
        """status (verify: its outcome), reason, detail, the metrics; testgen and verify always
        show their figures, None or the record's values where the stage did not set them."""
        out = {"status": r.status.value, "reason": r.reason.value if r.reason else None}
        out["detail"] = r.detail
        if name == StageName.TESTGEN:
            out["num_cases"] = self.tests.num_cases if self.tests.path else 0
            out["num_shapes"] = self.tests.num_shapes if self.tests.path else 0
            out["reference_kind"] = self.reference.kind
        elif name == StageName.VERIFY:
            out.update(kill_rate=None, kernel_time_us=None)
        out.update(r.metrics)
        out["status"] = r.metrics.get("outcome") or r.status.value
        return out


def candidate_id(repo_url: str, commit: str, kernel: Kernel) -> str:
    """Stable over reruns: the same kernel at the same commit always gets the same id."""
    signature = ",".join(p.type for p in kernel.params)
    key = "|".join(
        [
            repo_url,
            commit,
            kernel.file,
            kernel.namespace,
            kernel.name,
            kernel.specialization,
            signature,
            kernel.from_macro,
        ]
    )
    return hashlib.sha256(key.encode()).hexdigest()[:16]
