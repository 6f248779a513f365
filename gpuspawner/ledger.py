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
* shares are integer thousandths of a device ("milli", as in :mod:`gpuspawner.sharing`:
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
created or upgraded on first use by the alembic migrations in ``ledger_migrations``.

The API is synchronous and thread-safe; the hub calls it from an executor.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from .sharing import UNIT

__all__ = [
    "DEFAULT_FILENAME",
    "Ledger",
    "LedgerError",
    "Record",
    "Usage",
    "default_db_url",
    "hours_within",
]

log = logging.getLogger(__name__)

#: The default ledger file, beside the hub's own database.
DEFAULT_FILENAME = "gpuspawner.sqlite"
SUPERSEDED = "superseded by a new allocation for the same service"
_NAME_MAX = 255
_ATTEMPTS = 20  # tries of a write against other processes writing the same service
TASK_ID = re.compile(r"[A-Za-z0-9]{1,64}")  # a swarm task id (25 lowercase letters and digits)
TASKS_MAX = 64  # task ids kept per allocation (the newest)


class LedgerError(Exception):
    """The ledger's database cannot be used; the message is written for operators."""


class UTCDateTime(sa.types.TypeDecorator):
    """Aware UTC datetimes in Python, naive UTC in the database (alike on every backend)."""

    impl = sa.DateTime
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return None if value is None else value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value, dialect):
        return None if value is None else value.replace(tzinfo=timezone.utc)


metadata = sa.MetaData()

allocations = sa.Table(
    "gpuspawner_allocations",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("service", sa.String(_NAME_MAX), nullable=False),
    sa.Column("username", sa.String(_NAME_MAX), nullable=False),
    sa.Column("server", sa.String(_NAME_MAX), nullable=False),  # "": the default server
    sa.Column("host", sa.String(_NAME_MAX), nullable=False),
    sa.Column("model", sa.String(_NAME_MAX), nullable=False),  # "": no GPU
    sa.Column("started_at", UTCDateTime, nullable=False),
    sa.Column("ended_at", UTCDateTime, nullable=True),  # NULL: still open
    sa.Column("end_reason", sa.Text, nullable=False),
    sa.Column("tasks", sa.Text, nullable=False, server_default=""),  # swarm task ids, comma-separated
    # At most one open allocation per service (created as such on SQLite and PostgreSQL).
    sa.Index(
        "gpuspawner_allocations_open_service",
        "service",
        unique=True,
        sqlite_where=sa.text("ended_at IS NULL"),
        postgresql_where=sa.text("ended_at IS NULL"),
    ),
    sa.Index("gpuspawner_allocations_started_at", "started_at"),
    sa.Index("gpuspawner_allocations_username", "username"),
)

