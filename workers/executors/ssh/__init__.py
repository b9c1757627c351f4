"""`SshExecutor`: the executor contract over SSH (paramiko), with the same shared
scripts as the local executor.

- One connection per destination and process, from a pool that a forked child
  never inherits (a Celery prefork child opens its own), with keepalives; a dead
  connection is detected and re-opened, and idempotent operations are retried once.
- Small operations run on persistent remote `sh` processes (one round trip, no
  session setup); `spawn` and transfers use their own exec channels.
- Host keys are checked strictly against known_hosts (hashed entries and the
  `[host]:port` form too); an unknown and a changed key are distinct errors; a key
  is never added. Keys come from files and the agent; nothing ever prompts.
- Every failure is an `ExecError`; paramiko and socket errors are translated.
- A target whose jobs run as another user (`run_as`) runs every script as that user
  through `sudo -n` ([`SshTransport`]) but those that decide a job's state, which run
  as the login user, whom no job can pause, kill or answer for: whether a job's
  leader still runs (`sh/leaders.sh`), the status of the jobs it does not find
  running, and the follow tick of every run of the target. They read the run
  directories as any other user may (the jobs' umask leaves them readable; a job
  that hides its files hides them from its own follow only).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from schemas import JobCommand, JobId

from .. import scripts
from ..errors import CommandError, ExecError
from ..scripts.common import sh
from ..shell import ScriptExecutor
from ..transport import DEFAULT_TIMEOUT_S, Completed, error_line
from .config import SshDestination, resolve_destination
from .connection import CLIENT_REKEY_BYTES, MAX_SHELLS, WINDOW_SIZE, SshConnection, connection_pool
from .transport import SshTransport

__all__ = [
    "CLIENT_REKEY_BYTES",
    "MAX_SHELLS",
    "WINDOW_SIZE",
    "SshConnection",
    "SshDestination",
    "SshExecutor",
    "SshTransport",
    "connection_pool",
    "resolve_destination",
]


EMPTY_CGROUP_AGE_MIN = 1
"""How old, in minutes, an empty run cgroup on a target must be before a release there
removes it: a launcher enters its cgroup within milliseconds of making it."""


class SshExecutor(ScriptExecutor):
    """Runs jobs in run directories under `workdir` on the SSH target `destination`.

    A remote job gets the SSH server's non-interactive environment (no login shell,
    no startup file), then its `env`, then its secrets, which travel on the
    launcher's standard input only. With `run_as`, jobs and scripts run as that user
    (see the module docstring); a job then starts from the user's least environment
    (`schemas.protocol.user_environment`), then its `env` and secrets."""

    def __init__(
        self, destination: SshDestination, workdir: str, run_as: str | None = None
    ) -> None:
        """
        Raises:
            InvalidArgument: for a `run_as` that is no user name.
        """
        self.destination = destination
        self._ssh = SshTransport(destination, run_as=run_as)
        self._base_lock = threading.Lock()
        self._base: tuple[str | None, str] | None = None
        super().__init__(self._ssh, workdir)

    def cgroup_base(self) -> tuple[str | None, str]:
        """Where runs of this target get their cgroups (`<base>/runwarden/<mark>`, which
        the launcher makes and enters as the login user), or None and why not, for
        people: asked of the target once (`sh/cgroup_base.sh`: the cgroup v2 mount for
        a root login, else the login's own cgroup when delegated to it), then kept.
        For a target whose jobs run as another user, the login makes the cgroup, gives
        the user its `cgroup.procs` and `cgroup.kill` and enters it before the change
        of user ([`spawn`]): a root login by `chown`, one that is not root by `chgrp`
        to the user's primary group and its write bit, so such a login must be a
        member of that group, a group of the user's own (the script checks it and
        says how to set it up). Never raises: a target that cannot be asked gets
        none, and is asked again next time."""
        with self._base_lock:
            if self._base is not None:
                return self._base
            user = () if self._ssh.run_as is None else (self._ssh.run_as,)
            try:
                result = self._ssh.run(
                    sh("cgroup_base"), action="cgroup", timeout_s=30, args=user, control=True
                )
            except ExecError as error:
                return None, f"the target could not be asked ({error})"
            text = result.stdout.decode("utf-8", "replace").strip()
            if result.exit_code == 0 and text.startswith("/") and "\n" not in text:
                self._base = (text, "")
            else:
                self._base = (None, error_line(result.stderr, result.exit_code))
            return self._base

    @property
    def run_as(self) -> str | None:
        """The user the jobs run as, None: the login user."""
        return self._ssh.run_as

    def spawn(self, job: JobCommand) -> JobId:
        """As [`ScriptExecutor.spawn`]; a contained job of a target whose jobs run as
        another user enters its cgroup as the login user before the change of user
        ([`SshTransport.entering`]): the user may move no process out."""
        if job.cgroup is None or self._ssh.run_as is None:
            return super().spawn(job)
        with self._ssh.entering(job.cgroup):
            return super().spawn(job)

    def cancel(self, job: JobId) -> None:
        """As [`ScriptExecutor.cancel`]. For a contained job of a target whose jobs run
        as another user, a cancel script cut short (a job of the user's may find it in
        `/proc`, pause or kill it) does not end the cancel: the login user (root, or
        the owner of the run's cgroup under its delegated one) kills the run's cgroup
        (`cgroup.kill`: everything of the job, what fought the script included) and
        the user's cancel runs again, which records it.

        Raises:
            ExecError: as [`ScriptExecutor.cancel`]; `CommandError` when the login's
                kill left a process in the cgroup.
        """
        if self._killed_instead(job, super().cancel):
            super().cancel(job)
        self._remove_cgroup(job)

    def release(self, job: JobId) -> None:
        """As [`ScriptExecutor.release`]; for a contained job of a target whose jobs
        run as another user, a release cut short is finished by the login user, who
        kills the run's cgroup, as for a cancel."""
        self._killed_instead(job, super().release)
        self._remove_cgroup(job)

    def _killed_instead(self, job: JobId, step: Callable[[JobId], None]) -> bool:
        """Runs the user's `step` of `job`; when it fails on a contained job of a target
        whose jobs run as another user, kills the run's cgroup as the login user
        instead (`sh/release.sh` with the cgroup alone) and returns True (False: the
        step did it). Raises the step's error otherwise."""
        try:
            step(job)
        except ExecError as error:
            if job.cgroup is None or self._ssh.run_as is None:
                raise
            script = scripts.release_script(job.model_copy(update={"mark": None}))
            result = self._ssh.run(script.text, action="release", args=script.args, control=True)
            if result.exit_code != 0:
                why = error_line(result.stderr, result.exit_code)
                raise CommandError("cancel", why) from error
            return True
        return False

    def _remove_cgroup(self, job: JobId) -> None:
        # The login user removes the emptied cgroup (the jobs' user of a run-as target
        # ended it but may not), and the old empty ones beside it that a run's end cut
        # short left: `reconcile` removes those on the worker's own machine only.
        # Never the cancel's or release's failure: what it leaves, the next run's end
        # there removes.
        if job.cgroup is None:
            return
        args = (job.cgroup, str(EMPTY_CGROUP_AGE_MIN))
        with contextlib.suppress(ExecError):
            self._ssh.run(sh("cgroup_remove"), action="release", args=args, control=True)

    def _live(self, jobs: Sequence[JobId]) -> list[bool]:
        if self._ssh.run_as is None:
            return super()._live(jobs)
        known = [job for job in jobs if job.start is not None]
        if not known:
            return [False] * len(jobs)
        script = scripts.leaders_script(known)
        result = self._ssh.run(script.text, action="status", args=script.args, control=True)
        if result.exit_code != 0:
            raise CommandError("status", error_line(result.stderr, result.exit_code))
        answers = iter(scripts.parse_leaders(result.stdout, len(known)))
        return [job.start is not None and next(answers) for job in jobs]

    def _deciding(
        self, script: scripts.Script, action: str, timeout_s: float | None = DEFAULT_TIMEOUT_S
    ) -> Completed:
        # As the login user when jobs run as another: no process of the jobs' user can
        # pause, kill or write into the follow of every run of the target, nor the
        # status of an ended job (a job that makes its files unreadable to the login
        # user blinds its own follow only).
        if self._ssh.run_as is None:
            return super()._deciding(script, action, timeout_s)
        # rw_others: liveness by /proc where `kill -0` cannot tell (group.sh).
        text = f"rw_others=1\n{script.text}"
        return self._ssh.run(
            text, action=action, timeout_s=timeout_s, args=script.args, control=True
        )

    @classmethod
    def connect(
        cls,
        text: str,
        workdir: str,
        *,
        port: int | None = None,
        identity: Path | None = None,
        known_hosts: Path | None = None,
        ssh_config: Path | None = None,
        run_as: str | None = None,
    ) -> SshExecutor:
        """An executor for the destination `text` (see `resolve_destination`) whose jobs
        run as `run_as` (None: the login user); opens nothing yet.

        Raises:
            InvalidArgument: for a malformed destination or config, or `run_as`.
        """
        destination = resolve_destination(
            text, port=port, identity=identity, known_hosts=known_hosts, ssh_config=ssh_config
        )
        return cls(destination, workdir, run_as=run_as)
