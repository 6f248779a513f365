"""The allocation ledger: which service held which GPUs, for whom, from when to when.

The allocator knows who holds what *now*; the ledger keeps it for later, in a database
through SQLAlchemy (SQLite by default, or any SQLAlchemy URL, e.g. the hub's PostgreSQL),
and answers "how many GPU-hours did each user (or model) use between A and B".

Rules:

* a service has at most one open allocation. Opening again with the same user, server,
  host, model, devices and shares returns the open one (so retries and a restarted hub
  adopting its services are harmless); opening with different ones closes the old one
  as superseded (a close that was never recorded, e.g. while the database was down,
  must not block the next spawn). A partial unique index enforces this across
  processes on SQLite and PostgreSQL; a lock enforces it within one.
* ``close`` is idempotent: closing a service with nothing open changes nothing.
* shares are integer thousandths of a device ("milli", as in :mod:`gpuspawner.core.sharing`:
  1000 is the whole device).
* an allocation remembers the ids of its service's swarm tasks (``note_tasks``), so that
  after its close, even across a hub restart, the hub can tell whether a task (container)
  of its holder may still run on its devices.
* times are timezone-aware UTC in Python and naive UTC in the database (the same on
  every backend); naive datetimes are refused.
* any failure of the database raises :class:`LedgerError`, whose message says which
  database (password hidden), what was being done and why, in one line. The same
  ``Ledger`` works again once the database is back: connections are tested before use.
* bad arguments raise ``ValueError`` and change nothing.

The tables (prefix ``gpuspawner_``) and their version table
(``gpuspawner_alembic_version``, apart from JupyterHub's ``alembic_version``) are
created or upgraded on first use by the alembic migrations in ``gpuspawner.ledger.migrations``.

The API is synchronous and thread-safe; the hub calls it from an executor.
"""

import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from ..core.fairshare import FairShare
from ..core.sharing import UNIT
from .checks import (
    aware_utc,
    checked_models,
    checked_name,
    checked_range,
    checked_reserved,
    checked_shares,
    checked_task_ids,
    utc_now,
)
from .line import LedgerQueue
from .reads import (
    USAGE_KEYS,
    Usage,
    history_conditions,
    hours_within,
    open_record,
    select_records,
    usage_query,
    usage_totals,
    user_spans,
)
from .reservations import LedgerReservations
from .schema import (
    COLUMNS,
    AgentToken,
    Record,
    agent_tokens,
    allocation_devices,
    allocations,
    join_models,
    join_tasks,
    split_tasks,
)
from .url import DEFAULT_FILENAME, default_db_url, safe_url, scrub, secrets_of

# The ledger's public names; those defined in ledger_* modules are re-exported here.
__all__ = [
    "DEFAULT_FILENAME",
    "AgentToken",
    "Ledger",
    "LedgerError",
    "Record",
    "Usage",
    "default_db_url",
    "hours_within",
]

log = logging.getLogger(__name__)

SUPERSEDED = "superseded by a new allocation for the same service"
_ATTEMPTS = 20  # tries of a write against other processes writing the same service


class LedgerError(Exception):
    """The ledger's database cannot be used; the message is written for operators."""


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc  # the driver's own message, not SQLAlchemy's
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return lines[0] if lines else type(cause).__name__


