"""The review queue: the store's per-candidate summaries joined with their reviews, in SQL.

A candidate is stored as one JSON document (cases, attempts' figures, stages); filtering 10,000
of those in Python on every page view is what makes a review UI slow. The pipeline's store keeps
a narrow, indexed summary beside each document (`miner.store.QueueRow`); here it is joined with
the review state, filtered, sorted and paged.
"""

from __future__ import annotations

from collections import Counter

from sqlalchemy import String, func, or_, select
from sqlalchemy.orm import Session

from curation.reviews import Decision, ReviewRow, ensure_tables
from miner.store import QueueRow, RepoRow

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


def _decision():
    return func.coalesce(ReviewRow.decision, Decision.PENDING.value)


def listing(store, filters: dict, sort: str = "kernel", page: int = 1) -> dict:
    """{items, total, page, pages, counts}: one page of the filtered, sorted queue; `counts` are
    the decisions over the whole store (the queue's header)."""
    ensure_tables(store.engine)
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
    ensure_tables(store.engine)
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
