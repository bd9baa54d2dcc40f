"""The pipeline's database: repositories, candidates, file skips, caches, attempts and runs.

SQLite by default (one file beside the artifacts), any SQLAlchemy URL otherwise (Postgres for a
shared curation server). Each write commits at once, so a killed run loses at most the one
candidate it was working on, and rerunning the same command picks up from there. The curators'
state (reviews, audit, sessions) is not kept here: `curation/` creates its own tables in the same
database, on top of this one.

Beside each candidate's JSON document the store keeps a narrow, indexed summary row (`queue`: op,
strategy, reference kind, outcome, kill rate, kernel time) so that a review queue of 10,000
candidates filters and pages in SQL instead of parsing every document.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from sqlalchemy import (
    JSON,
    Float,
    Integer,
    MetaData,
    String,
    Text,
    create_engine,
    event,
    inspect,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from miner.candidate import Candidate, StageName

DB_NAME = "kminer.db"


def now() -> dt.datetime:
    """UTC now without a zone: what every timestamp column holds."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class RepoRow(Base):
    __tablename__ = "repos"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    url: Mapped[str] = mapped_column(String(2048))
    commit: Mapped[str] = mapped_column(String(80))
    ref: Mapped[str] = mapped_column(String(512), default="")
    kind: Mapped[str] = mapped_column(String(16), default="")
    license: Mapped[str] = mapped_column(String(64), default="unknown")
    license_file: Mapped[str] = mapped_column(String(512), default="")
    root: Mapped[str] = mapped_column(String(2048), default="")
    discovery: Mapped[dict] = mapped_column(JSON, default=dict)  # counts + extractor version
    updated_at: Mapped[dt.datetime] = mapped_column(default=now, onupdate=now)


class CandidateRow(Base):
    __tablename__ = "candidates"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    repo_id: Mapped[int] = mapped_column(Integer, index=True)
    file: Mapped[str] = mapped_column(String(1024))
    line: Mapped[int] = mapped_column(Integer)
    kernel: Mapped[str] = mapped_column(String(512), index=True)
    data: Mapped[dict] = mapped_column(JSON)
    updated_at: Mapped[dt.datetime] = mapped_column(default=now, onupdate=now)


class FileSkipRow(Base):
    __tablename__ = "file_skips"
    repo_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    reason: Mapped[str] = mapped_column(String(64))


class CompileCacheRow(Base):
    __tablename__ = "compile_cache"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    detail: Mapped[str] = mapped_column(Text, default="")
    compiled_types: Mapped[list] = mapped_column(JSON, default=list)
    text: Mapped[str] = mapped_column(Text, default="")
    log: Mapped[str] = mapped_column(Text, default="")
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[dt.datetime] = mapped_column(default=now)


class LLMCacheRow(Base):
    """One model answer per canonical request hash: a rerun makes no call."""

    __tablename__ = "llm_cache"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(256), default="")
    request: Mapped[dict] = mapped_column(JSON, default=dict)  # no secrets: messages + params
    response: Mapped[dict] = mapped_column(JSON, default=dict)  # text, usage
    created_at: Mapped[dt.datetime] = mapped_column(default=now)


class AttemptRow(Base):
    """Every LLM wrapper attempt of a candidate: the curator's work log."""

    __tablename__ = "wrap_attempts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cand_id: Mapped[str] = mapped_column(String(32), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    step: Mapped[str] = mapped_column(String(32))  # analysis | code
    template_id: Mapped[str] = mapped_column(String(128), default="")
    template_hash: Mapped[str] = mapped_column(String(64), default="")
    prompt_hash: Mapped[str] = mapped_column(String(64), default="")
    answer: Mapped[str] = mapped_column(Text, default="")
    parsed: Mapped[dict] = mapped_column(JSON, default=dict)
    strategy: Mapped[str] = mapped_column(Text, default="")  # what the model says it did
    label: Mapped[str] = mapped_column(Text, default="")
    build_log: Mapped[str] = mapped_column(Text, default="")
    prompt: Mapped[str | None] = mapped_column(Text, nullable=True)  # the turn's last message
    passed: Mapped[bool] = mapped_column(default=False)
    tokens_in: Mapped[int] = mapped_column(Integer, default=0)
    tokens_out: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(default=now)


class RunRow(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    command: Mapped[str] = mapped_column(Text, default="")
    repo_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    started_at: Mapped[dt.datetime] = mapped_column(default=now)
    finished_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="running")
    timings: Mapped[dict] = mapped_column(JSON, default=dict)
    counts: Mapped[dict] = mapped_column(JSON, default=dict)


