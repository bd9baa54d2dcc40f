"""`kminer mine`: clone → discover → closure → compile → wrap → build → testgen, resumable.

Discovery and closure are cheap (seconds for mmcv) and deterministic, so a rerun on the same
commit with the same extractor skips them and only looks for compile work left undone.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from miner.candidate import Candidate, Stage, Status
from miner.clone import RepoSource, fetch_repo

log = logging.getLogger(__name__)

MINE_STAGES = ("discover", "closure", "compile", "wrap", "build", "testgen")
_EXTRACTOR_MODULES = (
    "aliases",
    "closure",
    "cpp_expr",
    "discover",
    "extract",
    "filemodel",
    "treewalk",
    "includes",
    "launches",
    "linearize",
    "macro_kernels",
    "sources",
    "textprep",
    "unit",
    "stages",
)


def files_hash(paths, extra: str = "") -> str:
    """Hash of some source files: the version of the code that produced a stage's results."""
    h = hashlib.sha256(extra.encode())
    for path in paths:
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


def extractor_version() -> str:
    """A new kminer re-extracts, an unchanged one does not."""
    here = Path(__file__).parent
    return files_hash(here / f"{name}.py" for name in _EXTRACTOR_MODULES)


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


@dataclass
class MineConfig:
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


@dataclass
class RunContext:
    cfg: MineConfig
    store: object
    workdir: Path
    progress: Progress
    src: RepoSource | None = None
    repo_id: int = 0
    discovery: object = None
    discovery_info: dict = field(default_factory=dict)
    found: dict = field(default_factory=dict)
    llm: object = None  # wrappers.llm.client.LLMClient when an endpoint is configured
    timings: dict[str, float] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    def ensure_discovery(self) -> None:
        """Later stages need the parsed repository; a rerun that skipped discovery parses now."""
        if self.discovery is not None:
            return
        from miner.candidate import Provenance
        from miner.discover import discover
        from miner.stages import to_candidate

        disc = discover(self.src.root, max_bytes=self.cfg.max_file_bytes)
        prov = Provenance(repo_url=self.src.url, commit=self.src.commit, license=self.src.license)
        self.discovery = disc
        self.found = {to_candidate(fk, disc, prov).id: fk for fk in disc.kernels}

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[stage] = round(time.perf_counter() - start, 3)


def _up_to_date(ctx: RunContext, cands: list[Candidate], version: str) -> bool:
    repo = ctx.store.repo(ctx.repo_id)
    if ctx.cfg.redo or not cands or (repo.discovery or {}).get("extractor") != version:
        return False
    for c in cands:
        closure = c.stage(Stage.CLOSURE)
        if (
            closure is None
            or closure.status != Status.OK
            or not (ctx.workdir / c.unit.path).exists()
        ):
            return False
    return True


def run_mine(cfg: MineConfig, progress: Progress | None = None, store=None) -> RunContext:
    from curation.store import Store
    from miner.stages import run_closure, run_compile, run_discover

    workdir = cfg.workdir.resolve()
    store = store or Store.open(workdir, cfg.db_url)
    ctx = RunContext(cfg, store, workdir, progress or NullProgress())
    run_id = store.start_run(f"mine {cfg.repo}")
    status = "failed"
    try:
        with ctx.timed("clone"):
            ctx.src = fetch_repo(cfg.repo, workdir, ref=cfg.ref, submodules=cfg.submodules)
        src = ctx.src
        ctx.repo_id = store.upsert_repo(
            src.url,
            src.commit,
            ref=src.ref,
            kind=src.kind,
            license=src.license,
            license_file=src.license_file,
            root=str(src.root),
        )
        version = extractor_version()
        cands = store.candidates(ctx.repo_id)
        if _up_to_date(ctx, cands, version) and "discover" in cfg.stages:
            log.info("discovery and closure are up to date for %s@%s", src.url, src.commit)
            ctx.discovery_info = store.repo(ctx.repo_id).discovery.get("info", {})
            ctx.counters["reused_discovery"] = 1
        elif "discover" in cfg.stages:
            with ctx.timed("discover"):
                cands = run_discover(ctx)
            if "closure" in cfg.stages:
                with ctx.timed("closure"):
                    run_closure(ctx, cands)
            info = {
                "extractor": version if "closure" in cfg.stages else "",
                "info": ctx.discovery_info,
            }
            store.set_discovery(ctx.repo_id, info)
            cands = store.candidates(ctx.repo_id)
        if "compile" in cfg.stages:
            with ctx.timed("compile"):
                run_compile(ctx, cands)
        run_wrap_and_build(ctx)
        run_testgen_stage(ctx)
        status = "ok"
        return ctx
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        if ctx.llm is not None:
            ctx.counters.update({f"llm_{k}": v for k, v in ctx.llm.usage().items()})
        store.finish_run(run_id, status, ctx.repo_id or None, ctx.timings, ctx.counters)


