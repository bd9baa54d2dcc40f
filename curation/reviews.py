"""The curators' state: each candidate's review and the audit trail of every write.

These tables live in the pipeline store's database but belong to curation: the miner never reads
a review, so it never learns of them. `Reviews(store)` makes the tables on first use. A review
carries a version that grows by one per write: two curators acting on the same candidate never
silently overwrite each other (the second gets a `VersionConflict` holding the newer state).
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum

from sqlalchemy import JSON, Boolean, Integer, String, Text, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from miner.store import Store, create_tables, now


class Base(DeclarativeBase):
    """Curation's tables (reviews, audit, curators, sessions), apart from the pipeline's."""


class Decision(StrEnum):
    """A curator's verdict on a candidate (closed set: the queue filters and export read it)."""

    PENDING = "pending"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    NEEDS_EDIT = "needs_edit"


class VersionConflict(Exception):
    """A write based on an older version of a review; `current` is the newer state."""

    def __init__(self, current: dict) -> None:
        super().__init__(f"review of {current['cand_id']} is at version {current['version']}")
        self.current = current


class ReviewRow(Base):
    """A candidate's curation state now; `version` grows by one per write (optimistic locking)."""

    __tablename__ = "reviews"
    cand_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    decision: Mapped[str] = mapped_column(String(16), default=Decision.PENDING.value, index=True)
    reason: Mapped[str] = mapped_column(String(64), default="")
    note: Mapped[str] = mapped_column(Text, default="")
    curator: Mapped[str] = mapped_column(String(128), default="")
    reviewed_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    override: Mapped[bool] = mapped_column(Boolean, default=False)  # accepted despite the checks
    instruction: Mapped[str | None] = mapped_column(Text, nullable=True)  # curator's edit wins
    instruction_complete: Mapped[str | None] = mapped_column(Text, nullable=True)
    version: Mapped[int] = mapped_column(Integer, default=0)


class AuditRow(Base):
    """Every curation write: who, when, what, the state before and after."""

    __tablename__ = "audit"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[dt.datetime] = mapped_column(default=now)
    curator: Mapped[str] = mapped_column(String(128), default="")
    cand_id: Mapped[str] = mapped_column(String(32), default="", index=True)
    action: Mapped[str] = mapped_column(String(32))
    before: Mapped[dict] = mapped_column(JSON, default=dict)
    after: Mapped[dict] = mapped_column(JSON, default=dict)


REVIEW_FIELDS = ("decision", "reason", "note", "curator", "override")
REVIEW_FIELDS += ("instruction", "instruction_complete")
_MADE: set[str] = set()  # engines (by URL) whose curation tables exist


def ensure_tables(engine: Engine) -> None:
    """Curation's tables in the store's database (once per database and process)."""
    url = engine.url.render_as_string(hide_password=False)
    if url not in _MADE:
        create_tables(engine, Base.metadata)
        _MADE.add(url)


def _review_dict(cand_id: str, row: ReviewRow | None) -> dict:
    if row is None:
        return {"cand_id": cand_id, "decision": Decision.PENDING.value, "reason": "", "note": "",
                "curator": "", "reviewed_at": None, "override": False, "instruction": None,
                "instruction_complete": None, "version": 0}  # fmt: skip
    out = {c.name: getattr(row, c.name) for c in ReviewRow.__table__.columns}
    out["reviewed_at"] = row.reviewed_at.isoformat() if row.reviewed_at else None
    return out


class Reviews:
    """Reviews and audit of one store; every write is one transaction with its audit row."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.engine = store.engine
        ensure_tables(self.engine)

    def get(self, cand_id: str) -> dict:
        """The candidate's review state; a candidate never reviewed is `pending` at version 0."""
        with Session(self.engine) as s:
            return _review_dict(cand_id, s.get(ReviewRow, cand_id))

    def all(self, decision: Decision | str | None = None) -> dict[str, dict]:
        """Every stored review (by candidate id), or only those with one decision."""
        with Session(self.engine) as s:
            q = select(ReviewRow)
            if decision is not None:
                q = q.where(ReviewRow.decision == Decision(decision).value)
            return {r.cand_id: _review_dict(r.cand_id, r) for r in s.scalars(q)}

    def write(
        self,
        cand_id: str,
        base_version: int,
        curator: str,
        action: str,
        changes: dict | None = None,
        **fields,
    ) -> dict:
        """Apply `fields` if the review is still at `base_version`; audit it in the same commit.

        Raises VersionConflict (carrying the newer state) when another write came first.
        `changes` ({key: (before, after)}) records what else the action changed (a label
        revision) in the audit row.
        """
        unknown = set(fields) - set(REVIEW_FIELDS)
        if unknown:
            raise ValueError(f"not a review field: {', '.join(sorted(unknown))}")
        values = {k: v.value if isinstance(v, Decision) else v for k, v in fields.items()}
        values.update(curator=curator, version=base_version + 1)
        if "decision" in fields:
            values["reviewed_at"] = now()
        with Session(self.engine) as s:
            before = _review_dict(cand_id, s.get(ReviewRow, cand_id))
            if before["version"] != base_version:
                raise VersionConflict(before)
            if base_version == 0:
                s.add(ReviewRow(cand_id=cand_id, **values))
            else:  # the WHERE on version makes the check and the write one atomic step
                done = s.execute(
                    update(ReviewRow)
                    .where(ReviewRow.cand_id == cand_id, ReviewRow.version == base_version)
                    .values(**values)
                )
                if done.rowcount != 1:
                    s.rollback()
                    raise VersionConflict(self.get(cand_id))
            after = dict(before, **values)
            after["reviewed_at"] = (
                values["reviewed_at"].isoformat()
                if "reviewed_at" in values
                else before["reviewed_at"]
            )
            extra = changes or {}
            s.add(AuditRow(curator=curator, cand_id=cand_id, action=action,
                           before={**before, **{k: v[0] for k, v in extra.items()}},
                           after={**after, **{k: v[1] for k, v in extra.items()}}))  # fmt: skip
            try:
                s.commit()
            except IntegrityError:  # two first writes raced on the insert
                s.rollback()
                raise VersionConflict(self.get(cand_id)) from None
            return after

    def audit(self, cand_id: str | None = None) -> list[dict]:
        with Session(self.engine) as s:
            q = select(AuditRow).order_by(AuditRow.id)
            if cand_id is not None:
                q = q.where(AuditRow.cand_id == cand_id)
            cols = AuditRow.__table__.columns
            return [{c.name: getattr(r, c.name) for c in cols} for r in s.scalars(q)]
