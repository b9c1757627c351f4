"""`runwarden doctor TARGET`, the worker's part: check a target through this worker's
own executor of it, and answer a `schemas.doctor.DoctorReport`.

Why a task a worker runs, not a check the CLI makes itself: the CLI may run on
another machine than the workers, and even beside them it is not what acts on
targets. The SSH keys, known_hosts, agent and ssh config, the sudo rule or root that
runs jobs as another user, the `PATH` a local job inherits and the clock deadlines
are measured against are all the worker's. A check made anywhere else could pass
where every launch then fails, or fail where launches work. So the producer sends
`runwarden.doctor` (signed, like every task), and the worker that takes it checks the
target exactly as it will launch, follow, stop and retrieve there; the report names
that worker. With several worker machines, another one may see the target otherwise:
run the doctor where the runs go (every worker consumes the `runwarden` queue).

The check is read-only but for the probe's own scratch directory, which it removes
(`workers/executors/scripts/doctor.py`); building a local target's executor makes
its workdir, as the first operation on that target would anyway.
"""

from __future__ import annotations

import os
from datetime import datetime

from schemas import TargetConfig
from schemas.doctor import DoctorCheck, DoctorReport
from schemas.text import error_line

from .cgroups import CGROUP_PARENT, RemoteBase, cgroup_base, containment
from .context import Context
from .executors import ExecError
from .permits import root_unsaid

__all__ = ["doctor"]


def _remote_base(executor: object) -> str | None:
    return executor.cgroup_base()[0] if isinstance(executor, RemoteBase) else None


def _containment_check(config: TargetConfig, ctx: Context, executor: object) -> DoctorCheck:
    """Whether this worker contains each run of the target in a cgroup of its own
    (`workers.cgroups`), or why not, and what that leaves open."""
    why = containment(config, ctx.settings, executor)
    if why is None and config.kind != "local":
        remote = _remote_base(executor)
        return DoctorCheck(
            name="cgroup",
            status="ok",
            found=f"a cgroup v2 per run under {remote}/{CGROUP_PARENT}, made by the login user",
            breaks="",
        )
    if why is None:
        base = cgroup_base()
        found = f"a cgroup v2 per run under {base}/{CGROUP_PARENT}"
        if os.geteuid() != 0:
            found += (
                " (the worker's own cgroup, delegated to its user: a job of that user "
                "may move itself out; --run-as with a root worker keeps it in)"
            )
        return DoctorCheck(name="cgroup", status="ok", found=found, breaks="")
    return DoctorCheck(
        name="cgroup",
        status="warn",
        found=f"none: {why}",
        breaks=(
            "containment: a process of a run that leaves its session and clears its "
            "environment (`setsid env -i`) outlives the run's cancel"
        ),
    )


def _job_user_check(config: TargetConfig) -> DoctorCheck:
    """Whether the target's jobs run as a user of their own (`run_as`), out of reach
    of the worker's files and environment; what is left open when not
    (docs/security.md)."""
    if config.jobs_as_root:
        return DoctorCheck(
            name="job-user",
            status="warn",
            found="jobs run as root, as the target says (`--run-as root`)",
            breaks=(
                "protection against a hostile job: it can read and do anything the "
                "worker can; give the target `--run-as USER`"
            ),
        )
    if config.run_as is not None:
        who = "the login user, through sudo -n" if config.kind == "ssh" else "the worker's user"
        found = f"jobs run as {config.run_as}, not as {who}"
        return DoctorCheck(name="job-user", status="ok", found=found, breaks="")
    if config.kind == "ssh":
        found = "none: jobs run as the SSH login user, as the worker's scripts there do"
        breaks = (
            "protection against a hostile job: it can pause, kill or write into the "
            "scripts the worker runs on the target, and read what the login user can"
        )
    elif root_unsaid(config):
        return DoctorCheck(
            name="job-user",
            status="missing",
            found="none: jobs would run as root, and the target does not say so",
            breaks=(
                "every launch on this target (refused): give it `--run-as USER`, a user "
                "of their own, or `--run-as root` to accept that"
            ),
        )
    else:
        found = "none: jobs run as the worker's user"
        breaks = (
            "protection against a hostile job: it can read the worker's environment and "
            "files (the Redis password, the producers' keys, the secrets) and pause or kill "
            "the scripts the worker runs; give the target `--run-as USER`"
        )
    return DoctorCheck(name="job-user", status="warn", found=found, breaks=breaks)


def doctor(ctx: Context, target: str, now: datetime) -> DoctorReport:
    """The report on `target` (checked at `now`): every check of `Executor.doctor`,
    or, when the target cannot be reached (its executor cannot be built: a `run_as`
    user this machine lacks; the SSH connection or login fails; the change of user is
    refused), one `access` check, missing, saying why.

    Raises:
        UnknownTarget: when there is no such target.
        Unauthenticated: when its record is not signed by the operator.
        StoreError: when the store cannot be read.
    """
    config = ctx.target(target)
    try:
        findings = ctx.executor(target).doctor(disk_used_fraction=ctx.settings.disk_used_fraction)
        checks, clock = findings.checks, findings.clock
        if config.slurm is not None:
            # Slurm contains its jobs: the executor's `containment` check says how well.
            checks = (*checks, _job_user_check(config))
        else:
            containment_check = _containment_check(config, ctx, ctx.executor(target))
            checks = (*checks, containment_check, _job_user_check(config))
    except ExecError as error:
        found = error_line(error)[:500]
        checks = (
            DoctorCheck(
                name="access",
                status="missing",
                found=found,
                breaks="every operation on this target: the worker cannot run anything there",
            ),
        )
        clock = None
    return DoctorReport(
        target=config.name,
        kind=config.kind,
        workdir=config.workdir,
        run_as=config.run_as,
        worker=ctx.worker_id,
        checked_at=now,
        checks=checks,
        clock=clock,
    )
