"""The one shape every stage has, and what a stage is given to work with.

A stage says which slot of the candidate it writes (`name`), which stages must have ended `ok`
before it (`needs`), the content key of its result for a candidate (None: not its business), and
how to run over a batch. Everything else — choosing the batch, keys and `--redo`, progress,
timing, saving, the run's row, and turning one candidate's bug into `internal_error` — is the
runner's (pipeline.py), so a stage holds only its own work. Stages live on the floor of the job
they do (wrappers/, testgen/); the CLI hands the runner the list, so this floor imports none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from miner.candidate import Candidate, Provenance, Reason, StageName
from miner.clone import RepoSource
from miner.discover import discover
from miner.repo_model import Discovery, FoundKernel, to_candidate
from miner.store import Store
from miner.versions import code_version

MINE_STAGES = ("discover", "closure", "compile", "wrap", "build", "testgen")


@dataclass
class RunConfig:
    """What a run was asked to do (the CLI's options, checked before any work starts)."""

    repo: str
    workdir: Path
    ref: str | None = None
    jobs: int = 2
    filter: str | None = None
    stages: tuple[str, ...] = MINE_STAGES
    redo: bool = False
    submodules: bool = False
    db_url: str | None = None
    max_file_bytes: int = 2 * 1024 * 1024
    compile_timeout: float = 600.0
    llm: str = "none"  # none | openai
    model: str | None = None
    llm_base_url: str | None = None
    max_attempts: int = 3
    batch_size: int = 16  # labels per build translation unit
    build_jobs: int = 2  # batches built at once (each nvcc takes ~3 GB with torch headers)
    build_timeout: float = 3600.0


class Progress(Protocol):
    def start(self, stage: str, total: int) -> None: ...
    def advance(self, stage: str, n: int = 1) -> None: ...
    def end(self, stage: str) -> None: ...


class NullProgress:
    def start(self, stage: str, total: int) -> None:
        pass

    def advance(self, stage: str, n: int = 1) -> None:
        pass

    def end(self, stage: str) -> None:
        pass


class ModelClient(Protocol):
    """The part of an LLM client (wrappers/llm/client.py) the runner itself uses."""

    model: str

    def usage(self) -> dict[str, int]: ...


@dataclass
class RunContext:
    """One run over one repository's candidates: its store, sources, parsed tree and counters."""

    cfg: RunConfig
    store: Store
    workdir: Path
    progress: Progress
    src: RepoSource | None = None
    repo_id: int = 0
    discovery: Discovery | None = None
    found: dict[str, FoundKernel] = field(default_factory=dict)  # candidate id → its kernel
    discovery_info: dict = field(default_factory=dict)
    llm: ModelClient | None = None
    timings: dict[str, float] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def provenance(self) -> Provenance:
        return Provenance(repo_url=self.src.url, commit=self.src.commit, license=self.src.license)

    def ensure_discovery(self, on_file: Callable[[int], None] | None = None) -> Discovery:
        """The parsed repository (parsed now when an earlier run did the discovering)."""
        if self.discovery is None:
            disc = discover(self.src.root, max_bytes=self.cfg.max_file_bytes, on_file=on_file)
            prov = self.provenance
            self.discovery = disc
            self.found = {to_candidate(fk, disc, prov).id: fk for fk in disc.kernels}
        return self.discovery

    @contextmanager
    def timed(self, what: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[what] = round(time.perf_counter() - start, 3)

    def count(self, what: str, n: int = 1) -> None:
        self.counters[what] = self.counters.get(what, 0) + n


@dataclass
class Failed:
    """A candidate the stage could not finish because of a bug (the runner records it)."""

    cand: Candidate
    error: BaseException


Done = Candidate | Failed


class Stage:
    """Base of every stage; subclasses set `name`, `needs` and implement `key` and `run`."""

    name: ClassVar[StageName]
    needs: ClassVar[tuple[StageName, ...]] = ()
    # recorded (skipped, with this reason) on a candidate whose needed stage failed; None: the
    # candidate is simply not this stage's business
    upstream_reason: ClassVar[Reason | None] = None
    scope: ClassVar[str] = "candidate"  # "repo": run once over every candidate (discovery)
    tools: ClassVar[tuple[str, ...]] = ()  # outside tools its results depend on (toolchain.py)
    uses_llm: ClassVar[bool] = False  # the runner's caller makes a client when one is set

    def version(self) -> str:
        """The stage's code (its module's import closure) and tools, hashed."""
        return code_version(type(self).__module__, self.tools)

    def key(self, cand: Candidate, ctx: RunContext) -> str | None:
        """Hash of everything this stage's result for `cand` depends on; None: not eligible."""
        raise NotImplementedError

    def fresh(self, cand: Candidate, ctx: RunContext) -> bool:
        """Whether a result stored under the same key still stands (its files are there, no
        new help such as a model has arrived since)."""
        return True

    def run(self, batch: list[Candidate], ctx: RunContext) -> Iterable[Done]:
        """Do the work; yield each candidate once its result is set (or a Failed)."""
        raise NotImplementedError

    @staticmethod
    def each(batch: list[Candidate], work: Callable[[Candidate], object]) -> Iterator[Done]:
        """`work` on each candidate alone: one candidate's bug never stops the others."""
        for cand in batch:
            try:
                work(cand)
            except Exception as exc:  # a bug: the runner records internal_error and its trace
                yield Failed(cand, exc)
            else:
                yield cand
