"""Delivering the ledger's events to webhooks (docs/architecture.md, "Webhooks"): a
few threads per worker process drain the delivery queue of the run store
(`store.webhooks`), signing each body with its webhook's secret, read here and now
from the worker's environment or a file.

Why threads and not a task: a delivery to a receiver that does not answer takes its
whole timeout, and a Celery task would take a pool process that a stop's deadline
may need. The threads hold none: the run operations only append to the queue (in the
transaction that records the event), so a receiver that is down never blocks or
slows a stop. Any process's thread may deliver any delivery: a list (one webhook,
one run) is leased to one thread at a time, and only its head is attempted, so a
run's deliveries to a webhook arrive in the order recorded. A thread killed with its
process lets the lease lapse, and another delivers the head again (at least once: a
receiver drops a `X-Runwarden-Delivery` it has seen).

Outcomes of one attempt: a 2xx answer delivers; a 5xx, 408 or 429 answer, a
connection error or a timeout is tried again after `backoff_s` (doubled each time,
at most `backoff_max_s`) until `attempts`, then given up; any other answer (a
redirect, a refusal) is given up at once. A given-up delivery is logged, counted and
kept in the store's list of failures (`RunStore.webhooks.failures`); the run's next
delivery goes on.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import socket
import stat
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from schemas import Settings
from schemas.metrics import WEBHOOK_DELIVERIES, Sample
from schemas.secrets import SecretsDir, SecretsError
from schemas.webhooks import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Webhook,
    WebhookConfigError,
    load_webhooks,
    sign,
)
from store import RunStore

log = logging.getLogger("runwarden")

__all__ = [
    "DELIVERY_THREADS",
    "POLL_S",
    "Attempt",
    "Deliverer",
    "WebhookDelivery",
    "configured_webhooks",
    "post",
    "read_secret",
]

POLL_S: Final = 1.0
"""How often a process's delivery threads look for due deliveries when not woken."""
DELIVERY_THREADS: Final = 4
"""Delivery threads per worker process: a receiver that hangs holds one of them per
attempt (its timeout), the others go on delivering to the other webhooks."""
_LEASE_EXTRA_S: Final = 10.0
"""A delivery's lease lasts its webhook's timeout plus this much."""
_SECRET_LIMIT: Final = 4096
"""Bytes of a secret file read at most."""
_BATCH: Final = 20


def configured_webhooks(settings: Settings) -> tuple[Webhook, ...]:
    """The webhooks of `settings` (`RUNWARDEN_WEBHOOKS`); none, with the error logged,
    when they cannot be read."""
    try:
        return load_webhooks(settings.webhooks)
    except WebhookConfigError as error:
        log.error("webhooks not configured: %s", error)
        return ()


@dataclass(frozen=True)
class Attempt:
    """What one delivery attempt got: the HTTP status (None when none came) and,
    when it failed, why (never holding the URL or the secret)."""

    status: int | None
    error: str | None = None

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def retryable(self) -> bool:
        """Whether trying again may help: no answer, a 5xx, 408 or 429."""
        return self.status is None or self.status >= 500 or self.status in (408, 429)


def read_secret(
    hook: Webhook, secrets: SecretsDir, env: dict[str, str] | os._Environ[str] = os.environ
) -> bytes:
    """The secret of `hook`: its environment variable's value (`secret_env`), its
    file's content (`secret_file`: mode 0600 or stricter, at most 4 KiB), else the
    secrets directory's `webhook.<name>.secret`; surrounding whitespace dropped. b""
    for a Slack webhook without one.

    Raises:
        WebhookConfigError: the secret is not there, cannot be read, is open to
            others, or is empty (the message names the variable or file, never a
            value).
    """
    if hook.secret_env is not None:
        value = env.get(hook.secret_env, "").strip()
        if not value:
            raise WebhookConfigError(f"webhook {hook.name}: {hook.secret_env} is not set")
        return value.encode("utf-8")
    if hook.secret_file is None:
        return _from_secrets(hook, secrets)
    path = Path(hook.secret_file)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise WebhookConfigError(f"webhook {hook.name}: {path} is not a regular file")
            if info.st_mode & 0o077:
                raise WebhookConfigError(
                    f"webhook {hook.name}: {path} is readable by others (chmod 600 it)"
                )
            raw = os.read(fd, _SECRET_LIMIT)
        finally:
            os.close(fd)
    except OSError as error:
        raise WebhookConfigError(f"webhook {hook.name}: cannot read {path}: {error}") from error
    secret = raw.strip()
    if not secret:
        raise WebhookConfigError(f"webhook {hook.name}: {path} is empty")
    return secret


