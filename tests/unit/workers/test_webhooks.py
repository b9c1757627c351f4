"""`workers.webhooks`: deliveries from the store's queue to a real HTTP receiver on
loopback: signed with the secret of the secrets directory, a file or the
environment, retried with backoff
after a 5xx or no answer, given up (and recorded) after the last attempt or at once
for a refusal, one run's deliveries in order."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.harness.webhook_receiver import Receiver, receiver, silent_listener
from schemas.ledger import JobCancelled
from schemas.secrets import SecretsDir
from schemas.webhooks import Webhook
from store import RunStore
from workers.webhooks import Deliverer, post, read_secret

from .conftest import fresh_store

SECRET = "s3cret with spaces $(touch /tmp/x) \"'"
ENV = {"HOOK_SECRET": SECRET}


@pytest.fixture
def secrets(tmp_path: Path) -> SecretsDir:
    """A secrets directory holding `ops`'s secret."""
    found = SecretsDir(tmp_path / "secrets")
    found.ensure("webhook.ops.secret", SECRET)
    return found


@pytest.fixture
def got() -> Iterator[Receiver]:
    with receiver() as running:
        yield running


def hook(url: str, **changes: Any) -> Webhook:
    base: dict[str, Any] = {"name": "ops", "url": url, "backoff_s": 10, "attempts": 3}
    base.update(changes)
    return Webhook.model_validate(base)


def queue(store: RunStore, run_id: str, n: int, now: datetime) -> list[str]:
    """Queues `n` events of `run_id` for webhook `ops`; returns their ids."""
    ids = []
    for i in range(n):
        event = JobCancelled.of(run_id, now + timedelta(seconds=i))
        body = event.model_dump_json()
        delivery = {"id": event.id, "kind": event.kind, "run_id": run_id, "body": body}
        store.ledger.record(event, deliveries=[("ops", json.dumps(delivery))], now=now)
        ids.append(event.id)
    return ids


def test_a_delivery_is_signed_and_says_what_it_is(got: Receiver, secrets: SecretsDir) -> None:
    store = fresh_store()
    now = datetime.now(UTC)
    (event_id,) = queue(store, "r1", 1, now)
    assert Deliverer(store, (hook(got.url + "/in?x=1"),), secrets, {}).run_pending(now) == 1
    (request,) = got.got
    assert request.path == "/in?x=1"
    assert request.signature_ok(SECRET.encode())
    assert not request.signature_ok(b"another secret")
    assert abs(int(request.headers["x-runwarden-timestamp"]) - time.time()) < 5
    assert request.headers["x-runwarden-event"] == "job_cancelled"
    assert request.headers["x-runwarden-delivery"] == event_id
    assert request.json()["id"] == event_id
    assert store.webhooks.pending() == 0


def test_a_5xx_is_retried_after_the_backoff_and_the_order_is_kept(
    got: Receiver, secrets: SecretsDir
) -> None:
    store = fresh_store()
    now = datetime.now(UTC)
    ids = queue(store, "r1", 3, now)
    got.statuses = [500, 503]
    deliverer = Deliverer(store, (hook(got.url, attempts=5, backoff_s=10),), secrets)
    deliverer.run_pending(now)
    assert [r.status for r in got.got] == [500]
    # Nothing of this run goes before its head is delivered.
    assert deliverer.run_pending(now + timedelta(seconds=9)) == 0
    deliverer.run_pending(now + timedelta(seconds=11))
    assert [r.status for r in got.got] == [500, 503]
    assert deliverer.run_pending(now + timedelta(seconds=29)) == 0  # doubled: 20 s
    later = now + timedelta(seconds=32)
    while deliverer.run_pending(later):
        pass
    assert [r.status for r in got.got] == [500, 503, 200, 200, 200]
    assert [r.json()["id"] for r in got.got] == [ids[0], ids[0], *ids]
    assert store.webhooks.pending() == 0
    assert store.webhooks.failures() == []


