"""A local target whose jobs run as another user (`TargetConfig.run_as`), so a job
cannot read what the worker holds: its environment (`/proc/<pid>/environ`: secrets,
the Redis URL), its files, the embedded Redis's socket (mode 0700, the worker's).

What runs as whom (docs/protocol.md, "Jobs run as another user"):

- As the job's user, every script that touches a run directory, each started by
  [`RunAsTransport`] behind a change of user: claim, upload (the unpacking `tar`),
  spawn (the launcher, and so the job's wrapper and everything under it, and the
  on-target watchdog), status and follow (a worker that is not root), reads,
  `put_file` (`snapshot.request`),
  manifest and download (the archiving `tar`), the disk probe, and cancel (which
  then signals the job's group and sweeps the processes carrying the run's mark as
  their owner). The command in front of `sh`:

      worker is root:      setpriv --reuid=UID --regid=GID --init-groups --
                           (runuser -u USER -- where setpriv is missing)
      worker is not root:  sudo -n -u USER --
      worker is the user:  nothing

  followed by `env -i <the job user's environment> sh -c SCRIPT`.
- As the worker, nothing inside a run directory: when it is root, it creates the
  run directory in the workdir and gives it to the user (`fchown`) before the claim
  script runs; it makes a contained run's cgroup, gives the user its `cgroup.procs`
  and `cgroup.kill`, and the spawn's process enters the cgroup before its change of
  user (`sh/cgroup_enter.sh`); and when the user's cancel script of a contained run is
  cut short (a job of the user's can pause or kill it), it kills the cgroup itself
  and runs the user's cancel again ([`RunAsExecutor.cancel`]). Root never writes
  into a directory the job owns (a link the job put there could lead the write
  anywhere: `cancelling`, a temporary file). It reads there natively only what
  the follow needs: otherwise the worker gets what the job's user can read, through
  the user's scripts, a file the job made 0600 included. The follow tick and the
  status of a job not found running a root worker reads itself ([`rundir`]: through
  descriptors, no link followed, only regular files the user may read), so no process
  of the user can pause or kill the tick every run of the target depends on.

Apart from that, the worker's own Python code reads only the scripts' output; the
native fast paths of [`LocalExecutor`](local.LocalExecutor) are not used (a
`read_from` is a script too), and a script costs two more `exec`s (setpriv, env: a
few ms) or a `sudo` (some 15 ms).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from schemas import JobCommand, JobId, JobStatus, check_user_name
from schemas.protocol import RUN_AS_PATH, check_run_cgroup, user_environment

from . import scripts
from .doctor import DoctorOptions
from .errors import CommandError, ExecError, InvalidArgument, IoError, ProtocolError
from .rundir import Reader, follow_here, status_here
from .scripts.common import sh
from .scripts.follow import FollowEntry, FollowUpdate
from .shell import ScriptExecutor, check_remote
from .transport import SCRIPT_NAME, LocalTransport, error_line

__all__ = [
    "RUN_AS_KEPT",
    "RUN_AS_PATH",
    "JobUser",
    "RunAsExecutor",
    "RunAsTransport",
    "job_user",
    "run_as_environment",
]

RUN_AS_KEPT: Final = ("LANG", "LANGUAGE", "TZ")
"""The worker's variables a job run as another user keeps, when set, with every
`LC_*`: the locale and time zone, never a credential."""
_SYSTEM_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Where the programs that change user are looked for: never the worker's `PATH`."""
_READY_TIMEOUT_S: Final = 30.0
_KILL_WAIT_S: Final = 5.0
"""How long a cgroup killed by the worker may take to empty, in seconds."""

How = Literal["setpriv", "runuser", "sudo", "self"]


@dataclass(frozen=True)
class JobUser:
    """The user a target's jobs run as, from this machine's user database."""

    name: str
    uid: int
    gid: int
    home: str


def job_user(name: str) -> JobUser:
    """The user `name` of this machine.

    Raises:
        InvalidArgument: when `name` is not a user name (`schemas.check_user_name`),
            or no such user exists here.
    """
    try:
        check_user_name(name)
    except ValueError as error:
        raise InvalidArgument(str(error)) from error
    try:
        entry = pwd.getpwnam(name)
    except KeyError as error:
        raise InvalidArgument(f"no user {name!r} on this machine (run_as)") from error
    if entry.pw_uid == 0:
        raise InvalidArgument(f"user {name!r} is root: run_as protects nothing")
    return JobUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)