def run_wrap_and_build(ctx: RunContext) -> None:
    """The wrap and build stages over the store's candidates (also `kminer wrap/build`)."""
    cfg = ctx.cfg
    if "wrap" not in cfg.stages and "build" not in cfg.stages:
        return
    from wrappers.stage import run_build, run_wrap

    if "wrap" in cfg.stages:
        ctx.llm = make_llm_client(cfg, ctx.store)
        with ctx.timed("wrap"):
            run_wrap(ctx, ctx.store.candidates(ctx.repo_id))
    if "build" in cfg.stages:
        with ctx.timed("build"):
            run_build(ctx, ctx.store.candidates(ctx.repo_id))


def run_testgen_stage(ctx: RunContext) -> None:
    """References, cases, wrong variants and test code for the built labels (`kminer testgen`)."""
    if "testgen" not in ctx.cfg.stages:
        return
    from testgen.stage import run_testgen

    with ctx.timed("testgen"):
        run_testgen(ctx, ctx.store.candidates(ctx.repo_id))


def make_llm_client(cfg: MineConfig, store):
    if cfg.llm == "none":
        return None
    from miner.errors import SetupError
    from wrappers.llm.client import client_from_env

    client = client_from_env(store, base_url=cfg.llm_base_url, model=cfg.model)
    if client is None:
        raise SetupError("--llm openai needs an endpoint: set OPENAI_BASE_URL or --llm-base-url")
    return client


def open_workdir(cfg: MineConfig, progress: Progress | None = None, store=None) -> RunContext:
    """A context over an already mined workdir, for the stage commands (`kminer wrap`, ...)."""
    from curation.store import Store
    from miner.errors import BadInput

    workdir = cfg.workdir.resolve()
    store = store or Store.open(workdir, cfg.db_url)
    repo = store.repo()
    if repo is None:
        raise BadInput(f"no mined repository in {workdir}: run `kminer mine` first")
    ctx = RunContext(cfg, store, workdir, progress or NullProgress())
    ctx.repo_id = repo.id
    ctx.src = RepoSource(
        url=repo.url,
        kind=repo.kind,
        commit=repo.commit,
        ref=repo.ref,
        root=Path(repo.root),
        license=repo.license,
        license_file=repo.license_file,
    )
    if not ctx.src.root.exists():
        raise BadInput(f"the sources of {repo.url} are gone from {repo.root}: rerun `kminer mine`")
    return ctx


def run_stages(cfg: MineConfig, progress: Progress | None = None) -> RunContext:
    ctx = open_workdir(cfg, progress)
    run_id = ctx.store.start_run(" ".join(cfg.stages))
    status = "failed"
    try:
        run_wrap_and_build(ctx)
        run_testgen_stage(ctx)
        status = "ok"
        return ctx
    finally:
        if ctx.llm is not None:
            ctx.counters.update({f"llm_{k}": v for k, v in ctx.llm.usage().items()})
        ctx.store.finish_run(run_id, status, ctx.repo_id, ctx.timings, ctx.counters)