class QueueRow(Base):
    """A candidate's summary for the review queue, kept in step by `Store.save`."""

    __tablename__ = "queue"
    cand_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    repo_id: Mapped[int] = mapped_column(Integer, index=True)
    kernel: Mapped[str] = mapped_column(String(512), index=True)
    file: Mapped[str] = mapped_column(String(1024), default="")
    line: Mapped[int] = mapped_column(Integer, default=0)
    op: Mapped[str] = mapped_column(String(256), default="", index=True)
    strategy: Mapped[str] = mapped_column(String(16), default="", index=True)
    reference_kind: Mapped[str] = mapped_column(String(16), default="", index=True)
    outcome: Mapped[str] = mapped_column(String(32), default="", index=True)
    kill_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    kernel_time_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[dt.datetime] = mapped_column(default=now, onupdate=now)


def queue_summary(cand: Candidate, repo_id: int) -> dict:
    """The queue's columns for one candidate. `outcome` is the verify outcome, else why the
    candidate stopped (the last stage's reason), else ''."""
    verify = cand.stage(StageName.VERIFY)
    outcome = verify.metrics.get("outcome", "") if verify else ""
    if not outcome:
        stopped = [r for r in cand.stages.values() if r.reason is not None]
        outcome = stopped[-1].reason.value if stopped else ""
    return dict(
        cand_id=cand.id,
        repo_id=repo_id,
        kernel=cand.kernel.name,
        file=cand.kernel.file,
        line=cand.kernel.line,
        op=cand.wrapper.op_map.get("python_name") or "",
        strategy=cand.wrapper.strategy,
        reference_kind=cand.reference.kind,
        outcome=outcome,
        kill_rate=verify.metrics.get("kill_rate") if verify else None,
        kernel_time_us=verify.metrics.get("kernel_time_us") if verify else None,
    )


def _upsert_summary(session: Session, cand: Candidate, repo_id: int) -> None:
    values = queue_summary(cand, repo_id)
    row = session.get(QueueRow, cand.id)
    if row is None:
        session.add(QueueRow(**values))
    else:
        for key, value in values.items():
            setattr(row, key, value)


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()


def create_tables(engine: Engine, metadata: MetaData) -> None:
    """Make the tables of `metadata` a store lacks, and the columns added to a table after the
    store was created (nullable ones only): `create_all` makes missing tables, never missing
    columns, and a workdir outlives kminer versions."""
    metadata.create_all(engine)
    found = inspect(engine)
    tables = set(found.get_table_names())
    with engine.begin() as conn:
        for table in metadata.sorted_tables:
            if table.name not in tables:
                continue
            have = {c["name"] for c in found.get_columns(table.name)}
            for column in table.columns:
                if column.name not in have and column.nullable:
                    kind = column.type.compile(dialect=engine.dialect)
                    add = f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}"
                    conn.exec_driver_sql(add)


