"""`workers.doctor`: the report on a target through the worker's own executor of it,
over a fakeredis store (the task through real Redis and Celery, and the CLI:
tests/integration/service/test_doctor.py)."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from pathlib import Path

import pytest

from schemas import UnknownTarget
from schemas.auth import Unauthenticated
from workers.doctor import doctor

from ...conftest import put_signed_target
from .conftest import policy_worker

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_local_target_as_this_worker_sees_it(tmp_path: Path) -> None:
    ctx, _, sent = policy_worker(tmp_path)
    report = doctor(ctx, "local", NOW)
    assert (report.target, report.kind, report.workdir) == ("local", "local", str(tmp_path))
    assert report.worker == "w"
    assert report.checked_at == NOW
    assert [c.name for c in report.checks][:3] == ["sh", "setsid", "tar"]
    assert [c.name for c in report.checks][-3:] == ["clock", "cgroup", "job-user"]
    # Root, on this machine's cgroup v2 hierarchy: each run in a cgroup of its own.
    assert report.checks[-2].status == "ok", report.checks[-2]
    # Its jobs run as root, the worker's user, as the target says: said plainly.
    job_user = report.checks[-1]
    assert job_user.status == "warn"
    assert job_user.found == "jobs run as root, as the target says (`--run-as root`)"
    assert "`--run-as USER`" in job_user.breaks
    assert report.clock is not None
    assert report.clock.worst_s < 2.0  # the same machine's clock
    assert report.missing == ()
    assert report.exit_code == 0
    assert sent.calls == []  # a check sends nothing


def test_a_root_worker_s_local_target_that_does_not_say_whose_jobs_is_missing(
    tmp_path: Path,
) -> None:
    ctx, store, _ = policy_worker(tmp_path)
    config = {"name": "silent", "kind": "local", "workdir": str(tmp_path)}
    put_signed_target(store, ctx.settings, config)
    report = doctor(ctx, "silent", NOW)
    assert [c.name for c in report.missing] == ["job-user"]
    found = "none: jobs would run as root, and the target does not say so"
    assert report.missing[0].found == found
    assert report.exit_code == 1


def test_the_disk_policys_limit_is_the_workers(tmp_path: Path) -> None:
    ctx, _, _ = policy_worker(tmp_path, disk_used_fraction=1e-6)
    disk = {c.name: c for c in doctor(ctx, "local", NOW).checks}["disk"]
    assert disk.status == "warn"
    assert "disk policy" in disk.breaks


def test_an_unknown_target_is_refused(tmp_path: Path) -> None:
    ctx, _, _ = policy_worker(tmp_path)
    with pytest.raises(UnknownTarget):
        doctor(ctx, "nowhere", NOW)


def test_a_target_not_signed_by_the_operator_is_never_used(tmp_path: Path) -> None:
    ctx, store, _ = policy_worker(tmp_path)
    store.targets.put("forged", {"name": "forged", "kind": "local", "workdir": "/"}, "00" * 32)
    with pytest.raises(Unauthenticated):
        doctor(ctx, "forged", NOW)


def test_a_run_as_user_this_machine_lacks_is_a_missing_access(tmp_path: Path) -> None:
    ctx, store, _ = policy_worker(tmp_path)
    config = {"name": "as", "kind": "local", "workdir": str(tmp_path), "run_as": "rwnosuchuser"}
    put_signed_target(store, ctx.settings, config)
    report = doctor(ctx, "as", NOW)
    assert [(c.name, c.status) for c in report.checks] == [("access", "missing")]
    assert "rwnosuchuser" in report.checks[0].found
    assert report.run_as == "rwnosuchuser"
    assert report.clock is None
    assert report.exit_code == 1


def test_an_ssh_target_that_refuses_connections_is_a_missing_access(tmp_path: Path) -> None:
    ctx, store, _ = policy_worker(tmp_path)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    ssh = {"destination": f"nobody@127.0.0.1:{closed_port()}", "known_hosts": str(known_hosts)}
    config = {"name": "gone", "kind": "ssh", "workdir": "/w", "ssh": ssh}
    put_signed_target(store, ctx.settings, config)
    report = doctor(ctx, "gone", NOW)
    assert [(c.name, c.status) for c in report.checks] == [("access", "missing")]
    assert "every operation" in report.checks[0].breaks
    assert report.exit_code == 1