# One row per device of an allocation, so "who had GPU-xyz when" is one indexed query.
allocation_devices = sa.Table(
    "gpuspawner_allocation_devices",
    metadata,
    sa.Column(
        "allocation_id",
        sa.Integer,
        sa.ForeignKey("gpuspawner_allocations.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("position", sa.Integer, primary_key=True),  # order as given
    sa.Column("uuid", sa.String(_NAME_MAX), nullable=False),
    sa.Column("milli", sa.Integer, nullable=False),  # thousandths: 1000 is the whole device
    sa.Index("gpuspawner_allocation_devices_uuid", "uuid"),
)


# Record field: allocations column, for what is stored one to one.
_COLUMNS = {
    "service": "service",
    "user": "username",
    "server": "server",
    "host": "host",
    "model": "model",
    "started_at": "started_at",
    "ended_at": "ended_at",
    "end_reason": "end_reason",
}


@dataclass(frozen=True)
class Record:
    """One allocation: a service's devices from ``started_at`` to ``ended_at`` (None: open)."""

    id: int
    service: str
    user: str
    server: str
    host: str
    model: str
    devices: tuple[str, ...]
    milli: tuple[int, ...]  # each device's share in thousandths (1000: whole), aligned with devices
    tasks: tuple[str, ...]  # the ids of the service's swarm tasks noted so far, oldest first
    started_at: datetime
    ended_at: datetime | None
    end_reason: str

    @property
    def gpus(self) -> float:
        """How many GPUs' worth the allocation held (the sum of its shares), for reports."""
        return sum(self.milli) / UNIT

    def _same_as(self, other: Record) -> bool:
        fields = ("user", "server", "host", "model", "devices", "milli")
        return all(getattr(self, f) == getattr(other, f) for f in fields)


class Usage(NamedTuple):
    key: str  # a user name or a model name
    gpu_hours: float


def hours_within(start: datetime, end: datetime, since: datetime | None, until: datetime) -> float:
    """Hours of [start, end] that lie within [since, until] (None: from the beginning)."""
    lo = start if since is None else max(start, since)
    hi = min(end, until)
    return max(0.0, (hi - lo).total_seconds() / 3600)


def default_db_url(hub_db_url: str, cwd: str | os.PathLike) -> str:
    """The default ``gpu_db_url``: ``gpuspawner.sqlite`` beside the hub's SQLite file,
    or in the hub's working directory ``cwd`` when the hub's database is anything else."""
    directory = Path(os.path.abspath(cwd))
    try:
        url = sa.engine.make_url(hub_db_url)
    except sa_exc.ArgumentError:
        url = None
    if (
        url is not None
        and url.get_backend_name() == "sqlite"
        and url.database
        and url.database != ":memory:"
        and not url.database.startswith("file:")
    ):
        directory = (directory / url.database).parent  # an absolute path replaces cwd
    return f"sqlite:///{directory / DEFAULT_FILENAME}"


# Query parameters whose value is a secret (case-insensitive, percent-decoded):
# password, passwd, pwd, sslpassword, token, secret, client_secret, api_key ...
_SECRET_KEY = re.compile(r"pass|pwd|token|secret|api_?key", re.IGNORECASE)
_USERINFO_PASSWORD = re.compile(r"^([^:/?#]*://[^:/?#@]*:)(.*)(@)", re.DOTALL)
_MASK = "***"


def safe_url(url: str | sa.engine.URL) -> str:
    """The URL with every password hidden (in its user part and in query
    parameters such as ``?password=``), for messages and logs. Never raises,
    whatever it is given."""
    if isinstance(url, sa.engine.URL):
        url = url.render_as_string(hide_password=False)
    if not isinstance(url, str):
        return f"<a {type(url).__name__}, not a URL>"
    # Greedy up to the last "@": a password with an unescaped "@" is hidden whole.
    text = _USERINFO_PASSWORD.sub(lambda m: m[1] + _MASK + m[3] if m[2] else m[0], url, count=1)
    base, sep, query = text.partition("?")
    if not sep:
        return text
    query, hash_, fragment = query.partition("#")
    parts = []
    for part in re.split(r"([&;])", query):
        key, eq, value = part.partition("=")
        if eq and value and _SECRET_KEY.search(urllib.parse.unquote_plus(key)):
            value = _MASK
        parts.append(key + eq + value)
    return base + sep + "".join(parts) + hash_ + fragment


def _secrets_of(url: str) -> list[str]:
    """The secret values in a URL, as written and decoded, longest first, to
    scrub from messages that quote it (a driver's error, a parser's)."""
    if not isinstance(url, str):
        return []
    secrets = set()
    m = _USERINFO_PASSWORD.match(url)
    if m and m[2]:
        secrets.add(m[2])
    for part in re.split(r"[&;]", url.partition("?")[2].partition("#")[0]):
        key, eq, value = part.partition("=")
        if eq and value and _SECRET_KEY.search(urllib.parse.unquote_plus(key)):
            secrets.add(value)
    secrets |= {urllib.parse.unquote_plus(s) for s in secrets}
    return sorted((s for s in secrets if s), key=len, reverse=True)


def _scrub(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, _MASK)
    return text


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc  # the driver's own message, not SQLAlchemy's
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return lines[0] if lines else type(cause).__name__


def _utc(value: datetime | None, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ValueError(f"{name} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc)), got {value}")
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError(
            f"{name} {value.isoformat()} is out of range: in UTC it falls outside years 1 to 9999"
        ) from None


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _name(value: str, what: str, *, required: bool) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, not {type(value).__name__}")
    if required and not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > _NAME_MAX:
        raise ValueError(f"{what} is longer than {_NAME_MAX} characters: {value[:40]}...")
    return value


def _devices_and_milli(devices: Sequence[str], milli: Sequence[int]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if isinstance(devices, str):
        raise ValueError("devices must be a list of device UUIDs, not one string")
    devices = tuple(_name(d, "a device UUID", required=True) for d in devices)
    milli = tuple(milli)
    if len(devices) != len(milli):
        raise ValueError(f"{len(devices)} devices but {len(milli)} shares: give one share per device")
    if len(set(devices)) != len(devices):
        raise ValueError(f"a device is listed twice: {', '.join(devices)}")
    for uuid, share in zip(devices, milli):
        if isinstance(share, bool) or not isinstance(share, int) or not 0 < share <= UNIT:
            raise ValueError(
                f"the share of {uuid} must be an integer number of thousandths in 1..{UNIT} "
                f"({UNIT}: the whole device), got {share!r}"
            )
    return devices, tuple(int(m) for m in milli)


def _task_ids(task_ids: Iterable[str]) -> tuple[str, ...]:
    if isinstance(task_ids, str):
        raise ValueError("task_ids must be a collection of swarm task ids, not one string")
    task_ids = tuple(task_ids)
    for task in task_ids:
        if not isinstance(task, str) or not TASK_ID.fullmatch(task):
            raise ValueError(f"a swarm task id is 1 to 64 letters and digits, got {task!r}")
    return task_ids


def _join_tasks(old: Sequence[str], new: Sequence[str]) -> tuple[str, ...]:
    """``old`` then the ids of ``new`` not in it, in order, without repeats; at most
    :data:`TASKS_MAX`, dropping the oldest (those replaced longest ago) first."""
    return tuple(dict.fromkeys((*old, *new)))[-TASKS_MAX:]


def _split_tasks(text: str) -> tuple[str, ...]:
    """The ``tasks`` column's text as ids."""
    return tuple(text.split(",")) if text else ()


class Ledger:
    """Allocations and their history in the database at ``url`` (any SQLAlchemy URL).

    Nothing is connected at construction: the tables are created or upgraded on first
    use, and that is tried again on every call until it succeeds, so a hub can start
    while its database is still coming up.
    """

    def __init__(self, url: str, *, connect_timeout: int = 10):
        self.url = safe_url(url)
        self._secrets = _secrets_of(url)
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
            why = _scrub(_first_line(e), self._secrets)
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
    ) -> int:
        """Record that ``service`` holds ``devices`` from ``started_at`` (default: now),
        ``milli`` thousandths of each (an int in 1..1000 per device, 1000 the whole
        device); return the allocation's id. See the module's rules for a service that
        already has an open allocation."""
        devices, milli = _devices_and_milli(devices, milli)
        wanted = Record(
            id=0,
            service=_name(service, "service", required=True),
            user=_name(user, "user", required=True),
            server=_name(server, "server", required=False),
            host=_name(host, "host", required=bool(devices)),
            model=_name(model, "model", required=bool(devices)),
            devices=devices,
            milli=milli,
            tasks=(),
            started_at=_utc(started_at, "started_at") or _now(),
            ended_at=None,
            end_reason="",
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
            current = self._open_record(conn, wanted.service)
            if current is not None:
                if current._same_as(wanted):
                    return current.id
                log.warning(
                    "GPU ledger: %s already had open allocation #%d (%s on %s); closing it as superseded",
                    wanted.service,
                    current.id,
                    ", ".join(current.devices) or "no GPU",
                    current.host,
                )
                self._end(conn, current, max(wanted.started_at, current.started_at), SUPERSEDED)
            values = {column: getattr(wanted, field) for field, column in _COLUMNS.items()}
            values["tasks"] = ",".join(wanted.tasks)
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
        _name(service, "service", required=True)
        new = _task_ids(task_ids)
        a = allocations
        with self._write_lock, self._db(f"noting the tasks of {service}"):
            for _ in range(_ATTEMPTS):
                with self.engine.begin() as conn:
                    row = conn.execute(
                        sa.select(a.c.id, a.c.tasks).where(a.c.service == service, a.c.ended_at.is_(None))
                    ).first()
                    if row is None:
                        return False
                    tasks = ",".join(_join_tasks(_split_tasks(row.tasks), new))
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

    def close(self, service: str, ended_at: datetime | None = None, reason: str = "") -> Record | None:
        """End ``service``'s open allocation at ``ended_at`` (default: now) and return it as
        closed; None when the service has nothing open (closing twice is harmless)."""
        _name(service, "service", required=True)
        end = _utc(ended_at, "ended_at")
        if not isinstance(reason, str):
            raise ValueError(f"reason must be a string, not {type(reason).__name__}")
        with self._write_lock, self._db(f"closing the allocation of {service}"):
            with self.engine.begin() as conn:
                current = self._open_record(conn, service)
                if current is None:
                    return None
                if end is not None and end < current.started_at:
                    raise ValueError(
                        f"ended_at {end.isoformat()} is before {service}'s allocation started "
                        f"({current.started_at.isoformat()})"
                    )
                # A clock that stepped back must not give a negative duration.
                return self._end(conn, current, end or max(_now(), current.started_at), reason)

    def close_missing(
        self, running: Iterable[str], ended_at: datetime | None = None, reason: str = "service gone"
    ) -> list[Record]:
        """Close every open allocation whose service is not in ``running`` (e.g. at hub
        start, with the services the swarm runs); return those closed."""
        if isinstance(running, str):
            raise ValueError("running must be a collection of service names, not one string")
        running = set(running)
        end = _utc(ended_at, "ended_at") or _now()
        with self._write_lock, self._db("closing the allocations of services that are gone"):
            with self.engine.begin() as conn:
                gone = [r for r in self._select(conn, allocations.c.ended_at.is_(None)) if r.service not in running]
                return [self._end(conn, r, max(end, r.started_at), reason) for r in gone]

    @staticmethod
    def _end(conn: sa.Connection, record: Record, end: datetime, reason: str) -> Record:
        conn.execute(
            allocations.update()
            .where(allocations.c.id == record.id, allocations.c.ended_at.is_(None))
            .values(ended_at=end, end_reason=reason)
        )
        return replace(record, ended_at=end, end_reason=reason)

    # --- reading -------------------------------------------------------------------

    def open_allocations(self) -> list[Record]:
        """Every allocation not yet closed, oldest first."""
        with self._db("reading the open allocations"), self.engine.connect() as conn:
            return self._select(conn, allocations.c.ended_at.is_(None))

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
        since, until = self._range(since, until, until_default=None)
        where = self._overlapping(since, until)
        if user is not None:
            where.append(allocations.c.username == user)
        if device is not None:
            where.append(
                allocations.c.id.in_(
                    sa.select(allocation_devices.c.allocation_id).where(allocation_devices.c.uuid == device)
                )
            )
        with self._db("reading the allocation history"), self.engine.connect() as conn:
            return self._select(conn, *where)

    def usage(self, since: datetime | None = None, until: datetime | None = None, by: str = "user") -> list[Usage]:
        """GPU-hours per user (``by="user"``) or per model (``by="model"``) within
        [since, until] (since None: from the first allocation; until None: now).

        Each allocation counts (its overlap of [started_at, ended_at or now] with the
        range, in hours) × (the sum of its shares, in GPUs). Largest first; allocations without
        GPUs count nothing and keys without GPU-hours are left out."""
        a, d = allocations, allocation_devices
        keys = {"user": a.c.username, "model": a.c.model}
        if by not in keys:
            raise ValueError(f"usage by {by!r}: use one of {', '.join(keys)}")
        now = _now()
        since, until = self._range(since, until, until_default=now)
        # One row per allocation with its summed shares (the inner join drops those
        # without GPUs); the overlap is computed here, alike for every backend.
        query = (
            sa.select(keys[by], a.c.started_at, a.c.ended_at, sa.func.sum(d.c.milli))
            .join_from(a, d, d.c.allocation_id == a.c.id)
            .where(*self._overlapping(since, until))
            .group_by(a.c.id, keys[by], a.c.started_at, a.c.ended_at)
        )
        totals: dict[str, float] = {}
        with self._db("computing GPU usage"), self.engine.connect() as conn:
            for key, started, ended, milli in conn.execute(query):
                hours = hours_within(started, ended or now, since, until) * (milli / UNIT)
                if hours > 0:
                    totals[key] = totals.get(key, 0.0) + hours
        return [Usage(k, h) for k, h in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))]

    @staticmethod
    def _overlapping(since: datetime | None, until: datetime | None) -> list:
        """Conditions for allocations that overlap [since, until] (None: unbounded)."""
        where = []
        if since is not None:
            where.append(sa.or_(allocations.c.ended_at.is_(None), allocations.c.ended_at > since))
        if until is not None:
            where.append(allocations.c.started_at < until)
        return where

    @staticmethod
    def _range(since, until, until_default):
        since, until = _utc(since, "since"), _utc(until, "until") or until_default
        if since is not None and until is not None and since > until:
            raise ValueError(f"since ({since.isoformat()}) is after until ({until.isoformat()})")
        return since, until

    # --- plumbing ------------------------------------------------------------------

    @contextmanager
    def _db(self, doing: str) -> Iterator[None]:
        """Prepare the tables if needed; turn any database failure into one LedgerError."""
        try:
            self._ensure_schema()
            yield
        except sa_exc.SQLAlchemyError as e:
            why = _scrub(_first_line(e), self._secrets)
            raise LedgerError(f"GPU ledger database {self.url}: {doing} failed: {why}") from None

    def _ensure_schema(self) -> None:
        if self._schema_ready:
            return
        with self._schema_lock:
            if not self._schema_ready:
                from .ledger_migrations import MigrationError, upgrade  # alembic loads only when needed

                try:
                    upgrade(self.engine, self.url)
                except MigrationError as e:
                    raise LedgerError(_scrub(str(e), self._secrets)) from None
                self._schema_ready = True

    @staticmethod
    def _open_record(conn: sa.Connection, service: str) -> Record | None:
        found = Ledger._select(conn, allocations.c.service == service, allocations.c.ended_at.is_(None))
        return found[-1] if found else None

    @staticmethod
    def _select(conn: sa.Connection, *where) -> list[Record]:
        a, d = allocations, allocation_devices
        rows = conn.execute(
            sa.select(a, d.c.uuid, d.c.milli)
            .select_from(a.outerjoin(d, d.c.allocation_id == a.c.id))
            .where(*where)
            .order_by(a.c.started_at, a.c.id, d.c.position)
        )
        found: dict[int, tuple] = {}  # id: (row, its devices, their shares)
        for row in rows:
            _, uuids, milli = found.setdefault(row.id, (row, [], []))
            if row.uuid is not None:  # an allocation without GPUs has no device rows
                uuids.append(row.uuid)
                milli.append(row.milli)
        return [
            Record(
                id=row.id,
                devices=tuple(uuids),
                milli=tuple(milli),
                tasks=_split_tasks(row.tasks),
                **{field: getattr(row, column) for field, column in _COLUMNS.items()},
            )
            for row, uuids, milli in found.values()
        ]
