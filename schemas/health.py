"""Service health, what is recorded: the heartbeat record workers and beat write, serve's
record, and what the store reads back ([`HealthReadings`]). The report `runwarden
status` shows and the rule that judges a reading are `schemas.health_report`.

Liveness is Redis's own: a process's heartbeat is a key written every
[`HEARTBEAT_INTERVAL_S`] with a time to live of [`HEARTBEAT_TTL_S`], so a process
killed without a word (SIGKILL, a lost machine) is seen gone at most that long after
its last heartbeat, whatever the clocks of the machines say. Every time here is unix
seconds on Redis's clock (`TIME`), so ages and lateness compare times taken on one
clock.

`runwarden serve` writes its own record ([`ServeState`], every [`SERVE_WRITE_S`], with a
time to live of [`SERVE_TTL_S`]): each process and thread it supervises, whether it
is up, how many times it was restarted and how it last ended. The report shows it
(`serve`); a child being restarted is a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from .events import (
    TASK_FOLLOW_TICK,
    TASK_POLICY_TICK,
    TASK_RECONCILE,
)
from .settings import Settings
from .stops import Deadline

__all__ = [
    "HEARTBEAT_BYTES",
    "HEARTBEAT_INTERVAL_S",
    "HEARTBEAT_KEPT_S",
    "HEARTBEAT_TTL_S",
    "PROCESSES_SHOWN",
    "SERVE_TTL_S",
    "SERVE_WRITE_S",
    "DeadlinesReading",
    "HealthReadings",
    "Heartbeat",
    "Role",
    "SeenProcess",
    "ServeChild",
    "ServeState",
    "periodic_tasks",
]

HEARTBEAT_INTERVAL_S: Final = 1.0
"""How often a worker's main process and beat write their heartbeat, in seconds."""
HEARTBEAT_TTL_S: Final = 3.0
"""How long a heartbeat lives, in seconds: a process is alive while its last
heartbeat does. Three intervals: two missed writes (a stalled thread, a slow Redis)
are forgiven; a killed process is seen gone at most 3 s after its last write."""
HEARTBEAT_KEPT_S: Final = 3600.0
"""How long a process whose heartbeat stopped without a shutdown (killed, lost) is
still listed, with the age of its last heartbeat, in seconds."""
HEARTBEAT_BYTES: Final = 4096
"""Most bytes of one heartbeat record read back."""
PROCESSES_SHOWN: Final = 100
"""Most processes of one role (workers, beats) read back, the latest seen first."""
SERVE_WRITE_S: Final = 2.0
"""How often `runwarden serve` writes its record, in seconds (and at once when one of
its children ends or starts)."""
SERVE_TTL_S: Final = 10.0
"""How long serve's record lives after its last write, in seconds: a serve that was
killed drops out of the report by then."""

Role = Literal["worker", "beat"]
_Name = Annotated[str, Field(min_length=1, max_length=255)]
_Seconds = Annotated[float, Field(allow_inf_nan=False)]


def periodic_tasks(settings: Settings) -> dict[str, float]:
    """Each task beat sends, with its period in seconds from `settings` (the entries
    of `workers.app`'s beat schedule, which a test holds to this)."""
    return {
        TASK_FOLLOW_TICK: settings.follow_poll_s,
        TASK_POLICY_TICK: settings.policy_s,
        TASK_RECONCILE: settings.reconcile_s,
    }


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Heartbeat(BaseModel):
    """One process's heartbeat, as JSON in the store (`store.health`). Extra fields are
    ignored: a heartbeat of a newer version still reads."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: _Name
    """A worker's node name (`runwarden@host`), beat's `beat@host`."""
    hostname: Annotated[str, Field(max_length=255)]
    pid: Annotated[int, Field(ge=1)]
    queues: Annotated[tuple[_Name, ...], Field(max_length=64)] = ()
    """The queues a worker consumes; empty for beat."""
    started: _Seconds | None = None
    """When its first heartbeat was written (Redis clock); set by the store."""
    at: _Seconds = 0.0
    """When this heartbeat was written (Redis clock); set by the store."""


class SeenProcess(_Model):
    """A process of one role that wrote a heartbeat in the last [`HEARTBEAT_KEPT_S`]."""

    name: _Name
    last_seen: _Seconds
    """Its last heartbeat (Redis clock)."""
    heartbeat: Heartbeat | None
    """Its live heartbeat; None when it lapsed (the process is gone)."""


ChildState = Literal["up", "restarting"]
_Text = Annotated[str, Field(max_length=200)]


class ServeChild(BaseModel):
    """One process or thread `runwarden serve` supervises, as serve wrote it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: _Name
    """`redis`, `worker`, `retrieval worker`, `watch worker`, `beat`, `flower`, `web
    view`, `metrics`."""
    pid: Annotated[int, Field(ge=1)] | None = None
    """Its process id; None for a thread of serve, or while it waits to be restarted."""
    state: ChildState = "up"
    """`restarting`: it ended and serve starts it again after a backoff."""
    restarts: Annotated[int, Field(ge=0)] = 0
    """How many times serve started it again since serve started."""
    last_end: _Text | None = None
    """How it last ended (`killed by SIGKILL`, `exited with code 1`); None if never."""
    last_end_ago_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    """Seconds between its last end and the write of the record."""


class ServeState(BaseModel):
    """The record `runwarden serve` writes (`store.health`). Extra fields are ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: _Name
    """`serve@host`."""
    hostname: Annotated[str, Field(max_length=255)]
    pid: Annotated[int, Field(ge=1)]
    children: Annotated[tuple[ServeChild, ...], Field(max_length=32)] = ()
    started: _Seconds | None = None
    """When its first record was written (Redis clock); set by the store."""
    at: _Seconds = 0.0
    """When this record was written (Redis clock); set by the store."""


class DeadlinesReading(_Model):
    pending: Annotated[int, Field(ge=0)]
    overdue: Annotated[int, Field(ge=0)]
    """Pending deadlines due at or before the reading."""
    next: Deadline | None
    """The earliest pending deadline (None when none, or when it is unreadable)."""


class HealthReadings(_Model):
    """What the store reads for a report, at one moment (`store.health`)."""

    now: _Seconds
    """Redis's clock at the reading."""
    used_memory: int | None
    """Redis's `used_memory`, bytes; None when Redis does not report it."""
    maxmemory: int | None
    """Redis's `maxmemory`, bytes (0: no limit); None when not reported."""
    workers: tuple[SeenProcess, ...]
    beats: tuple[SeenProcess, ...]
    ticks: Mapping[str, float]
    """Periodic task name -> when it last ran (Redis clock); a task never run is absent."""
    queues: Mapping[str, Mapping[int, int]]
    """Queue name -> priority step -> messages in that list of the broker."""
    unacked: Annotated[int, Field(ge=0)]
    """Messages delivered to a worker and not acknowledged yet (running tasks, and
    countdowns a worker holds until their time)."""
    deadlines: DeadlinesReading
    serves: tuple[ServeState, ...] = ()
    """The live records of `runwarden serve` (none when no serve runs, e.g. compose)."""