class Store:
    """All persistence of a workdir; stages call these methods, never SQL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_engine(url, future=True)
        if url.startswith("sqlite"):
            _sqlite_pragmas(self.engine)
        create_tables(self.engine, Base.metadata)

    @classmethod
    def open(cls, workdir: Path, url: str | None = None) -> Store:
        workdir.mkdir(parents=True, exist_ok=True)
        return cls(url or f"sqlite:///{(workdir / DB_NAME).resolve()}")

    def close(self) -> None:
        self.engine.dispose()

    # repositories ---------------------------------------------------------------------------
    def upsert_repo(self, url: str, commit: str, **fields) -> int:
        with Session(self.engine) as s:
            row = s.scalars(
                select(RepoRow).where(RepoRow.url == url, RepoRow.commit == commit)
            ).first()
            if row is None:
                row = RepoRow(url=url, commit=commit)
                s.add(row)
            for key, value in fields.items():
                setattr(row, key, value)
            s.commit()
            return row.id

    def repo(self, repo_id: int | None = None) -> RepoRow | None:
        with Session(self.engine) as s:
            q = select(RepoRow)
            q = q.where(RepoRow.id == repo_id) if repo_id else q.order_by(RepoRow.updated_at.desc())
            return s.scalars(q).first()

    def repos(self) -> list[RepoRow]:
        with Session(self.engine) as s:
            rows = list(s.scalars(select(RepoRow).order_by(RepoRow.id)))
            for row in rows:
                s.expunge(row)
            return rows

    def set_discovery(self, repo_id: int, info: dict) -> None:
        with Session(self.engine) as s:
            row = s.get(RepoRow, repo_id)
            row.discovery = info
            s.commit()

    def replace_file_skips(self, repo_id: int, skips: Iterable[tuple[str, str]]) -> None:
        with Session(self.engine) as s:
            s.query(FileSkipRow).filter(FileSkipRow.repo_id == repo_id).delete()
            s.add_all(FileSkipRow(repo_id=repo_id, path=p, reason=r) for p, r in skips)
            s.commit()

    def file_skips(self, repo_id: int) -> list[tuple[str, str]]:
        with Session(self.engine) as s:
            rows = s.scalars(select(FileSkipRow).where(FileSkipRow.repo_id == repo_id))
            return [(r.path, r.reason) for r in rows]

    # candidates -----------------------------------------------------------------------------
    def save(self, cands: Candidate | Iterable[Candidate], repo_id: int | None = None) -> None:
        items = [cands] if isinstance(cands, Candidate) else list(cands)
        with Session(self.engine) as s:
            for c in items:
                row = s.get(CandidateRow, c.id)
                data = json.loads(c.model_dump_json())
                if row is None:
                    row = CandidateRow(
                        id=c.id,
                        repo_id=repo_id or 0,
                        file=c.kernel.file,
                        line=c.kernel.line,
                        kernel=c.kernel.name,
                        data=data,
                    )
                    s.add(row)
                else:
                    if repo_id:
                        row.repo_id = repo_id
                    row.file, row.line, row.kernel, row.data = (
                        c.kernel.file,
                        c.kernel.line,
                        c.kernel.name,
                        data,
                    )
                _upsert_summary(s, c, row.repo_id)
            s.commit()

    def candidates(self, repo_id: int | None = None) -> list[Candidate]:
        return list(self.iter_candidates(repo_id))

    def iter_candidates(self, repo_id: int | None = None) -> Iterator[Candidate]:
        with Session(self.engine) as s:
            q = select(CandidateRow).order_by(
                CandidateRow.file, CandidateRow.line, CandidateRow.kernel
            )
            if repo_id is not None:
                q = q.where(CandidateRow.repo_id == repo_id)
            for row in s.scalars(q):
                yield Candidate.model_validate(row.data)

    def fill_summaries(self) -> int:
        """Write the queue summaries a store lacks (written before they existed); how many."""
        with Session(self.engine) as s:
            missing = s.scalars(
                select(CandidateRow).where(~CandidateRow.id.in_(select(QueueRow.cand_id)))
            ).all()
            for row in missing:
                _upsert_summary(s, Candidate.model_validate(row.data), row.repo_id)
            s.commit()
            return len(missing)

    def get(self, cand_id: str) -> Candidate | None:
        with Session(self.engine) as s:
            row = s.get(CandidateRow, cand_id)
            return Candidate.model_validate(row.data) if row else None

    # compile cache --------------------------------------------------------------------------
    def cached_compile(self, key: str) -> CompileCacheRow | None:
        with Session(self.engine) as s:
            row = s.get(CompileCacheRow, key)
            if row is not None:
                s.expunge(row)
            return row

    def put_compile(self, key: str, **fields) -> None:
        with Session(self.engine) as s:
            row = s.get(CompileCacheRow, key) or CompileCacheRow(key=key)
            for k, v in fields.items():
                setattr(row, k, v)
            s.merge(row)
            s.commit()

    # llm cache and attempts -------------------------------------------------------------------
    def llm_cached(self, key: str) -> dict | None:
        with Session(self.engine) as s:
            row = s.get(LLMCacheRow, key)
            return dict(row.response) if row is not None else None

    def put_llm(self, key: str, model: str, request: dict, response: dict) -> None:
        with Session(self.engine) as s:
            s.merge(LLMCacheRow(key=key, model=model, request=request, response=response))
            s.commit()

    def add_attempt(self, cand_id: str, **fields) -> None:
        with Session(self.engine) as s:
            s.add(AttemptRow(cand_id=cand_id, **fields))
            s.commit()

    def attempts(self, cand_id: str) -> list[dict]:
        with Session(self.engine) as s:
            rows = s.scalars(
                select(AttemptRow).where(AttemptRow.cand_id == cand_id).order_by(AttemptRow.id)
            )
            return [
                {c.name: getattr(r, c.name) for c in AttemptRow.__table__.columns} for r in rows
            ]

    def passed_attempts(self, step: str) -> dict[str, dict]:
        """candidate id → the parsed answer of its latest passed attempt at `step` (one query,
        for an export of many candidates)."""
        with Session(self.engine) as s:
            q = select(AttemptRow.cand_id, AttemptRow.parsed).where(
                AttemptRow.step == step, AttemptRow.passed.is_(True)
            )
            return {
                cand_id: parsed or {} for cand_id, parsed in s.execute(q.order_by(AttemptRow.id))
            }

    # runs -----------------------------------------------------------------------------------
    def start_run(self, command: str) -> int:
        with Session(self.engine) as s:
            row = RunRow(command=command)
            s.add(row)
            s.commit()
            return row.id

    def finish_run(
        self, run_id: int, status: str, repo_id: int | None, timings: dict, counts: dict
    ) -> None:
        with Session(self.engine) as s:
            row = s.get(RunRow, run_id)
            row.status, row.repo_id, row.timings, row.counts = status, repo_id, timings, counts
            row.finished_at = now()
            s.commit()

    def last_run(self) -> RunRow | None:
        with Session(self.engine) as s:
            row = s.scalars(
                select(RunRow).where(RunRow.finished_at.is_not(None)).order_by(RunRow.id.desc())
            ).first()
            if row is not None:
                s.expunge(row)
            return row