def run_as_environment(user: JobUser, worker_env: Mapping[str, str]) -> dict[str, str]:
    """The whole environment the launcher (and so the job, before its own variables and
    secrets) gets when run as `user`: [`user_environment`], and from `worker_env` only
    [`RUN_AS_KEPT`] and `LC_*`. Nothing else of the worker's, whatever its name."""
    env = user_environment(user.name, user.home)
    for name, value in worker_env.items():
        if name in RUN_AS_KEPT or name.startswith("LC_"):
            env[name] = value
    return env


def _program(name: str) -> str | None:
    return shutil.which(name, path=_SYSTEM_PATH)


def _change_of_user(
    user: JobUser, worker_is_root: bool, sudo: Sequence[str]
) -> tuple[list[str], How]:
    if os.geteuid() == user.uid:
        return [], "self"
    if worker_is_root:
        setpriv = _program("setpriv")
        if setpriv is not None:
            return [
                setpriv,
                f"--reuid={user.uid}",
                f"--regid={user.gid}",
                "--init-groups",
                "--",
            ], "setpriv"
        runuser = _program("runuser")
        if runuser is not None:
            return [runuser, "-u", user.name, "--"], "runuser"
        raise InvalidArgument(
            f"cannot run jobs as {user.name}: neither setpriv nor runuser (util-linux) is installed"
        )
    return [*sudo, "-n", "-u", user.name, "--"], "sudo"


def _worker_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


class RunAsTransport(LocalTransport):
    """A [`LocalTransport`] whose every script runs as `user` (the command in the
    module docstring), with [`run_as_environment`] as its whole environment (the
    program that changes user gets only that too), starting in `/`.

    Before its first script, and again after a failure, it checks that a script
    really runs as the user (`id -u`), so a missing sudo rule is one clear error, not
    the failure of whatever script came first. A script killed at its deadline is
    killed as the user too when it runs under sudo (this process may not signal it).
    """

    def __init__(
        self,
        user: JobUser,
        *,
        worker_is_root: bool,
        sudo: Sequence[str] = ("sudo",),
        worker_env: Mapping[str, str] | None = None,
    ) -> None:
        """`sudo` is the command that runs sudo (a test puts a change to the worker's
        user in front of it); `worker_env` the worker's environment (default: this
        process's), of which only the locale and time zone are kept.

        Raises:
            InvalidArgument: when no program can change to the user, or `env` or
                `sh` is missing.
        """
        env = run_as_environment(user, os.environ if worker_env is None else worker_env)
        change, how = _change_of_user(user, worker_is_root, sudo)
        env_program, sh_program = _program("env"), _program("sh")
        if env_program is None or sh_program is None:
            raise InvalidArgument("env and sh must be installed in /usr/bin or /bin")
        assignments = [f"{name}={value}" for name, value in env.items()]
        command = [*change, env_program, "-i", *assignments, sh_program]
        super().__init__(env=env, shell=command, cwd="/")
        self.user = user
        self._sh = sh_program
        self._entering = threading.local()
        self.how: How = how
        self._ready = False
        self._ready_lock = threading.Lock()

    @property
    def command(self) -> list[str]:
        """The command a script is given to after `-c`."""
        return list(self._shell)

    def _refusal(self, detail: str) -> CommandError:
        name = self.user.name
        if self.how == "sudo":
            worker = _worker_name()
            detail += (
                f"; a worker that is not root runs jobs as {name} through `sudo -n`: it"
                f" needs sudo and the sudoers line `{worker} ALL=({name}) NOPASSWD: ALL`"
                " (docs/security.md, Running jobs as another user)"
            )
        return CommandError(f"run as {name}", detail)

    def _ensure_ready(self) -> None:
        if self._ready:
            return
        with self._ready_lock:
            if self._ready:
                return
            try:
                proc = subprocess.run(
                    [*self._shell, "-c", sh("runas_id")],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    env=self._env,
                    cwd="/",
                    timeout=_READY_TIMEOUT_S,
                    start_new_session=True,
                    check=False,
                )
            except subprocess.TimeoutExpired as error:
                raise self._refusal(f"no answer within {_READY_TIMEOUT_S:.0f} s") from error
            except OSError as error:
                program = self._shell[0]
                raise self._refusal(f"cannot run {program}: {error.strerror}") from error
            answer = proc.stdout.decode("ascii", "replace").strip()
            if proc.returncode != 0:
                raise self._refusal(error_line(proc.stderr, proc.returncode))
            if answer != str(self.user.uid):
                raise self._refusal(f"a script ran as uid {answer[:20]!r}, not {self.user.uid}")
            self._ready = True

    @contextlib.contextmanager
    def entering(self, cgroup: str) -> Iterator[None]:
        """Within it, a script this thread starts first enters the cgroup `cgroup`
        (`sh/cgroup_enter.sh`, as this process: root) and only then changes to the
        user, so every process it starts is born in the cgroup, and the user, who may
        not move a process between cgroups, can take none out."""
        self._entering.cgroup = cgroup
        try:
            yield
        finally:
            self._entering.cgroup = None

    def _popen(
        self,
        script: str,
        *,
        stdin: int,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        prefix: Sequence[str] = (),
    ) -> subprocess.Popen[bytes]:
        self._ensure_ready()
        cgroup = getattr(self._entering, "cgroup", None)
        if cgroup is not None:
            enter = sh("cgroup_enter")
            prefix = [*prefix, self._sh, "-c", enter, "rw-cgroup-enter", f"{cgroup}/cgroup.procs"]
        return super()._popen(script, stdin=stdin, env=env, args=args, prefix=prefix)

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.returncode is None and self.how == "sudo":
            # sudo keeps the script in sudo's own process group (pgid: sudo's pid, held
            # while sudo is not reaped), where only the user may signal the script.
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [*self._shell, "-c", sh("runas_kill"), SCRIPT_NAME, str(proc.pid)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=self._env,
                    cwd="/",
                    timeout=10,
                    start_new_session=True,
                    check=False,
                )
        super()._kill(proc)


