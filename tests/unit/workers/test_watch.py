"""`workers.watch`: a follow tick over a real run directory of a local target, over
fakeredis. A dead job's `exit_code` is its end, except while a cancel of its run is
under way: the job may have forged it before the kill, and the cancel records the
end from its own reading once its `cancelled` marker is written."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from schemas import JobId, RunState
from workers.stops import CANCEL_RETRY_S, cancel_key
from workers.watch import watch_target

from .conftest import policy_worker, running_run


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


@pytest.mark.parametrize("cancelling", [False, True])
def test_an_exit_code_during_a_cancel_is_left_to_the_cancel(
    tmp_path: Path, cancelling: bool
) -> None:
    ctx, store, _ = policy_worker(tmp_path)
    run = running_run(store, tmp_path, "r1", job=JobId(dir=str(tmp_path / "r1"), pid=dead_pid()))
    (tmp_path / "r1" / "exit_code").write_text("0\n")
    if cancelling:
        assert store.once(cancel_key(run.id), ttl_s=CANCEL_RETRY_S)
    found = watch_target(ctx, "local", datetime.now(UTC))
    after = store.get_run(run.id)
    if cancelling:
        assert found["ended"] == 0
        assert after.state is RunState.RUNNING
        assert store.followed("local") == [run.id]
        # The cancel's own reading: `cancelled` wins over any `exit_code`.
        (tmp_path / "r1" / "cancelled").touch()
        store.forget(cancel_key(run.id))
        watch_target(ctx, "local", datetime.now(UTC))
        assert store.get_run(run.id).state is RunState.CANCELLED
    else:
        assert found["ended"] == 1
        assert after.state is RunState.SUCCEEDED