def _from_secrets(hook: Webhook, secrets: SecretsDir) -> bytes:
    where = secrets.path / hook.secret_file_name
    try:
        found = secrets.read(hook.secret_file_name)
    except SecretsError as error:
        raise WebhookConfigError(f"webhook {hook.name}: {error}") from error
    value = b"" if found is None else found.get_secret_value().strip().encode("utf-8")
    if not value and hook.format == "json":
        raise WebhookConfigError(f"webhook {hook.name}: no secret: put it in {where}")
    return value


def _abort(conn: http.client.HTTPConnection) -> None:
    """Ends a connection that outlived its attempt's time, from another thread."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> Attempt:
    """POSTs `body` to `url` with `headers`, within about `timeout_s` seconds in all
    (connecting, sending, reading the status line and headers; a connection still
    open then is shut down). Never follows a redirect, never reads the answer's body.
    Never raises: a failure is an [`Attempt`] without a status."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=timeout_s)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    timer = threading.Timer(timeout_s, _abort, (conn,))
    timer.daemon = True
    timer.start()
    try:
        conn.request("POST", target, body=body, headers=headers)
        response = conn.getresponse()
        return Attempt(response.status, None if 200 <= response.status < 300 else
                       f"answered {response.status} {response.reason[:80]}")  # fmt: skip
    except (OSError, http.client.HTTPException) as error:
        return Attempt(None, f"{type(error).__name__}: {str(error)[:200]}")
    finally:
        timer.cancel()
        conn.close()


