"""The review queue: one summary row per candidate, so the queue filters and pages in SQL.

A candidate is stored as one JSON document (cases, attempts' figures, stages); filtering 10,000
of those in Python on every page view is what makes a review UI slow. `Store.save` keeps a
narrow, indexed summary beside each document (op, strategy, reference kind, outcome, kill rate,
kernel time), and the queue joins it with the review state. A store written before the summary
existed is filled in on first use (`ensure`).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

from sqlalchemy import Float, Integer, String, func, or_, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from curation.store import Base, CandidateRow, Decision, RepoRow, ReviewRow, _now
from miner.candidate import Candidate, Stage

PAGE_SIZE = 50
SORTS = {
    "kernel": "kernel",
    "op": "op",
    "outcome": "outcome",
    "kill_rate": "kill_rate",
    "kernel_time_us": "kernel_time_us",
    "updated": "updated_at",
}
FILTERS = ("status", "outcome", "op", "repo", "strategy", "reference_kind")


class QueueRow(Base):
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
    updated_at: Mapped[dt.datetime] = mapped_column(default=_now, onupdate=_now)


def summary(cand: Candidate, repo_id: int) -> dict:
    """The queue's columns for one candidate. `outcome` is the verify outcome, else why the
    candidate stopped (the last stage's reason), else ''."""
    verify = cand.stage(Stage.VERIFY)
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


def upsert(session: Session, cand: Candidate, repo_id: int) -> None:
    values = summary(cand, repo_id)
    row = session.get(QueueRow, cand.id)
    if row is None:
        session.add(QueueRow(**values))
    else:
        for key, value in values.items():
            setattr(row, key, value)


def ensure(store) -> int:
    """Fill in the summaries a store lacks (written before they existed); returns how many."""
    with Session(store.engine) as s:
        missing = s.scalars(
            select(CandidateRow).where(~CandidateRow.id.in_(select(QueueRow.cand_id)))
        ).all()
        for row in missing:
            upsert(s, Candidate.model_validate(row.data), row.repo_id)
        s.commit()
        return len(missing)


def _decision():
    return func.coalesce(ReviewRow.decision, Decision.PENDING.value)


def listing(store, filters: dict, sort: str = "kernel", page: int = 1) -> dict:
    """{items, total, page, pages, counts}: one page of the filtered, sorted queue; `counts` are
    the decisions over the whole store (the queue's header)."""
    q = (
        select(QueueRow, _decision().label("decision"), ReviewRow.version, RepoRow.url)
        .outerjoin(ReviewRow, ReviewRow.cand_id == QueueRow.cand_id)
        .outerjoin(RepoRow, RepoRow.id == QueueRow.repo_id)
    )
    for key in FILTERS:
        value = (filters.get(key) or "").strip()
        if not value:
            continue
        if key == "status":
            q = q.where(_decision() == value)
        elif key == "repo":
            q = q.where(or_(RepoRow.url.contains(value), func.cast(RepoRow.id, String) == value))
        else:
            q = q.where(getattr(QueueRow, key) == value)
    desc = sort.startswith("-")
    column = getattr(QueueRow, SORTS.get(sort.lstrip("-"), "kernel"))
    order = column.desc() if desc else column.asc()
    with Session(store.engine) as s:
        total = s.scalar(select(func.count()).select_from(q.subquery()))
        pages = max(1, -(-total // PAGE_SIZE))
        page = min(max(1, page), pages)
        rows = s.execute(
            q.order_by(order, QueueRow.cand_id).offset((page - 1) * PAGE_SIZE).limit(PAGE_SIZE)
        ).all()
    items = []
    for row, decision, version, url in rows:
        item = {c.name: getattr(row, c.name) for c in QueueRow.__table__.columns}
        item.update(id=row.cand_id, decision=decision, version=version or 0, repo=url or "")
        item["updated_at"] = row.updated_at.isoformat()
        items.append(item)
    counts = decision_counts(store)
    return {"items": items, "total": total, "page": page, "pages": pages, "counts": counts}


def decision_counts(store) -> dict[str, int]:
    """Candidates by decision over the whole store (never reviewed: pending)."""
    counts = Counter()
    with Session(store.engine) as s:
        for decision, n in s.execute(  # grouped by the bare column: Postgres binds a coalesce's
            select(ReviewRow.decision, func.count())  # default twice and then sees two groups
            .select_from(QueueRow)
            .outerjoin(ReviewRow, ReviewRow.cand_id == QueueRow.cand_id)
            .group_by(ReviewRow.decision)
        ).all():
            counts[decision or Decision.PENDING.value] += n
    return {d.value: counts.get(d.value, 0) for d in Decision}


def neighbours(store, cand_id: str) -> tuple[str, str]:
    """(previous, next) candidate ids in the queue's default order ('' at either end)."""
    with Session(store.engine) as s:
        ids = s.scalars(select(QueueRow.cand_id).order_by(QueueRow.kernel, QueueRow.cand_id)).all()
    at = ids.index(cand_id) if cand_id in ids else -1
    if at < 0:
        return "", ""
    return (ids[at - 1] if at > 0 else ""), (ids[at + 1] if at < len(ids) - 1 else "")