class Ledger(LedgerQueue, LedgerReservations):
    """Allocations and their history in the database at ``url`` (any SQLAlchemy URL).

    Nothing is connected at construction: the tables are created or upgraded on first
    use, and that is tried again on every call until it succeeds, so a hub can start
    while its database is still coming up.
    """

    def __init__(self, url: str, *, connect_timeout: int = 10):
        self.url = safe_url(url)
        self._secrets = secrets_of(url)
        connect_args = {}
        try:
            parsed = sa.engine.make_url(url)
            # A stopped PostgreSQL refuses at once, but an unreachable host would hang a
            # spawn for minutes without a connect timeout.
            if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
                connect_args["connect_timeout"] = connect_timeout
            self.engine = sa.create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)
        except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError, ImportError, ValueError, TypeError) as e:
            # ValueError: e.g. a port that is not a number; TypeError: not a string
            hint = ""
            if isinstance(e, ImportError) or "psycopg" in str(e):
                hint = " (for PostgreSQL: pip install 'gpuspawner[postgres]' and use postgresql+psycopg://...)"
            why = scrub(_first_line(e), self._secrets)
            raise LedgerError(f"GPU ledger database URL {self.url} cannot be used: {why}{hint}") from None
        self._write_lock = threading.Lock()  # one writer at a time within this process
        self._schema_lock = threading.Lock()
        self._schema_ready = False

    def __repr__(self) -> str:
        return f"Ledger({self.url!r})"

    def dispose(self) -> None:
        """Close the pooled connections (the Ledger reconnects if used again)."""
        self.engine.dispose()

    # --- writing -------------------------------------------------------------------

    def open(
        self,
        service: str,
        user: str,
        server: str,
        host: str,
        model: str,
        devices: Sequence[str],
        milli: Sequence[int],
        started_at: datetime | None = None,
        *,
        cpu_milli: int | None = None,
        memory_mib: int | None = None,
        accepts: Sequence[str] | None = None,
    ) -> int:
        """Record that ``service`` holds ``devices`` from ``started_at`` (default: now),
        ``milli`` thousandths of each (an int in 1..1000 per device, 1000 the whole
        device); return the allocation's id. ``cpu_milli`` and ``memory_mib``: what the
        service reserves on its host besides GPUs; ``accepts``: the models its request
        accepted (empty: any); each None when not known. See the module's rules for a
        service that already has an open allocation."""
        devices, milli = checked_shares(devices, milli)
        wanted = Record(
            id=0,
            service=checked_name(service, "service", required=True),
            user=checked_name(user, "user", required=True),
            server=checked_name(server, "server", required=False),
            host=checked_name(host, "host", required=bool(devices)),
            model=checked_name(model, "model", required=bool(devices)),
            devices=devices,
            milli=milli,
            tasks=(),
            started_at=aware_utc(started_at, "started_at") or utc_now(),
            ended_at=None,
            end_reason="",
            cpu_milli=checked_reserved(cpu_milli, "cpu_milli"),
            memory_mib=checked_reserved(memory_mib, "memory_mib"),
            accepts=checked_models(accepts),
        )
        with self._write_lock, self._db(f"recording the allocation of {service}"):
            for attempt in range(_ATTEMPTS):
                try:
                    return self._open_once(wanted)
                except sa_exc.IntegrityError:
                    # Another process opened one for this service meanwhile (each such
                    # conflict is someone else's success): decide again against theirs.
                    if attempt == _ATTEMPTS - 1:
                        raise

    def _open_once(self, wanted: Record) -> int:
        with self.engine.begin() as conn:
            current = open_record(conn, wanted.service)
            if current is not None:
                if current.same_as(wanted):
                    return current.id
                log.warning(
                    "GPU ledger: %s already had open allocation #%d (%s on %s); closing it as superseded",
                    wanted.service,
                    current.id,
                    ", ".join(current.devices) or "no GPU",
                    current.host,
                )
                at = max(wanted.started_at, current.started_at)
                if wanted.started_at <= current.started_at:
                    # A start from before the open row began (an adopted service's creation):
                    # that row counts the time until now, and the new one from now on.
                    at = max(utc_now(), current.started_at)
                    wanted = replace(wanted, started_at=at)
                self._end(conn, current, at, SUPERSEDED)
            values = {column: getattr(wanted, field) for field, column in COLUMNS.items()}
            values["tasks"] = ",".join(wanted.tasks)
            values["accepted_models"] = join_models(wanted.accepts)
            new_id = conn.execute(allocations.insert().values(values)).inserted_primary_key[0]
            if wanted.devices:
                conn.execute(
                    allocation_devices.insert(),
                    [
                        {"allocation_id": new_id, "position": i, "uuid": uuid, "milli": milli}
                        for i, (uuid, milli) in enumerate(zip(wanted.devices, wanted.milli))
                    ],
                )
            return new_id

    def note_tasks(self, service: str, task_ids: Iterable[str]) -> bool:
        """Add the swarm task ids ``task_ids`` to ``service``'s open allocation (those it
        has stay first; none twice; the newest :data:`TASKS_MAX` are kept). False when the
        service has nothing open. Noting the same ids again changes nothing."""
        checked_name(service, "service", required=True)
        new = checked_task_ids(task_ids)
        a = allocations
        with self._write_lock, self._db(f"noting the tasks of {service}"):
            for _ in range(_ATTEMPTS):
                with self.engine.begin() as conn:
                    row = conn.execute(
                        sa.select(a.c.id, a.c.tasks).where(a.c.service == service, a.c.ended_at.is_(None))
                    ).first()
                    if row is None:
                        return False
                    tasks = ",".join(join_tasks(split_tasks(row.tasks), new))
                    if tasks == row.tasks:
                        return True
                    # Written only if no other process changed the ids since they were read
                    # (SQLite does not lock what a transaction reads); else read them again.
                    written = conn.execute(
                        a.update()
                        .where(a.c.id == row.id, a.c.ended_at.is_(None), a.c.tasks == row.tasks)
                        .values(tasks=tasks)
                    ).rowcount
                    if written:
                        return True
        raise LedgerError(
            f"GPU ledger database {self.url}: noting the tasks of {service} failed: "
            f"other writers changed them {_ATTEMPTS} times in a row"
        )

    def note_quota(self, service: str, group: str | None, borrowed: bool) -> bool:
        """Record how ``service``'s open allocation stands against the quotas: the group
        whose quota it draws on (None: none) and whether it borrows. False when the
        service has nothing open."""
        checked_name(service, "service", required=True)
        if group is not None:
            checked_name(group, "group", required=True)
        a = allocations
        with self._write_lock, self._db(f"noting the quota of {service}"), self.engine.begin() as conn:
            written = conn.execute(
                a.update()
                .where(a.c.service == service, a.c.ended_at.is_(None))
                .values(quota_group=group, borrowed=bool(borrowed))
            ).rowcount
        return bool(written)

    def close(self, service: str, ended_at: datetime | None = None, reason: str = "") -> Record | None:
        """End ``service``'s open allocation at ``ended_at`` (default: now) and return it as
        closed; None when the service has nothing open (closing twice is harmless)."""
        checked_name(service, "service", required=True)
        end = aware_utc(ended_at, "ended_at")
        if not isinstance(reason, str):
            raise ValueError(f"reason must be a string, not {type(reason).__name__}")
        with self._write_lock, self._db(f"closing the allocation of {service}"):
            with self.engine.begin() as conn:
                current = open_record(conn, service)
                if current is None:
                    return None
                if end is not None and end < current.started_at:
                    raise ValueError(
                        f"ended_at {end.isoformat()} is before {service}'s allocation started "
                        f"({current.started_at.isoformat()})"
                    )
                # A clock that stepped back must not give a negative duration.
                return self._end(conn, current, end or max(utc_now(), current.started_at), reason)

    def close_missing(
        self, running: Iterable[str], ended_at: datetime | None = None, reason: str = "service gone"
    ) -> list[Record]:
        """Close every open allocation whose service is not in ``running`` (e.g. at hub
        start, with the services the swarm runs); return those closed."""
        if isinstance(running, str):
            raise ValueError("running must be a collection of service names, not one string")
        running = set(running)
        end = aware_utc(ended_at, "ended_at") or utc_now()
        with self._write_lock, self._db("closing the allocations of services that are gone"):
            with self.engine.begin() as conn:
                gone = [r for r in select_records(conn, allocations.c.ended_at.is_(None)) if r.service not in running]
                return [self._end(conn, r, max(end, r.started_at), reason) for r in gone]

    @staticmethod
    def _end(conn: sa.Connection, record: Record, end: datetime, reason: str) -> Record:
        conn.execute(
            allocations.update()
            .where(allocations.c.id == record.id, allocations.c.ended_at.is_(None))
            .values(ended_at=end, end_reason=reason)
        )
        return replace(record, ended_at=end, end_reason=reason)

    def note_peak_memory(self, service: str, mib: int) -> None:
        """``service``'s open allocation used ``mib`` of GPU memory: kept if it is its most so far."""
        a = allocations
        with self._db(f"recording {service}'s GPU memory"), self.engine.begin() as conn:
            conn.execute(
                a.update()
                .where(a.c.service == service, a.c.ended_at.is_(None))
                .where(sa.or_(a.c.peak_memory_mib.is_(None), a.c.peak_memory_mib < mib))
                .values(peak_memory_mib=mib)
            )

    # --- reading -------------------------------------------------------------------

    def open_allocations(self) -> list[Record]:
        """Every allocation not yet closed, oldest first."""
        with self._db("reading the open allocations"), self.engine.connect() as conn:
            return select_records(conn, allocations.c.ended_at.is_(None))

    def history(
        self,
        user: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        device: str | None = None,
    ) -> list[Record]:
        """Allocations that overlap [since, until] (None: unbounded), of ``user`` and
        including ``device`` (a UUID) when given, oldest first."""
        since, until = checked_range(since, until, until_default=None)
        where = history_conditions(since, until, user, device)
        with self._db("reading the allocation history"), self.engine.connect() as conn:
            return select_records(conn, *where)

    def usage(self, since: datetime | None = None, until: datetime | None = None, by: str = "user") -> list[Usage]:
        """GPU-hours per user (``by="user"``), per model (``by="model"``), per end reason (``by="reason"``)
        or per standing against the quotas (``by="quota"``) within
        [since, until] (since None: from the first allocation; until None: now).

        Each allocation counts (its overlap of [started_at, ended_at or now] with the
        range, in hours) × (the sum of its shares, in GPUs). Largest first; allocations without
        GPUs count nothing and keys without GPU-hours are left out."""
        if by not in USAGE_KEYS:
            raise ValueError(f"usage by {by!r}: use one of {', '.join(USAGE_KEYS)}")
        now = utc_now()
        since, until = checked_range(since, until, until_default=now)
        with self._db("computing GPU usage"), self.engine.connect() as conn:
            return usage_totals(conn.execute(usage_query(by, since, until)), now, since, until)

    def recent_use(self, users: Iterable[str], fair: FairShare, now: datetime | None = None) -> dict[str, float]:
        """Each user's recent use as fair share weighs it (decayed GPU-hours,
        :mod:`gpuspawner.core.fairshare`), 0 for a user without any."""
        now = now or utc_now()
        users = sorted(set(users))
        spans: dict[str, list] = {u: [] for u in users}
        query = usage_query("user", fair.horizon(now), None).where(allocations.c.username.in_(users))
        with self._db("reading the waiters' recent GPU use"), self.engine.connect() as conn:
            for user, started, ended, milli, _peak in conn.execute(query):
                spans[user].append((started, ended, milli / UNIT))
        return {u: fair.recent_use(s, now) for u, s in spans.items()}

    def user_spans(self, user: str, since: datetime) -> list[tuple[datetime, datetime | None, float]]:
        """``user``'s GPU allocations after ``since``: (started, ended or None, GPUs)."""
        with self._db("reading a user's GPU usage"), self.engine.connect() as conn:
            return user_spans(conn, user, since)

    # --- node agents' tokens ------------------------------------------------------

    def set_agent_token(self, host: str, token_sha256: str, issued_at: datetime | None = None) -> bool:
        """Store ``token_sha256`` as ``host``'s agent token, replacing the one it had (in
        one transaction: the old one stops working as the new one starts). True when it
        replaced one."""
        checked_name(host, "host", required=True)
        if not isinstance(token_sha256, str) or len(token_sha256) != 64:
            raise ValueError("token_sha256 must be a SHA-256 in hex (64 characters)")
        when = aware_utc(issued_at, "issued_at") or utc_now()
        t = agent_tokens
        with self._write_lock, self._db(f"storing the agent token of {host}"), self.engine.begin() as conn:
            replaced = conn.execute(t.delete().where(t.c.host == host)).rowcount
            conn.execute(t.insert().values(host=host, token_sha256=token_sha256, issued_at=when))
            return bool(replaced)

    def revoke_agent_token(self, host: str) -> bool:
        """Forget ``host``'s agent token; False when it had none."""
        checked_name(host, "host", required=True)
        t = agent_tokens
        with self._write_lock, self._db(f"revoking the agent token of {host}"), self.engine.begin() as conn:
            return bool(conn.execute(t.delete().where(t.c.host == host)).rowcount)

    def agent_token(self, token_sha256: str) -> AgentToken | None:
        """The stored token with this digest, or None."""
        t = agent_tokens
        with self._db("reading an agent token"), self.engine.connect() as conn:
            row = conn.execute(sa.select(t).where(t.c.token_sha256 == token_sha256)).first()
        return None if row is None else AgentToken(row.host, row.token_sha256, row.issued_at)

    def agent_tokens(self) -> list[AgentToken]:
        """Every host's stored token, by host."""
        t = agent_tokens
        with self._db("listing the agent tokens"), self.engine.connect() as conn:
            rows = conn.execute(sa.select(t).order_by(t.c.host)).all()
        return [AgentToken(r.host, r.token_sha256, r.issued_at) for r in rows]

    # --- plumbing ------------------------------------------------------------------

    @contextmanager
    def _db(self, doing: str) -> Iterator[None]:
        """Prepare the tables if needed; turn any database failure into one LedgerError."""
        try:
            self._ensure_schema()
            yield
        except sa_exc.SQLAlchemyError as e:
            why = scrub(_first_line(e), self._secrets)
            raise LedgerError(f"GPU ledger database {self.url}: {doing} failed: {why}") from None

    def _ensure_schema(self) -> None:
        if self._schema_ready:
            return
        with self._schema_lock:
            if not self._schema_ready:
                from .migrations import MigrationError, upgrade  # alembic loads only when needed

                try:
                    upgrade(self.engine, self.url)
                except MigrationError as e:
                    raise LedgerError(scrub(str(e), self._secrets)) from None
                self._schema_ready = True