def test_the_last_failed_attempt_gives_up_and_is_recorded(
    got: Receiver, secrets: SecretsDir
) -> None:
    store = fresh_store()
    now = datetime.now(UTC)
    first, second = queue(store, "r1", 2, now)
    got.statuses = [502, 502]
    deliverer = Deliverer(store, (hook(got.url, attempts=2, backoff_s=1),), secrets)
    deliverer.run_pending(now)
    deliverer.run_pending(now + timedelta(seconds=2))
    (failure,) = store.webhooks.failures()
    assert failure["event_id"] == first
    assert failure["attempts"] == 2
    assert "502" in failure["error"]
    deliverer.run_pending(now + timedelta(seconds=2))
    assert [r.json()["id"] for r in got.got] == [first, first, second]


def test_a_refusal_is_given_up_at_once(got: Receiver, secrets: SecretsDir) -> None:
    store = fresh_store()
    now = datetime.now(UTC)
    queue(store, "r1", 1, now)
    got.statuses = [401]
    Deliverer(store, (hook(got.url),), secrets).run_pending(now)
    (failure,) = store.webhooks.failures()
    assert failure["attempts"] == 1
    assert "401" in failure["error"]
    assert store.webhooks.pending() == 0


def test_a_receiver_that_never_answers_costs_one_timeout(secrets: SecretsDir) -> None:
    store = fresh_store()
    now = datetime.now(UTC)
    queue(store, "r1", 1, now)
    with silent_listener() as url:
        started = time.monotonic()
        Deliverer(store, (hook(url, timeout_s=0.5),), secrets).run_pending(now)
        took = time.monotonic() - started
    assert took < 3.0
    assert store.webhooks.failures() == []
    assert store.webhooks.due(now + timedelta(seconds=11)) == ["ops|r1"]  # retried later


def test_no_server_at_all_is_retried() -> None:
    attempt = post("http://127.0.0.1:9/", b"{}", {}, 1.0)
    assert attempt.status is None
    assert attempt.retryable
    assert attempt.error


def test_a_missing_secret_is_a_failed_attempt_saying_where_it_goes(
    got: Receiver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = fresh_store()
    now = datetime.now(UTC)
    queue(store, "r1", 1, now)
    empty = SecretsDir(tmp_path / "none")
    Deliverer(store, (hook(got.url),), empty, {}).run_pending(now)
    assert got.got == []
    assert store.webhooks.due(now + timedelta(seconds=11)) == ["ops|r1"]
    assert f"no secret: put it in {tmp_path / 'none' / 'webhook.ops.secret'}" in caplog.text
    # From the environment, when the webhook names a variable, and it is unset.
    with pytest.raises(ValueError, match="HOOK_SECRET is not set"):
        read_secret(hook(got.url, secret_env="HOOK_SECRET"), empty, {})
    assert read_secret(hook(got.url, secret_env="HOOK_SECRET"), empty, ENV) == SECRET.encode()
    # A Slack webhook without a secret is sent unsigned.
    assert read_secret(hook(got.url, format="slack"), empty, {}) == b""


def test_a_secret_file_must_be_private(tmp_path: Path, got: Receiver) -> None:
    path = tmp_path / "secret"
    path.write_text(f"  {SECRET}\n")
    os.chmod(path, 0o644)
    open_hook = hook(got.url, secret_env=None, secret_file=str(path))
    nowhere = SecretsDir(tmp_path / "none")
    with pytest.raises(ValueError, match="readable by others"):
        read_secret(open_hook, nowhere)
    os.chmod(path, 0o600)
    assert read_secret(open_hook, nowhere) == SECRET.encode()
    store = fresh_store()
    now = datetime.now(UTC)
    queue(store, "r1", 1, now)
    Deliverer(store, (open_hook,), nowhere, {}).run_pending(now)
    (request,) = got.got
    assert request.signature_ok(SECRET.encode())


def test_a_webhook_removed_from_the_configuration_gives_its_deliveries_up(
    secrets: SecretsDir,
) -> None:
    store = fresh_store()
    now = datetime.now(UTC)
    queue(store, "r1", 1, now)
    Deliverer(store, (), secrets).run_pending(now)
    (failure,) = store.webhooks.failures()
    assert failure["error"] == "the webhook is no longer configured"
