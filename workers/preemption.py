"""Preemption notices at launch: which cloud a run's notice watcher watches (the run's
`--preemption`, else its target's), and what its `JobCommand` carries for it (the
cloud, the metadata services' base URLs and the poll period, from the settings).
What the follow does with the watcher's files is `workers/watch.py`."""

from __future__ import annotations

from typing import Any

from schemas import Preemption, RunRecord, TargetConfig
from schemas.events import LaunchSpec
from schemas.preemption import watched_cloud

from .context import Context

__all__ = ["notice_command", "watched"]


def watched(spec: LaunchSpec, target: TargetConfig) -> Preemption | None:
    """The preemption watch `spec` asks for, to record with its run: the run's own
    mode when it gave one, else its `target`'s (`TargetConfig.preemption`); None for
    `off`, and for a job that does not read snapshot requests (nothing would answer
    the watcher's request)."""
    if not spec.snapshots:
        return None
    cloud = watched_cloud(spec.preemption, target.preemption)
    return None if cloud is None else Preemption(cloud=cloud)


def notice_command(ctx: Context, run: RunRecord) -> dict[str, Any]:
    """The `JobCommand` fields that start the notice watcher of `run` (empty when its
    record asks for none): the cloud, every metadata base URL and the poll period of
    the settings (`RUNWARDEN_METADATA_*_URL`, `RUNWARDEN_NOTICE_POLL_S`)."""
    if run.preemption is None or run.preemption.cloud is None:
        return {}
    return {
        "preemption": run.preemption.cloud,
        "metadata_urls": ctx.settings.metadata_urls,
        "notice_poll_s": ctx.settings.notice_poll_s,
    }
