"""Webhooks: which URLs are told which ledger events, how a body is signed, and how a
receiver checks it (docs/architecture.md, "Webhooks").

`RUNWARDEN_WEBHOOKS` holds either a JSON list (its first non-blank character is
`[`; one starting with `{` is refused as JSON that is not a list) or the path of a
file: `*.toml` holds `[[webhook]]` tables, anything else a JSON list. Each webhook:

    {"name": "ops",                              # 1-40 of [a-z0-9_-], unique
     "url": "https://hooks.example/runwarden",   # http or https
     "events": ["stop_opened", "run_ended"],     # default: every kind
     "format": "json",                           # or "slack": {"text": ...}
     "attempts": 10, "backoff_s": 2, "backoff_max_s": 300, "timeout_s": 5}

The secret is read by the worker that delivers, at each delivery: from the secrets
directory (`schemas.secrets`), file `webhook.<name>.secret` ([`secret_file_name`]);
or, when the webhook says so, from another file (`"secret_file"`: an absolute path,
mode 0600 or stricter) or from an environment variable of the worker
(`"secret_env"`, for compatibility: a job running as the worker's user can read
the worker's environment). It never enters Redis, a log or an argument. A `json`
webhook is always signed (no secret: its deliveries fail, saying where to put it);
a `slack` one is signed when it has one (Slack's incoming webhooks keep their
secret in the URL, which therefore is a secret too: the queue in Redis names the
webhook, never its URL).

Signing: `X-Runwarden-Timestamp` holds the delivery's unix time in whole seconds and
`X-Runwarden-Signature` holds `sha256=<hex>`, the HMAC-SHA256 with the secret over
`<timestamp>.` followed by the body's bytes. A receiver recomputes it
([`verify_signature`]), compares in constant time, and refuses a timestamp more than
5 minutes away from its clock (a replayed delivery). `X-Runwarden-Event` names the
event's kind and `X-Runwarden-Delivery` its id (the same on every attempt: a
receiver drops one it has seen).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from .errors import SchemaError, validation_message
from .job import ENV_NAME, check_absolute_path
from .ledger import EVENT_KINDS, EventKind

__all__ = [
    "DELIVERY_HEADER",
    "EVENT_HEADER",
    "SIGNATURE_HEADER",
    "SIGNATURE_TOLERANCE_S",
    "TIMESTAMP_HEADER",
    "Webhook",
    "WebhookConfigError",
    "load_webhooks",
    "parse_webhooks",
    "sign",
    "verify_signature",
]

SIGNATURE_HEADER: Final = "X-Runwarden-Signature"
TIMESTAMP_HEADER: Final = "X-Runwarden-Timestamp"
EVENT_HEADER: Final = "X-Runwarden-Event"
DELIVERY_HEADER: Final = "X-Runwarden-Delivery"
SIGNATURE_TOLERANCE_S: Final = 300
"""How far a delivery's timestamp may be from the receiver's clock, in seconds."""
_CONFIG_LIMIT: Final = 1 << 20
"""Bytes of a webhooks file read at most."""


class WebhookConfigError(SchemaError):
    """`RUNWARDEN_WEBHOOKS` cannot be read or does not fit (the message says where)."""


class Webhook(BaseModel):
    """One webhook: where, which events, in which format, signed with which secret,
    and how its deliveries are retried."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")]
    url: Annotated[str, Field(max_length=2000)]
    events: tuple[EventKind, ...] = EVENT_KINDS
    format: Literal["json", "slack"] = "json"
    secret_env: str | None = None
    """The environment variable of the delivering worker that holds the secret
    (instead of the secrets directory)."""
    secret_file: str | None = None
    """An absolute path, on the delivering worker, of a file holding the secret (its
    surrounding whitespace ignored; mode 0600 or stricter), instead of the secrets
    directory."""
    attempts: Annotated[int, Field(ge=1, le=1000)] = 10
    """Attempts of one delivery before it is given up (recorded)."""
    backoff_s: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] = 2.0
    """Wait after a first failed attempt; doubled after each further one."""
    backoff_max_s: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] = 300.0
    timeout_s: Annotated[float, Field(gt=0, le=60, allow_inf_nan=False)] = 5.0
    """Longest one attempt may take, connecting, sending and reading the answer."""

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("a webhook's url is an http:// or https:// URL with a host")
        if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
            raise ValueError("a webhook's url holds no space or control character")
        return url

    @field_validator("secret_env")
    @classmethod
    def _env(cls, name: str | None) -> str | None:
        if name is not None and ENV_NAME.fullmatch(name) is None:
            raise ValueError("secret_env is an environment variable name")
        return name

    @field_validator("secret_file")
    @classmethod
    def _file(cls, path: str | None) -> str | None:
        return None if path is None else check_absolute_path(path)

    @model_validator(mode="after")
    def _secret(self) -> Webhook:
        if self.secret_env is not None and self.secret_file is not None:
            raise ValueError("give secret_env or secret_file, not both")
        if not self.events:
            raise ValueError("events names at least one kind")
        return self

    @property
    def host(self) -> str:
        """The URL's host, for logs (the URL itself may hold a secret)."""
        return urlsplit(self.url).hostname or "?"

    def wants(self, kind: str) -> bool:
        return kind in self.events

    @property
    def secret_file_name(self) -> str:
        """Its secret's file in the secrets directory: `webhook.<name>.secret`."""
        return f"webhook.{self.name}.secret"


