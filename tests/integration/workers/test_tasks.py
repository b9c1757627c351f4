"""`workers.tasks` through the whole service (real redis-server, Celery workers and
beat, bench/harness/pipeline.py): a worker killed in the middle of a watch tick does not
stall that target's watch (the tick's lock is about as short as a tick)."""

from __future__ import annotations

import time
from pathlib import Path

from bench.harness.pipeline import Pipeline
from schemas import RunState

from ...conftest import wait_for
from ..service.test_faults import (  # noqa: F401 - fixtures
    launch,
    pipeline,
)


def kill_in_the_middle_of_a_tick(
    pipeline: Pipeline,  # noqa: F811
    name: str = "w1",
    tries: int = 5,
) -> None:
    """SIGKILLs worker `name` while it holds the watch tick lock of target `local`
    (restarting it and trying again when the kill came between two ticks)."""
    client = pipeline.redis.client()
    key = b"rw:lock:watch:local"
    try:
        for _ in range(tries):
            deadline = time.monotonic() + 10
            while not client.exists(key):
                assert time.monotonic() < deadline, "no watch tick in 10 s"
            pipeline.kill_worker(name)
            if client.pttl(key) > 0:
                return
            pipeline.start_worker(name)
            pipeline.wait_worker(name)
        raise AssertionError(f"never killed {name} in the middle of a tick in {tries} tries")
    finally:
        client.close()


# Regression (found by review, failed before its fix): a worker killed in the middle of a watch tick
# stalled that target's watch for a minute.
def test_a_worker_killed_in_the_middle_of_a_tick_does_not_stall_the_watch(
    pipeline: Pipeline,  # noqa: F811
) -> None:
    """After a worker died holding a target's tick lock, a fresh worker still picks
    up a request written by someone else once the dead worker's tick lock lapsed (the
    follow script's deadline and a second), within a tick."""
    settings = pipeline.api.settings
    run_id = launch(pipeline, "--ignore-requests")
    pipeline.wait_step(run_id, 2)
    kill_in_the_middle_of_a_tick(pipeline)
    pipeline.start_worker("w2")
    pipeline.wait_worker("w2")
    run_dir = Path(pipeline.api.get_run(run_id).remote_dir)
    (run_dir / "snapshot.request").write_text("deadline")
    limit = settings.follow_timeout_s + 1.0 + settings.follow_poll_s + 3.0
    wait_for(lambda: pipeline.api.get_stop(run_id) is not None, timeout_s=limit)
    run = pipeline.wait_state(run_id, timeout_s=40)
    assert run.state is RunState.CANCELLED, run
