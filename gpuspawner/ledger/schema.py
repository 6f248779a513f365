"""The ledger's tables, as the migrations in ``ledger_migrations`` create them, and
:class:`Record`, one allocation read back from them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import sqlalchemy as sa

from ..core.sharing import UNIT

NAME_MAX = 255
TASKS_MAX = 64  # task ids kept per allocation (the newest)
TIMEZONE_MAX = 64  # characters of a reservation's time zone name


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
    sa.Column("service", sa.String(NAME_MAX), nullable=False),
    sa.Column("username", sa.String(NAME_MAX), nullable=False),
    sa.Column("server", sa.String(NAME_MAX), nullable=False),  # "": the default server
    sa.Column("host", sa.String(NAME_MAX), nullable=False),
    sa.Column("model", sa.String(NAME_MAX), nullable=False),  # "": no GPU
    sa.Column("started_at", UTCDateTime, nullable=False),
    sa.Column("ended_at", UTCDateTime, nullable=True),  # NULL: still open
    sa.Column("end_reason", sa.Text, nullable=False),
    sa.Column("tasks", sa.Text, nullable=False, server_default=""),  # swarm task ids, comma-separated
    sa.Column("peak_memory_mib", sa.Integer, nullable=True),  # its processes' most GPU memory; NULL: not reported
    # What the service reserved on its host besides GPUs (0008; NULL: not recorded, rows from before):
    sa.Column("reserved_cpu_milli", sa.Integer, nullable=True),  # CPU, thousandths of a core
    sa.Column("reserved_memory_mib", sa.Integer, nullable=True),  # memory, MiB
    sa.Column("accepted_models", sa.Text, nullable=True),  # the models its request accepted: a JSON list, [] any
    # How it stood against the quotas when granted (0009; both NULL: no quota of its model, or rows from before):
    sa.Column("quota_group", sa.Text, nullable=True),  # the group whose quota it drew on; NULL: none
    sa.Column("borrowed", sa.Boolean, nullable=True),  # beyond that quota (or in none)
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
    sa.Column("uuid", sa.String(NAME_MAX), nullable=False),
    sa.Column("milli", sa.Integer, nullable=False),  # thousandths: 1000 is the whole device
    sa.Index("gpuspawner_allocation_devices_uuid", "uuid"),
)

# One node agent's token per host: only its SHA-256 (gpuspawner.core.agent_tokens).
agent_tokens = sa.Table(
    "gpuspawner_agent_tokens",
    metadata,
    sa.Column("host", sa.String(NAME_MAX), primary_key=True),
    sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("issued_at", UTCDateTime, nullable=False),
)

# Reservations: whole GPUs of a model kept for a group's members, once or
# every week (gpuspawner.core.reservations; starts_at/ends_at: the first window).
reservations = sa.Table(
    "gpuspawner_reservations",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(NAME_MAX), nullable=False, server_default=""),  # "": shown as the group's name
    sa.Column("group_name", sa.String(NAME_MAX), nullable=False),
    sa.Column("model", sa.String(NAME_MAX), nullable=False),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Column("starts_at", UTCDateTime, nullable=False),
    sa.Column("ends_at", UTCDateTime, nullable=False),
    sa.Column("weekly", sa.Boolean, nullable=False),
    sa.Column("lend", sa.Boolean, nullable=False, server_default=sa.false()),  # unused GPUs lent to others
    sa.Column("share_milli", sa.Integer, nullable=True),  # a share total in thousandths; NULL: whole GPUs
    sa.Column("repeat_until", UTCDateTime, nullable=True),  # weekly: no window starts at or after it
    sa.Column("timezone", sa.String(TIMEZONE_MAX), nullable=False),  # IANA: where a weekly window keeps its local time
    sa.Column("created_by", sa.String(NAME_MAX), nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sqlite_autoincrement=True,  # a removed reservation's id is not given again (as on PostgreSQL)
)


@dataclass(frozen=True)
class AgentToken:
    """A host's agent token as stored: its digest and when it was issued."""

    host: str
    token_sha256: str
    issued_at: datetime


# Record field: allocations column, for what is stored one to one.
COLUMNS = {
    "service": "service",
    "user": "username",
    "server": "server",
    "host": "host",
    "model": "model",
    "started_at": "started_at",
    "ended_at": "ended_at",
    "end_reason": "end_reason",
    "peak_memory_mib": "peak_memory_mib",
    "cpu_milli": "reserved_cpu_milli",
    "memory_mib": "reserved_memory_mib",
    "quota_group": "quota_group",
    "borrowed": "borrowed",
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
    peak_memory_mib: int | None = None  # the most GPU memory its processes used, as reported
    # What it reserved on its host besides GPUs (CPU thousandths, memory MiB) and the models
    # its request accepted (sorted; () any model); None: not recorded (an allocation written
    # before migration 0008, or a holding adopted from the cluster, whose models are not known).
    cpu_milli: int | None = None
    memory_mib: int | None = None
    accepts: tuple[str, ...] | None = None
    # How it stood against the quotas when granted (migration 0009): the group whose quota it
    # drew on, and whether it was beyond it; both None: no quota of its model, or not recorded.
    quota_group: str | None = None
    borrowed: bool | None = None

    @property
    def gpus(self) -> float:
        """How many GPUs' worth the allocation held (the sum of its shares), for reports."""
        return sum(self.milli) / UNIT

    def same_as(self, other: Record) -> bool:
        fields = ("user", "server", "host", "model", "devices", "milli")
        return all(getattr(self, f) == getattr(other, f) for f in fields)


def join_tasks(old: Sequence[str], new: Sequence[str]) -> tuple[str, ...]:
    """``old`` then the ids of ``new`` not in it, in order, without repeats; at most
    :data:`TASKS_MAX`, dropping the oldest (those replaced longest ago) first."""
    return tuple(dict.fromkeys((*old, *new)))[-TASKS_MAX:]


def split_tasks(text: str) -> tuple[str, ...]:
    """The ``tasks`` column's text as ids."""
    return tuple(text.split(",")) if text else ()


def join_models(models: Sequence[str] | None) -> str | None:
    """The ``accepted_models`` column's text for ``models`` (None: not recorded)."""
    return None if models is None else json.dumps(list(models))


def split_models(text: str | None) -> tuple[str, ...] | None:
    """The ``accepted_models`` column's text as models; None for NULL and for a text that
    is not a JSON list of strings (not recorded, rather than a reading that fails)."""
    if text is None:
        return None
    try:
        models = json.loads(text)
    except ValueError:
        return None
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        return None
    return tuple(models)
