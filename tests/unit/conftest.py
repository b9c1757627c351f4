"""What the unit tests of several packages share: a run's record as the policies,
the resume check, the store's transitions and the worker's operations see it (a
running run, started at `T0`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from schemas import JobId, RunRecord, RunState

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def record(**changes: Any) -> RunRecord:
    base: dict[str, Any] = {
        "id": "r1",
        "target": "local",
        "created": T0 - timedelta(minutes=5),
        "started": T0,
        "remote_dir": "/tmp/x/r1",
        "job": JobId(dir="/tmp/x/r1", pid=4242),
        "state": RunState.RUNNING,
        "command": "true",
    }
    base.update(changes)
    return RunRecord(**base)