class RunAsExecutor(ScriptExecutor):
    """A local target whose jobs run as the user `user` (see the module docstring):
    every operation is a shared script run as that user by a [`RunAsTransport`].

    The worker as root creates `workdir` when missing (its own, mode from the
    umask) and hands each run directory to the user at its claim. A worker that is
    not root needs a sudo rule for the user, and `workdir` must be the user's to
    write (the claim creates run directories as the user).

    `worker_is_root` (default: this process's effective uid is 0) and `sudo` are for
    tests, which act as a worker that is not root.

    A live job's status is read by the worker itself, never by a script of the
    user's ([`ScriptExecutor.statuses`]): another process of the user cannot report it
    ended, nor hold its status up.
    """

    ON_THIS_MACHINE = True

    def __init__(
        self,
        workdir: Path | str,
        user: str,
        *,
        worker_is_root: bool | None = None,
        sudo: Sequence[str] = ("sudo",),
    ) -> None:
        """
        Raises:
            InvalidArgument: for a bad or unknown user, no way to change to it, or a
                workdir that is not absolute.
            IoError: when the worker, as root, cannot create `workdir`.
        """
        job = job_user(user)
        root = os.geteuid() == 0 if worker_is_root is None else worker_is_root
        base = check_remote(str(workdir))
        if root:
            try:
                Path(base).mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise IoError(base, error) from error
        self._user = job
        self._reader = Reader(job.uid, frozenset(os.getgrouplist(job.name, job.gid)))
        self._hand_over = root and os.geteuid() != job.uid
        self._runas = RunAsTransport(job, worker_is_root=root, sudo=sudo)
        super().__init__(self._runas, base)

    @property
    def user(self) -> JobUser:
        """The user the jobs run as."""
        return self._user

    def _doctor_options(self) -> DoctorOptions:
        # A worker that is root makes each run directory itself: the workdir need
        # not be the job's user's to write.
        return DoctorOptions(job_writes_workdir=not self._hand_over)

    def spawn(self, job: JobCommand) -> JobId:
        """As [`ScriptExecutor.spawn`]; a job with a cgroup (`JobCommand.cgroup`) is
        contained as a local target's is, though it runs as the user: the worker,
        root, makes the cgroup, gives the user its `cgroup.procs` and `cgroup.kill`
        (the user's cancel and release end it; the user may still move no process in
        or out), and the launcher enters it as root before it changes to the user
        ([`RunAsTransport.entering`]).

        Raises:
            InvalidArgument: a cgroup for a worker that is not root.
            IoError: the cgroup cannot be made or given.
        """
        if job.cgroup is None:
            return super().spawn(job)
        if not self._hand_over:
            raise InvalidArgument("a run's cgroup under run_as needs a worker that is root")
        self._make_cgroup(job.cgroup)
        with self._runas.entering(job.cgroup):
            return super().spawn(job)

    def cancel(self, job: JobId) -> None:
        """As [`ScriptExecutor.cancel`], as the user. For a contained job of a root
        worker, a cancel script cut short (a job of the user's may find it in /proc,
        pause it or kill it) does not end the cancel: the worker, as root, kills the
        run's cgroup at once (`cgroup.kill`: everything of the job, what fought the
        script included) and runs the user's script again, which records the cancel.

        Raises:
            ExecError: as [`ScriptExecutor.cancel`], when the job has no cgroup or the
                worker is not root; `CommandError` when the cgroup still holds a
                process 5 s after its kill.
        """
        if self._killed_instead(job, super().cancel):
            super().cancel(job)

    def release(self, job: JobId) -> None:
        """As [`ScriptExecutor.release`], as the user. For a contained job of a root
        worker, a release script cut short (a daemon of the user's kills or pauses its
        scripts) does not leave the daemon behind the run's end: the worker, as root,
        kills the run's cgroup (`cgroup.kill`) instead.

        Raises:
            ExecError: as [`ScriptExecutor.release`], when the job has no cgroup or
                the worker is not root; `CommandError` when the cgroup still holds a
                process 5 s after its kill.
        """
        self._killed_instead(job, super().release)

    def follow(
        self,
        entries: Sequence[FollowEntry],
        timeout_s: float = scripts.FOLLOW_TIMEOUT_S,
        log_chunk: int = scripts.FOLLOW_CHUNK_BYTES,
    ) -> list[FollowUpdate]:
        """As [`ScriptExecutor.follow`]. A root worker reads the run directories itself
        ([`rundir.follow_here`]: through descriptors, no link followed, only regular
        files the job's user may read by their modes): no script of the user's runs,
        so no process of the user can pause, kill or write into the tick of every
        run of the target."""
        if not self._hand_over:
            return super().follow(entries, timeout_s, log_chunk)
        return follow_here(entries, self._reader, log_chunk=log_chunk)

    def _script_statuses(self, jobs: Sequence[JobId]) -> list[JobStatus | ProtocolError]:
        # The jobs not found running by the kernel: a root worker reads their
        # markers itself too, as the follow does.
        if not self._hand_over:
            return super()._script_statuses(jobs)
        return [status_here(job, self._reader) for job in jobs]

    def _killed_instead(self, job: JobId, step: Callable[[JobId], None]) -> bool:
        """Runs the user's `step` of `job`; when it fails on a contained job of a root
        worker, kills the run's cgroup as root instead ([`_kill_cgroup`]) and returns
        True (False: the step did it). Raises the step's error otherwise."""
        try:
            step(job)
        except ExecError:
            if job.cgroup is None or not self._hand_over:
                raise
            _kill_cgroup(job.cgroup)
            return True
        return False

    def _make_cgroup(self, cgroup: str) -> None:
        path = Path(cgroup)
        try:
            path.mkdir(parents=True, exist_ok=True)
            for name in ("cgroup.procs", "cgroup.kill"):
                # No `cgroup.kill` before Linux 5.14: the cancel's SIGTERM and its
                # mark sweep are then all it has.
                with contextlib.suppress(FileNotFoundError):
                    os.chown(path / name, self._user.uid, self._user.gid)
        except OSError as error:
            raise IoError(cgroup, error) from error

    def claim(self, dir: str, owner: str) -> bool:
        scripts.check_owner(owner)
        if self._hand_over:
            self._give(check_remote(dir))
        return super().claim(dir, owner)

    def _give(self, dir: str) -> None:
        """Creates `dir` (and missing parents, the worker's) and makes it the user's,
        through a descriptor opened without following a link: a directory already
        the user's is left as it is; one of a third user is refused."""
        path = Path(dir)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                path.mkdir()
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as error:
            raise IoError(path, error) from error
        try:
            owner = os.fstat(fd).st_uid
            if owner == self._user.uid:
                return
            if owner != os.geteuid():
                whose = f"not {self._user.name}'s, nor the worker's"
                raise CommandError("claim", f"{dir} belongs to uid {owner}: {whose}")
            os.fchown(fd, self._user.uid, self._user.gid)
        except OSError as error:
            raise IoError(path, error) from error
        finally:
            os.close(fd)


def _kill_cgroup(cgroup: str) -> None:
    """Kills every process of the run's cgroup `cgroup` at once (`cgroup.kill`, as
    this process: root) and waits, at most [`_KILL_WAIT_S`], until it is empty. A
    cgroup that is gone is no error.

    Raises:
        CommandError: the cgroup cannot be killed, or still holds a process after the
            wait.
    """
    path = Path(check_run_cgroup(cgroup))
    try:
        fd = os.open(path / "cgroup.kill", os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
    except FileNotFoundError:
        return
    except OSError as error:
        why = f"cannot kill the cgroup {cgroup}: {error.strerror}"
        raise CommandError("cancel", why) from error
    deadline = time.monotonic() + _KILL_WAIT_S
    while True:
        try:
            events = (path / "cgroup.events").read_text("ascii").splitlines()
        except OSError:
            return
        if "populated 0" in events:
            return
        if time.monotonic() > deadline:
            raise CommandError("cancel", f"processes of the cgroup {cgroup} survived cgroup.kill")
        time.sleep(0.05)
