"""`schemas.webhooks`: `RUNWARDEN_WEBHOOKS` inline or in a JSON or TOML file, every
refusal a clear `WebhookConfigError`, and the signature a receiver checks."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import pytest

from schemas import SchemaError
from schemas.ledger import EVENT_KINDS
from schemas.webhooks import WebhookConfigError, load_webhooks, sign, verify_signature

HOOK = {"name": "ops", "url": "https://hooks.example/x?a=1", "secret_env": "OPS_SECRET"}


def test_none_or_blank_configures_nothing() -> None:
    assert load_webhooks(None) == ()
    assert load_webhooks("  \n") == ()


def test_an_inline_json_list() -> None:
    slack = {"name": "chat", "url": "http://127.0.0.1:9/s", "format": "slack",
             "events": ["run_ended"]}  # fmt: skip
    ops, chat = load_webhooks(json.dumps([HOOK, slack]))
    assert ops.events == EVENT_KINDS
    assert ops.wants("stop_opened")
    assert (ops.format, ops.attempts, ops.timeout_s, ops.host) == ("json", 10, 5.0, "hooks.example")
    assert chat.format == "slack"
    assert chat.secret_env is None
    assert chat.secret_file_name == "webhook.chat.secret"
    assert chat.wants("run_ended")
    assert not chat.wants("stop_opened")


def test_a_json_file_and_a_toml_file(tmp_path: Path) -> None:
    as_json = tmp_path / "hooks.json"
    as_json.write_text(json.dumps([HOOK]))
    as_toml = tmp_path / "hooks.toml"
    as_toml.write_text(
        '[[webhook]]\nname = "ops"\nurl = "https://hooks.example/x?a=1"\n'
        'secret_file = "/etc/runwarden/ops.secret"\nevents = ["stop_opened", "cancel_decided"]\n'
        "attempts = 3\n"
    )
    (from_json,) = load_webhooks(str(as_json))
    (from_toml,) = load_webhooks(f"  {as_toml}\n")
    assert from_json.secret_env == "OPS_SECRET"
    assert from_toml.secret_file == "/etc/runwarden/ops.secret"
    assert from_toml.events == ("stop_opened", "cancel_decided")
    assert from_toml.attempts == 3


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("[{", "not JSON"),
        (json.dumps([{**HOOK, "secret_file": "/s"}]), "not both"),
        (json.dumps([{**HOOK, "url": "ftp://x/y"}]), "http:// or https://"),
        (json.dumps([{**HOOK, "url": "https://x/a b"}]), "no space"),
        (json.dumps([{**HOOK, "events": ["stop_opend"]}]), "events.0"),
        (json.dumps([{**HOOK, "events": []}]), "at least one"),
        (json.dumps([{**HOOK, "name": "Ops!"}]), "name"),
        (json.dumps([{**HOOK, "secret_env": "A-B"}]), "environment variable name"),
        (json.dumps([{**HOOK, "secret_file": "relative/path"}]), "absolute"),
        (json.dumps([{**HOOK, "timeout_s": 0}]), "timeout_s"),
        (json.dumps([{**HOOK, "extra": 1}]), "extra"),
        (json.dumps([HOOK, HOOK]), "used twice: ops"),
        (json.dumps({"name": "ops"}), "webhooks"),
        ("/nonexistent/hooks.json", "cannot read /nonexistent/hooks.json"),
    ],
)
def test_a_bad_configuration_is_a_clear_error(value: str, needle: str) -> None:
    with pytest.raises(WebhookConfigError) as caught:
        load_webhooks(value)
    assert needle in str(caught.value)
    assert isinstance(caught.value, SchemaError)


def test_a_toml_file_holds_only_webhook_tables(tmp_path: Path) -> None:
    path = tmp_path / "hooks.toml"
    path.write_text('[other]\nx = 1\n')
    with pytest.raises(WebhookConfigError, match="only \\[\\[webhook\\]\\] tables"):
        load_webhooks(str(path))
    path.write_text("name = \n")
    with pytest.raises(WebhookConfigError, match="not TOML"):
        load_webhooks(str(path))


def test_the_signature_is_hmac_sha256_over_the_timestamp_and_the_body() -> None:
    secret, body, timestamp = b"s3cret", b'{"kind":"stop_opened"}', 1_800_000_000
    expected = hmac.new(secret, b"1800000000." + body, hashlib.sha256).hexdigest()
    assert sign(secret, timestamp, body) == "sha256=" + expected
    header = sign(secret, timestamp, body)
    assert verify_signature(secret, "1800000000", body, header, now=timestamp + 10)
    assert not verify_signature(secret, "1800000000", body + b" ", header, now=timestamp)
    assert not verify_signature(b"other", "1800000000", body, header, now=timestamp)
    assert not verify_signature(secret, "1800000001", body, header, now=timestamp)
    # A replay after the tolerance, or a timestamp from the future, is refused.
    assert not verify_signature(secret, "1800000000", body, header, now=timestamp + 301)
    assert not verify_signature(secret, "1800000000", body, header, now=timestamp - 301)
    assert not verify_signature(secret, None, body, header, now=timestamp)
    assert not verify_signature(secret, "-5", body, header, now=timestamp)
    assert not verify_signature(secret, "1800000000", body, None, now=timestamp)
