"""Supervision of `runwarden serve`'s children, processes or threads: each one that
ends by itself is started again after a backoff ([`RESTART_FIRST_S`], doubling to
[`RESTART_MAX_S`]; back to the first once it stayed up [`STEADY_S`]), with a line
naming it and how it ended; a child that ends [`GIVE_UP_DEATHS`] times within
[`GIVE_UP_WINDOW_S`] makes the supervisor give up (the caller stops everything).
What the children are is `producers.service`'s."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from schemas import RunwardenError

from .children import dying_with_parent
from .embedded import EmbeddedRedis

__all__ = [
    "GIVE_UP_DEATHS",
    "GIVE_UP_WINDOW_S",
    "RESTART_FIRST_S",
    "RESTART_MAX_S",
    "STEADY_S",
    "STOP_WAIT_S",
    "Child",
    "ProcessChild",
    "RedisChild",
    "Supervisor",
    "ThreadChild",
    "how_ended",
]

STOP_WAIT_S: Final = 60.0
"""How long a process has to end after SIGTERM before it is killed, in seconds."""
RESTART_FIRST_S: Final = 1.0
"""The wait before a child that ended is started again the first time, in seconds."""
RESTART_MAX_S: Final = 30.0
"""The longest wait before a restart, in seconds (the wait doubles at each end)."""
STEADY_S: Final = 60.0
"""A child up this long when it ends waits `RESTART_FIRST_S` again, in seconds."""
GIVE_UP_DEATHS: Final = 5
"""Ends of one child within `GIVE_UP_WINDOW_S` after which serve stops everything."""
GIVE_UP_WINDOW_S: Final = 300.0
"""The window of `GIVE_UP_DEATHS`, in seconds."""


def how_ended(code: int) -> str:
    """How a process with exit status `code` (Popen's: negative for a signal) ended."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    try:  # a wrapper (the reaper) says 128 + n for a command killed by signal n
        by = f" (128 + {signal.Signals(code - 128).name})" if code > 128 else ""
    except ValueError:
        by = ""
    return f"exited with code {code}{by}"


@dataclass
class Child:
    """One part serve supervises; subclasses say how to start, watch and stop it."""

    name: str
    restarts: int = 0
    up_since: float = 0.0
    """When it was last started (monotonic)."""
    due: float | None = None
    """When it is to be started again (monotonic); None while it runs."""
    backoff_s: float = RESTART_FIRST_S
    ends: deque[float] = field(default_factory=deque)
    """When it ended by itself (monotonic), within the last `GIVE_UP_WINDOW_S`."""
    last_end: str | None = None
    last_end_at: float | None = None

    def launch(self) -> None:
        raise NotImplementedError

    def ended(self) -> str | None:
        """How it ended; None while it runs."""
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        return None

    def terminate(self) -> None:
        """Asks it to stop (returns at once)."""

    def wait(self) -> None:
        """Waits until it has stopped (killing it past `STOP_WAIT_S`)."""


@dataclass
class ProcessChild(Child):
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        # From serve's main thread: the parent-death signal follows the forking thread.
        self.proc = subprocess.Popen(
            dying_with_parent(self.command),
            env=self.env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def ended(self) -> str | None:
        code = None if self.proc is None else self.proc.poll()
        return None if code is None else how_ended(code)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@dataclass
class RedisChild(Child):
    embedded: EmbeddedRedis | None = None

    def launch(self) -> None:
        assert self.embedded is not None
        self.embedded.start()

    def ended(self) -> str | None:
        proc = None if self.embedded is None else self.embedded.process
        code = None if proc is None else proc.poll()
        return None if code is None else how_ended(code)

    @property
    def pid(self) -> int | None:
        proc = None if self.embedded is None else self.embedded.process
        return None if proc is None else proc.pid

    def wait(self) -> None:
        if self.embedded is not None:
            self.embedded.stop()


@dataclass
class ThreadChild(Child):
    make: Callable[[], tuple[threading.Thread, Callable[[], None]]] | None = None
    """Starts the thread; returns it and how to stop it."""
    thread: threading.Thread | None = None
    stopper: Callable[[], None] | None = None

    def launch(self) -> None:
        assert self.make is not None
        if self.stopper is not None:  # the ended one lets go of its port first
            with contextlib.suppress(Exception):
                self.stopper()
        self.thread, self.stopper = self.make()

    def ended(self) -> str | None:
        return None if self.thread is None or self.thread.is_alive() else "ended (its thread)"

    def wait(self) -> None:
        if self.stopper is not None:
            self.stopper()


@dataclass
class Supervisor:
    """The children of one serve, in the order they started (stopped: threads, then
    processes; Redis is the caller's, last). Not thread-safe: one thread looks."""

    children: list[Child] = field(default_factory=list)

    def look(self, warn: Callable[[str], None]) -> tuple[bool, str | None]:
        """One look at every child: records the ends, starts again those due.
        Returns whether anything changed, and why to give up (None: go on)."""
        changed = False
        for child in self.children:
            now = time.monotonic()
            if child.due is None:
                how = child.ended()
                if how is None:
                    continue
                pid = child.pid
                who = child.name if pid is None else f"{child.name} (pid {pid})"
                wait_s = self.ended(child, how, now)
                if len(child.ends) >= GIVE_UP_DEATHS:
                    return True, (
                        f"{child.name} ended {len(child.ends)} times within "
                        f"{GIVE_UP_WINDOW_S:g} s (last: {how})"
                    )
                warn(f"serve: {who} {how}; restarting it in {wait_s:g} s")
                changed = True
            elif now >= child.due:
                child.due, child.restarts = None, child.restarts + 1
                try:
                    child.launch()
                except (OSError, RunwardenError) as error:
                    how = f"did not start: {' '.join(str(error).split())[:150]}"
                    wait_s = self.ended(child, how, time.monotonic())
                    if len(child.ends) >= GIVE_UP_DEATHS:
                        return True, f"{child.name} ended {len(child.ends)} times (last: {how})"
                    warn(f"serve: {child.name} {how}; trying again in {wait_s:g} s")
                else:
                    child.up_since = time.monotonic()
                    shown = "" if child.pid is None else f"pid {child.pid}, "
                    warn(f"serve: {child.name} restarted ({shown}restart {child.restarts})")
                changed = True
        return changed, None

    @staticmethod
    def ended(child: Child, how: str, now: float) -> float:
        """Records that `child` ended (`how`) at `now` and sets when it starts again;
        returns the wait until then, in seconds."""
        if now - child.up_since >= STEADY_S:
            child.backoff_s = RESTART_FIRST_S
        child.ends.append(now)
        while child.ends and child.ends[0] < now - GIVE_UP_WINDOW_S:
            child.ends.popleft()
        child.last_end, child.last_end_at = how, now
        wait_s = child.backoff_s
        child.due = now + wait_s
        child.backoff_s = min(RESTART_MAX_S, child.backoff_s * 2)
        return wait_s

    def stop(self) -> None:
        """Stops every child that runs: the threads, then the processes (SIGTERM to
        all, then a wait for each, SIGKILL past [`STOP_WAIT_S`])."""
        for child in self.children:
            if isinstance(child, ThreadChild) and child.due is None:
                child.wait()
        processes = [c for c in self.children if isinstance(c, ProcessChild) and c.due is None]
        for child in processes:
            child.terminate()
        for child in processes:
            child.wait()