_WEBHOOKS: Final = TypeAdapter(list[Webhook])


def parse_webhooks(document: Any, where: str = "RUNWARDEN_WEBHOOKS") -> tuple[Webhook, ...]:
    """The webhooks of a parsed document (a list of tables).

    Raises:
        WebhookConfigError: it does not fit, or two webhooks share a name.
    """
    try:
        hooks = _WEBHOOKS.validate_python(document)
    except ValidationError as error:
        raise WebhookConfigError(f"{where}: {validation_message(error, 'webhooks')}") from None
    names = [hook.name for hook in hooks]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise WebhookConfigError(f"{where}: webhook name(s) used twice: {', '.join(twice)}")
    return tuple(hooks)


def load_webhooks(value: str | None) -> tuple[Webhook, ...]:
    """The webhooks `RUNWARDEN_WEBHOOKS` (`value`) configures: none for None or
    blank; a JSON list given inline (starting with `[`, or `{`: refused, not a
    list); else the file it names (TOML for `*.toml`, with
    `[[webhook]]` tables; JSON otherwise), read up to 1 MiB.

    Raises:
        WebhookConfigError: unreadable, malformed, or not fitting [`Webhook`].
    """
    if value is None or not value.strip():
        return ()
    text = value.strip()
    if text.startswith(("[", "{")):
        return parse_webhooks(_json(text, "RUNWARDEN_WEBHOOKS"))
    path = Path(text).expanduser()
    try:
        with path.open("rb") as handle:
            raw = handle.read(_CONFIG_LIMIT + 1)
    except OSError as error:
        raise WebhookConfigError(f"RUNWARDEN_WEBHOOKS: cannot read {path}: {error}") from error
    if len(raw) > _CONFIG_LIMIT:
        raise WebhookConfigError(f"RUNWARDEN_WEBHOOKS: {path} is larger than 1 MiB")
    where = str(path)
    if path.suffix == ".toml":
        try:
            document = tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
            raise WebhookConfigError(f"{where}: not TOML: {error}") from error
        extra = sorted(set(document) - {"webhook"})
        if extra:
            raise WebhookConfigError(f"{where}: only [[webhook]] tables, not {extra}")
        return parse_webhooks(document.get("webhook", []), where)
    return parse_webhooks(_json(raw.decode("utf-8", "replace"), where), where)


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise WebhookConfigError(f"{where}: not JSON: {error}") from error


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The `X-Runwarden-Signature` value of `body` sent at `timestamp` (unix
    seconds): `sha256=` and the hex HMAC-SHA256 with `secret` over `<timestamp>.`
    and the body."""
    mac = hmac.new(secret, f"{timestamp}.".encode("ascii") + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(
    secret: bytes,
    timestamp: str | None,
    body: bytes,
    signature: str | None,
    *,
    now: float,
    tolerance_s: float = SIGNATURE_TOLERANCE_S,
) -> bool:
    """Whether a delivery is genuine and fresh: `timestamp` (the header's text) is a
    unix time within `tolerance_s` of `now`, and `signature` (the header's text) is
    [`sign`]'s for it, compared in constant time. For receivers written in Python."""
    if timestamp is None or signature is None or not timestamp.isdigit() or len(timestamp) > 12:
        return False
    if abs(now - int(timestamp)) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, int(timestamp), body), signature)
