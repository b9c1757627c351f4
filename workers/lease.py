"""A lock in the run store held while a piece of work runs, kept alive by a heartbeat:
the holder extends it every quarter of its time to live, so it outlives a slow
holder, and lapses within one time to live of a holder's death."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from store.coordination import Coordination

log = logging.getLogger("runwarden")

__all__ = ["Lease", "leased"]


class Lease:
    """The lock `key` of `locks` (the store's), held by this process under a random
    token."""

    def __init__(self, locks: Coordination, key: str, ttl_s: float) -> None:
        self.locks = locks
        self.key = key
        self.ttl_s = ttl_s
        self.token = secrets.token_hex(16)
        self._lost = threading.Event()
        self._done = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def held(self) -> bool:
        """False once an extension found the lock no longer held by this token (it
        lapsed: Redis was unreachable for a whole time to live, or this process was
        stopped that long); another holder may have it now."""
        return not self._lost.is_set()

    def take(self) -> bool:
        """Takes the lock now; whether it did (see `Coordination.lock`)."""
        return self.locks.lock(self.key, self.token, self.ttl_s)

    def start(self) -> None:
        """Starts the heartbeat (a daemon thread)."""
        self._beat = threading.Thread(target=self._run, name=f"lease-{self.key}", daemon=True)
        self._beat.start()

    def _run(self) -> None:
        while not self._done.wait(self.ttl_s / 4):
            try:
                if not self.locks.extend(self.key, self.token, self.ttl_s):
                    log.error("the lock %s lapsed", self.key)
                    self._lost.set()
                    return
            except Exception:  # noqa: BLE001 - Redis trouble: the next beat tries again
                log.warning("cannot extend the lock %s", self.key)

    def release(self) -> None:
        """Stops the heartbeat and releases the lock if this token still holds it. A
        failure to release is logged: the lock lapses within its time to live."""
        self._done.set()
        if self._beat is not None:
            self._beat.join()
        try:
            self.locks.unlock(self.key, self.token)
        except Exception:  # noqa: BLE001 - it lapses by itself
            log.warning("cannot release the lock %s; it lapses in %g s", self.key, self.ttl_s)


@contextmanager
def leased(
    locks: Coordination, key: str, ttl_s: float, wait_s: float = 0.0, poll_s: float = 0.25
) -> Iterator[Lease | None]:
    """Holds the lock `key` (time to live `ttl_s`, extended by a heartbeat) for the
    `with` block, and releases it after. Waits up to `wait_s` seconds for a lock held
    by someone else (polling every `poll_s`); yields None when it is still held then.

    Raises:
        StoreError: the store cannot be reached to take the lock.
    """
    lease = Lease(locks, key, ttl_s)
    deadline = time.monotonic() + wait_s
    while not lease.take():
        if time.monotonic() >= deadline:
            yield None
            return
        time.sleep(poll_s)
    lease.start()
    try:
        yield lease
    finally:
        lease.release()