class Deliverer:
    """Delivers the due deliveries of `store` to `hooks` (by name); the secrets are
    read at each attempt ([`read_secret`]) from `secrets`, or the files or variables
    of `env` (default: this process's environment) that a webhook names."""

    def __init__(
        self,
        store: RunStore,
        hooks: tuple[Webhook, ...],
        secrets: SecretsDir,
        env: dict[str, str] | os._Environ[str] = os.environ,
    ) -> None:
        self.store = store
        self.queue = store.webhooks
        self.hooks = {hook.name: hook for hook in hooks}
        self.secrets = secrets
        self.env = env

    def run_pending(self, now: datetime) -> int:
        """Attempts the head of every list that is due at `now` and that this caller
        leases; returns how many it attempted."""
        done = 0
        for member in self.queue.due(now, _BATCH):
            name = member.split("|", 1)[0]
            hook = self.hooks.get(name)
            lease_s = (hook.timeout_s if hook else 1.0) + _LEASE_EXTRA_S
            if not self.queue.claim(member, now, lease_s):
                continue
            found = self.queue.head(member)
            if found is None:
                continue
            head, tries = found
            self._attempt(member, hook, name, head, attempts=tries + 1, now=now)
            done += 1
        return done

    def _attempt(
        self, member: str, hook: Webhook | None, name: str, head: str, *, attempts: int,
        now: datetime,
    ) -> None:  # fmt: skip
        """Attempts `head`, started at `now`; its backoff counts from when it failed."""
        started = time.monotonic()
        try:
            delivery: dict[str, Any] = json.loads(head)
        except ValueError:
            delivery = {}
        if hook is None:
            result = Attempt(None, "the webhook is no longer configured")
            self._give_up(member, name, head, delivery, attempts=attempts, result=result, now=now)
            return
        try:
            secret = read_secret(hook, self.secrets, self.env)
        except WebhookConfigError as error:
            result = Attempt(None, str(error))
        else:
            body = str(delivery.get("body", "")).encode("utf-8")
            result = post(hook.url, body, _headers(delivery, body, secret), hook.timeout_s)
        ended = now + timedelta(seconds=time.monotonic() - started)
        if result.delivered:
            self.queue.end(member, head, now)  # the next one is due at once
            self._count(name, "delivered")
            return
        if result.retryable and attempts < hook.attempts:
            wait_s = min(hook.backoff_s * 2 ** (attempts - 1), hook.backoff_max_s)
            self.queue.retry(member, head, attempts, ended + timedelta(seconds=wait_s))
            self._count(name, "retried")
            log.warning(
                "webhook %s (%s): delivery %s of run %s failed (attempt %d), again in %g s: %s",
                name, hook.host, delivery.get("id"), delivery.get("run_id"), attempts, wait_s,
                result.error,
            )  # fmt: skip
            return
        self._give_up(member, name, head, delivery, attempts=attempts, result=result, now=now)

    def _give_up(
        self,
        member: str,
        name: str,
        head: str,
        delivery: dict[str, Any],
        *,
        attempts: int,
        result: Attempt,
        now: datetime,
    ) -> None:
        failure = {
            "webhook": name,
            "run_id": delivery.get("run_id"),
            "event_id": delivery.get("id"),
            "kind": delivery.get("kind"),
            "attempts": attempts,
            "error": result.error,
            "at": datetime.now(UTC).isoformat(),
        }
        self.queue.end(member, head, now, failure)
        self._count(name, "gave_up")
        log.error(
            "webhook %s: delivery %s of run %s given up after %d attempt(s): %s",
            name, failure["event_id"], failure["run_id"], attempts, result.error,
        )  # fmt: skip

    def _count(self, name: str, outcome: str) -> None:
        try:
            self.store.counters.add([Sample(WEBHOOK_DELIVERIES, (name, outcome), 1.0)])
        except Exception:  # noqa: BLE001 - a count lost is no delivery lost
            log.warning("webhook %s: cannot count a delivery", name)


def _headers(delivery: dict[str, Any], body: bytes, secret: bytes) -> dict[str, str]:
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "runwarden-webhooks",
        EVENT_HEADER: str(delivery.get("kind", "")),
        DELIVERY_HEADER: str(delivery.get("id", "")),
        TIMESTAMP_HEADER: str(timestamp),
    }
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, timestamp, body)
    return headers


# --- the delivery of one process ------------------------------------------------------


class WebhookDelivery:
    """The webhook delivery of one process (its `workers.context.Context` owns it):
    the webhooks of its settings (`RUNWARDEN_WEBHOOKS`, read once; none, with the
    error logged once, when they cannot be read) and its [`DELIVERY_THREADS`]
    delivery threads, started on first need. A forked child builds its own context,
    so it has its own threads."""

    def __init__(self, store: RunStore, settings: Settings) -> None:
        self.hooks = configured_webhooks(settings)
        self._store = store
        self._secrets = settings.secrets
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._wake = threading.Event()

    def start(self) -> bool:
        """Starts the delivery threads, once, when webhooks are configured, and wakes
        them (a delivery was just queued); whether they run."""
        if not self.hooks:
            return False
        with self._lock:
            self._threads[:] = [thread for thread in self._threads if thread.is_alive()]
            while len(self._threads) < DELIVERY_THREADS:
                deliverer = Deliverer(self._store, self.hooks, self._secrets)
                thread = threading.Thread(
                    target=self._loop, args=(deliverer,), name="runwarden-webhooks", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        self._wake.set()
        return True

    def _loop(self, deliverer: Deliverer) -> None:
        while True:
            self._wake.wait(POLL_S)
            self._wake.clear()
            try:
                while deliverer.run_pending(datetime.now(UTC)):
                    pass
            except Exception:  # Redis trouble: the next round tries again
                log.exception("webhooks: delivery round failed")
