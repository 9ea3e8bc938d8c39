"""The leader's lease and the replicas' heartbeats: the ledger's SQL for several replicas.

One row in `leases` says which replica leads (decides and executes) until when, and the
fencing token of its term. Taking the lease over is a conditional UPDATE that succeeds only
once the holder's term has expired, and it bumps the token; a holder renews its own term
only while it still runs. Every claim a leader makes (recording decisions, moving one to
`running`) carries its term (`Term`) and is conditional on it in the same statement or
transaction, so a leader that was paused or cut off and comes back can claim nothing: its
token is not the current one any more. Times are the database's clock, not the replicas'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import ColumnElement, Engine, Float, exists, func, literal_column, select, update
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, CursorResult

from webhook.ledger.schema import LeaseRow, ReplicaRow

LOOP = "loop"  # the lease's name: who runs the decision loop


class LostLease(RuntimeError):
    """The leader's term ended (another replica leads now, or it expired): it claims nothing."""


@dataclass(frozen=True)
class Term:
    """One replica's term as leader: the token every claim of that term carries."""

    holder: str
    token: int


@dataclass(frozen=True)
class Leader:
    holder: str
    token: int
    expires_in: float  # seconds on the database's clock; <= 0: expired, nobody leads

    @property
    def running(self) -> str | None:
        """The holder while its term runs (None once it has expired: nobody leads)."""
        return self.holder if self.expires_in > 0 else None


@dataclass(frozen=True)
class Replica:
    name: str
    loop_age: float | None  # seconds since its loop's last beat (None: never)
    web_age: float | None  # seconds since its web workers last wrote
    leading: bool


def db_now(engine: Engine | Connection) -> ColumnElement[float]:
    """Now, in seconds since the epoch, on the database's clock."""
    if engine.dialect.name == "postgresql":
        return sql_cast(func.extract("epoch", func.clock_timestamp()), Float)
    return literal_column("((julianday('now') - 2440587.5) * 86400.0)", Float)


def _of(term: Term) -> list[ColumnElement[bool]]:
    """The lease row of `term` (expired or not)."""
    return [LeaseRow.name == LOOP, LeaseRow.holder == term.holder, LeaseRow.token == term.token]


def _running(engine: Engine | Connection, term: Term) -> list[ColumnElement[bool]]:
    """The lease row of `term` while the term runs."""
    return [*_of(term), LeaseRow.expires_at > db_now(engine)]


def current(engine: Engine | Connection, term: Term) -> ColumnElement[bool]:
    """True while `term` is the lease's current, unexpired one (for a claim's WHERE)."""
    return exists().where(*_running(engine, term))


def check_term(conn: Connection, term: Term) -> None:
    """LostLease unless `term` is current. On PostgreSQL the lease row stays locked (shared)
    until the transaction ends: no replica takes over between this check and the commit."""
    query = select(LeaseRow.token).where(*_running(conn, term))
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(read=True)
    if conn.execute(query).first() is None:
        raise LostLease(f"term {term.token} of {term.holder} has ended")


def _rowcount(result: Any) -> int:
    return int(cast(CursorResult[Any], result).rowcount)


def _insert(engine: Engine) -> Any:
    return (postgresql if engine.dialect.name == "postgresql" else sqlite).insert


class Leases:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def hold(self, holder: str, term: Term | None, ttl: float) -> Term | None:
        """Renew `term` while it runs, or take the lease once nobody's term runs; the term
        held after it (a new one, with the next token, when it was taken anew), or None."""
        if term is not None and self.renew(term, ttl):
            return term
        now = db_now(self.engine)
        with self.engine.begin() as conn:
            conn.execute(
                _insert(self.engine)(LeaseRow)
                .values(name=LOOP, holder="", token=0, expires_at=0.0, acquired_at=0.0)
                .on_conflict_do_nothing()
            )
            taken = conn.execute(
                update(LeaseRow)
                .where(LeaseRow.name == LOOP, LeaseRow.expires_at <= now)
                .values(
                    holder=holder,
                    token=LeaseRow.token + 1,
                    expires_at=now + ttl,
                    acquired_at=now,
                )
            )
            if not _rowcount(taken):
                return None
            token = conn.execute(select(LeaseRow.token).where(LeaseRow.name == LOOP)).scalar_one()
        return Term(holder, int(token))

    def renew(self, term: Term, ttl: float) -> bool:
        """Extend `term` while it runs; False once it has ended (never takes the lease)."""
        now = db_now(self.engine)
        with self.engine.begin() as conn:
            renewed = conn.execute(
                update(LeaseRow).where(*_running(conn, term)).values(expires_at=now + ttl)
            )
            return bool(_rowcount(renewed))

    def is_current(self, term: Term) -> bool:
        with self.engine.connect() as conn:
            return bool(conn.execute(select(current(conn, term))).scalar())

    def release(self, term: Term) -> None:
        """End `term` now (a clean stop): a follower need not wait for it to expire."""
        with self.engine.begin() as conn:
            conn.execute(update(LeaseRow).where(*_of(term)).values(expires_at=0.0))

    def leader(self) -> Leader | None:
        """Who holds the lease (None: never taken)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(LeaseRow.holder, LeaseRow.token, LeaseRow.expires_at - db_now(conn)).where(
                    LeaseRow.name == LOOP, LeaseRow.token > 0
                )
            ).first()
        return None if row is None else Leader(str(row[0]), int(row[1]), float(row[2]))

    def beat(
        self, replica: str, *, loop: bool = False, web: bool = False, leading: bool = False
    ) -> None:
        """A replica's sign of life: its loop's (with whether it leads), or its web workers' (a
        write, so /readyz knows the ledger takes one)."""
        now = db_now(self.engine)
        values: dict[str, Any] = {"name": replica}
        if loop:
            values |= {"loop_at": now, "leading": leading}
        if web:
            values["web_at"] = now
        stmt = _insert(self.engine)(ReplicaRow).values(**values)
        stmt = stmt.on_conflict_do_update(
            index_elements=[ReplicaRow.name],
            set_={k: v for k, v in values.items() if k != "name"},
        )
        with self.engine.begin() as conn:
            conn.execute(stmt)

    def replica(self, name: str) -> Replica | None:
        """A replica's last signs of life (None: it never beat)."""
        with self.engine.connect() as conn:
            now = db_now(conn)
            r = conn.execute(
                select(now - ReplicaRow.loop_at, now - ReplicaRow.web_at, ReplicaRow.leading).where(
                    ReplicaRow.name == name
                )
            ).first()
        if r is None:
            return None
        loop_age, web_age = (None if v is None else float(v) for v in (r[0], r[1]))
        return Replica(name, loop_age, web_age, bool(r[2]))
