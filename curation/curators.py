"""Who may write to the review queue: curators, their tokens, and browser sessions.

A token is shown once, when the curator is added; only its SHA-256 is stored, so a copy of the
database gives nobody a way in. A revoked curator keeps their name in the audit trail and gets
403 (not 401: the server knows who they are and refuses). A browser logs in once with the token
and then carries a random session id in an HttpOnly cookie; the session also holds the CSRF token
its forms must echo. Sessions live in the store, so a restarted server keeps its users logged in
and several server processes share them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import String, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from curation.reviews import Base, ensure_tables
from miner.store import Store, now

SESSION_DAYS = 14
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


class CuratorRow(Base):
    __tablename__ = "curators"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=now)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)


class SessionRow(Base):
    __tablename__ = "sessions"
    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    curator: Mapped[str] = mapped_column(String(64), index=True)
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(default=now)


class CuratorError(ValueError):
    """A curator command that cannot be done (bad or taken name, unknown curator)."""


@dataclass(frozen=True)
class Who:
    name: str
    revoked: bool
    csrf: str = ""  # set for a browser session: its forms must carry it


def _session(store: Store) -> Session:
    ensure_tables(store.engine)
    return Session(store.engine)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def add(store: Store, name: str) -> str:
    """Create a curator; returns the token (shown once, never stored)."""
    if not _NAME.match(name):
        raise CuratorError(f"bad curator name {name!r}: letters, digits, _ . @ - (at most 64)")
    token = "kmc_" + secrets.token_urlsafe(32)
    with _session(store) as s:
        if s.get(CuratorRow, name) is not None:
            raise CuratorError(f"curator {name!r} exists (revoke it, or choose another name)")
        s.add(CuratorRow(name=name, token_hash=_hash(token)))
        s.commit()
    return token


def listing(store: Store) -> list[dict]:
    with _session(store) as s:
        rows = s.scalars(select(CuratorRow).order_by(CuratorRow.name))
        return [
            {"name": r.name, "created_at": r.created_at, "revoked_at": r.revoked_at} for r in rows
        ]


def revoke(store: Store, name: str) -> None:
    """Revoke a curator's token and end their sessions."""
    with _session(store) as s:
        row = s.get(CuratorRow, name)
        if row is None:
            raise CuratorError(f"no curator {name!r}")
        if row.revoked_at is None:
            row.revoked_at = now()
        s.query(SessionRow).filter(SessionRow.curator == name).delete()
        s.commit()


def by_token(store: Store, token: str) -> Who | None:
    """The curator holding `token` (revoked or not), or None for an unknown token."""
    if not token:
        return None
    digest = _hash(token)
    with _session(store) as s:
        row = s.scalars(select(CuratorRow).where(CuratorRow.token_hash == digest)).first()
        if row is None or not hmac.compare_digest(row.token_hash, digest):
            return None
        return Who(row.name, row.revoked_at is not None)


def open_session(store: Store, name: str) -> str:
    """A new browser session for `name`; returns its id (the cookie value)."""
    session_id = secrets.token_urlsafe(32)
    with _session(store) as s:
        s.add(SessionRow(id_hash=_hash(session_id), curator=name, csrf=secrets.token_urlsafe(24)))
        s.commit()
    return session_id


def by_session(store: Store, session_id: str) -> Who | None:
    if not session_id:
        return None
    with _session(store) as s:
        row = s.get(SessionRow, _hash(session_id))
        if row is None or now() - row.created_at > dt.timedelta(days=SESSION_DAYS):
            return None
        curator = s.get(CuratorRow, row.curator)
        revoked = curator is None or curator.revoked_at is not None
        return Who(row.curator, revoked, row.csrf)


def close_session(store: Store, session_id: str) -> None:
    with _session(store) as s:
        s.query(SessionRow).filter(SessionRow.id_hash == _hash(session_id)).delete()
        s.commit()
