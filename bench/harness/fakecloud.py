"""Fake cloud metadata services on loopback, one per cloud, for the preemption-notice
watcher (`workers/executors/notices.py`).

These are emulations of each cloud's documented behaviour, not copies of the real
services. The documents followed:

- AWS, the EC2 User Guide: "Use IMDSv2" / "How Instance Metadata Service Version 2
  works" (a `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`
  between 1 and 21600 returns a token; a missing or invalid TTL is `400 - Missing or
  Invalid Parameters`; a PUT with `X-Forwarded-For` is rejected; a PUT to a
  version-specific token path is `403 Forbidden`; with tokens required, a GET with
  no, a wrong or an expired token is `401 - Unauthorized`), "Retrieve instance
  metadata" (metadata is `text/plain`; a missing item is `404 - Not Found`), "Spot
  Instance interruption notices" (`spot/instance-action` is
  `{"action": "terminate"|"stop"|"hibernate", "time": "2017-09-18T08:22:00Z"}`,
  404 without a notice) and "EC2 instance rebalance recommendations"
  (`events/recommendations/rebalance` is `{"noticeTime": "..."}`, 404 without one).
- GCP, the Compute Engine documents "View and query VM metadata" and "Waiting for
  metadata changes" (requests need `Metadata-Flavor: Google`, else 403 "Missing
  Metadata-Flavor:Google header."; responses carry `Metadata-Flavor: Google` and an
  `ETag`; `?wait_for_change=true` hangs until the value changes; with `last_etag`
  different from the current ETag it answers at once; `timeout_sec` (an integer)
  makes it answer the current value after that many seconds; a 503 during
  maintenance is to be retried), and the preemption and host-maintenance documents
  (`instance/preempted` is `TRUE`/`FALSE`; `instance/maintenance-event` is `NONE`,
  `MIGRATE_ON_HOST_MAINTENANCE` or `TERMINATE_ON_HOST_MAINTENANCE`).
- Azure, "Azure Metadata Service: Scheduled Events for Linux VMs" and "Azure
  Instance Metadata Service" (`GET /metadata/scheduledevents?api-version=...` needs
  `Metadata: true`, else "Bad Request"; a missing api-version is a 400 with
  `{"error": "Bad request. api-version was not specified in the request. ...",
  "newest-versions": [...]}`; the document is `{"DocumentIncarnation": n,
  "Events": [...]}`, the incarnation growing at each change; events have `EventId`,
  `EventType` (`Freeze`, `Reboot`, `Redeploy`, `Preempt`, `Terminate`),
  `ResourceType`, `Resources`, `EventStatus`, `NotBefore` (RFC 1123, at least 30 s
  ahead for `Preempt`), `Description`, `EventSource`, `DurationInSeconds`;
  `/metadata/versions` lists the versions; only GET (and the acknowledging POST)).

Simplified: one fixed instance; AWS always requires tokens (IMDSv2 `required`) and
answers a GET of the token path with 405 (the documents name no status for it);
hop limits, throttling (AWS, Azure's 5 requests a second) and Azure's
acknowledgement semantics (a POST only records itself) are not emulated; GCP's ETag
is a hash of the value (so a value that comes back has its old ETag), and a long
poll without `timeout_sec` is cut after 60 s so a test never leaks a thread; Azure's
first-request delay (up to two minutes) is off unless asked for.

Each fake records every request it received (`requests`, with monotonic times),
can switch its notice on now or at a given moment, and can be told to misbehave
(any status, body, header, delay or slow drip) to test hostile answers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

__all__ = ["FAKES", "AwsImds", "AzureImds", "FakeCloud", "GcpMetadata", "Misbehaviour", "Seen"]

_AWS_404 = (
    b'<?xml version="1.0" encoding="iso-8859-1"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML'
    b' 1.0 Transitional//EN"\n\t"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
    b'<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">\n <head>\n  '
    b"<title>404 - Not Found</title>\n </head>\n <body>\n  <h1>404 - Not Found</h1>\n"
    b" </body>\n</html>\n"
)
_GCP_FORBIDDEN = (
    b"<p>Your client does not have permission to get URL <code>%s</code> from this"
    b" server. Missing Metadata-Flavor:Google header.</p>"
)
_GCP_LONGEST_WAIT_S = 60.0
_AZURE_VERSIONS = ("2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01", "2020-07-01")


@dataclass
class Seen:
    """One request a fake received."""

    at: float
    """When it arrived, `time.monotonic()`."""
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    status: int | None = None
    """The status answered (None while it is under way, or when the client left)."""
    done_at: float | None = None

    def header(self, name: str, default: str = "") -> str:
        """The value of the request header `name` (any case), else `default`."""
        wanted = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == wanted), default)


@dataclass
class Misbehaviour:
    """An answer a fake gives instead of its documented one, to every request whose
    path starts with `path` (all when None)."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    """Wait before answering."""
    drip_s: float = 0.0
    """Send the body one byte at a time, this long apart."""
    repeat: int = 1
    """Send `body` this many times (a huge body without holding it in memory)."""
    path: str | None = None


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _any(self) -> None:
        fake = self.server.fake
        parts = urlsplit(self.path)
        seen = Seen(
            time.monotonic(),
            self.command,
            parts.path,
            parse_qs(parts.query, keep_blank_values=True),
            {k: v for k, v in self.headers.items()},
        )
        with fake.lock:
            fake.requests.append(seen)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(min(length, 65536)) if length > 0 else b""
        with contextlib.suppress(OSError):
            wrong = fake.misbehaviour
            if wrong is not None and (wrong.path is None or parts.path.startswith(wrong.path)):
                self._misbehave(wrong, seen)
            else:
                status, headers, answer = fake.answer(self.command, parts.path, seen, body)
                self._send(status, headers, answer, seen)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = _any

    def _send(self, status: int, headers: dict[str, str], body: bytes, seen: Seen) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        seen.status, seen.done_at = status, time.monotonic()

    def _misbehave(self, wrong: Misbehaviour, seen: Seen) -> None:
        if wrong.delay_s:
            time.sleep(wrong.delay_s)
        self.send_response(wrong.status)
        for name, value in wrong.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(wrong.body) * wrong.repeat))
        self.end_headers()
        for _ in range(wrong.repeat):
            if wrong.drip_s:
                for index in range(len(wrong.body)):
                    self.wfile.write(wrong.body[index : index + 1])
                    self.wfile.flush()
                    time.sleep(wrong.drip_s)
            else:
                self.wfile.write(wrong.body)
        seen.status, seen.done_at = wrong.status, time.monotonic()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeCloud


class FakeCloud:
    """A metadata service on `127.0.0.1` (a free port), served by a thread until
    [`close`]. Subclasses answer as their cloud documents."""

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.requests: list[Seen] = []
        self.misbehaviour: Misbehaviour | None = None
        self.closed = False
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self._timers: list[threading.Timer] = []

    @property
    def url(self) -> str:
        """The base URL the watcher is given: `http://127.0.0.1:<port>`."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def answer(
        self, method: str, path: str, seen: Seen, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """The documented answer to one request: status, headers, body."""
        raise NotImplementedError

    def notice_on(self) -> float:
        """Switches this cloud's preemption notice on; returns `time.monotonic()`
        just after it took effect."""
        with self.lock:
            self._notice(True)
            self.lock.notify_all()
        return time.monotonic()

    def notice_off(self) -> None:
        with self.lock:
            self._notice(False)
            self.lock.notify_all()

    def notice_at(self, when: float) -> None:
        """Switches the notice on at `when` (`time.monotonic()`), from a timer."""
        timer = threading.Timer(max(0.0, when - time.monotonic()), self.notice_on)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _notice(self, on: bool) -> None:
        raise NotImplementedError

    def seen(self, path: str | None = None) -> list[Seen]:
        """The requests received so far (to `path` only, when given)."""
        with self.lock:
            return [s for s in self.requests if path is None or s.path == path]

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify_all()
        for timer in self._timers:
            timer.cancel()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeCloud:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AwsImds(FakeCloud):
    """IMDSv2 with tokens required: token PUT, spot `instance-action`, rebalance."""

    name = "aws"

    def __init__(self) -> None:
        super().__init__()
        self.tokens: dict[str, float] = {}  # token -> monotonic expiry
        self.action: dict[str, str] | None = None
        self.rebalance: dict[str, str] | None = None
        self.next_action = "terminate"

    def _notice(self, on: bool) -> None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
        self.action = {"action": self.next_action, "time": when} if on else None

    def rebalance_on(self) -> float:
        """Emits the rebalance recommendation; returns the monotonic time after."""
        with self.lock:
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.rebalance = {"noticeTime": now}
        return time.monotonic()

    def expire_tokens(self) -> None:
        """Every token issued so far expires now, as its TTL would make it."""
        with self.lock:
            self.tokens.clear()

    def answer(
        self, method: str, path: str, seen: Seen, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        text = {"Content-Type": "text/plain"}
        html = {"Content-Type": "text/html"}
        if path.endswith("/api/token"):
            if method != "PUT":
                return 405, html, b""
            if path != "/latest/api/token" or seen.header("X-Forwarded-For"):
                return 403, html, b""
            ttl = seen.header("X-aws-ec2-metadata-token-ttl-seconds")
            if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return 400, html, b""
            token = "AQAEA" + uuid.uuid4().hex + uuid.uuid4().hex[:20] + "=="
            with self.lock:
                self.tokens[token] = time.monotonic() + int(ttl)
            headers = {**text, "X-Aws-Ec2-Metadata-Token-Ttl-Seconds": ttl}
            return 200, headers, token.encode()
        if method not in ("GET", "HEAD"):
            return 405, html, b""
        token = seen.header("X-aws-ec2-metadata-token")
        with self.lock:
            if self.tokens.get(token, 0.0) <= time.monotonic():
                return 401, html, b""
            action, rebalance = self.action, self.rebalance
        if path == "/latest/meta-data/spot/instance-action" and action is not None:
            return 200, text, json.dumps(action).encode()
        if path == "/latest/meta-data/events/recommendations/rebalance" and rebalance:
            return 200, text, json.dumps(rebalance).encode()
        if path == "/latest/meta-data/instance-id":
            return 200, text, b"i-1234567890abcdef0"
        return 404, html, _AWS_404


class GcpMetadata(FakeCloud):
    """The Compute Engine metadata server: `preempted`, `maintenance-event`, with
    `wait_for_change` long polls."""

    name = "gcp"
    _KNOWN_QUERY: ClassVar = {"alt", "recursive", "wait_for_change", "timeout_sec", "last_etag"}

    def __init__(self) -> None:
        super().__init__()
        self.values = {
            "/computeMetadata/v1/instance/preempted": "FALSE",
            "/computeMetadata/v1/instance/maintenance-event": "NONE",
            "/computeMetadata/v1/instance/id": "1234567890123456789",
            "/computeMetadata/v1/project/project-id": "fake-project",
        }
        self.unavailable = False
        """While True, every request gets 503 (the documented maintenance answer)."""

    def _notice(self, on: bool) -> None:
        self.values["/computeMetadata/v1/instance/preempted"] = "TRUE" if on else "FALSE"

    def set_value(self, key: str, value: str) -> float:
        """Sets `instance/<key>`; returns the monotonic time after."""
        with self.lock:
            self.values[f"/computeMetadata/v1/instance/{key}"] = value
            self.lock.notify_all()
        return time.monotonic()

    @staticmethod
    def etag(value: str) -> str:
        return hashlib.sha256(value.encode()).hexdigest()[:16]

    def answer(
        self, method: str, path: str, seen: Seen, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        base = {"Metadata-Flavor": "Google", "Server": "Metadata Server for VM"}
        html = {**base, "Content-Type": "text/html; charset=UTF-8"}
        if not path.startswith("/computeMetadata/"):
            return 404, html, b""
        if seen.header("Metadata-Flavor") != "Google" or seen.header("X-Forwarded-For"):
            return 403, html, _GCP_FORBIDDEN % path.encode()
        if method not in ("GET", "HEAD"):
            return 405, html, b""
        if set(seen.query) - self._KNOWN_QUERY:
            return 400, html, b""
        wait = seen.query.get("wait_for_change", ["false"])[0].lower() == "true"
        timeout_text = seen.query.get("timeout_sec", [""])[0]
        if timeout_text and not timeout_text.isdigit():
            return 400, html, b""
        limit = min(float(timeout_text), _GCP_LONGEST_WAIT_S) if timeout_text else None
        last = seen.query.get("last_etag", [None])[0]
        with self.lock:
            if self.unavailable:
                return 503, html, b""
            if path not in self.values:
                return 404, html, b""
            value = self.values[path]
            if wait and (last is None or last == self.etag(value)):
                deadline = time.monotonic() + (limit if limit is not None else _GCP_LONGEST_WAIT_S)
                while (
                    not self.closed
                    and self.values[path] == value
                    and (left := deadline - time.monotonic()) > 0
                ):
                    self.lock.wait(left)
                value = self.values[path]
        headers = {**base, "Content-Type": "application/text", "ETag": self.etag(value)}
        return 200, headers, value.encode()


class AzureImds(FakeCloud):
    """Azure's Instance Metadata Service: Scheduled Events and `/metadata/versions`."""

    name = "azure"

    def __init__(self, first_call_delay_s: float = 0.0) -> None:
        super().__init__()
        self.incarnation = 1
        self.events: list[dict[str, Any]] = []
        self.approved: list[str] = []
        self.first_call_delay_s = first_call_delay_s

    def add_event(self, event_type: str, status: str = "Scheduled", **fields: Any) -> float:
        """Adds an event of `event_type` (`fields` override its members); returns the
        monotonic time after."""
        with self.lock:
            self.events.append(self._event(event_type, status, fields))
            self.incarnation += 1
        return time.monotonic()

    def _notice(self, on: bool) -> None:
        if on:
            self.events.append(self._event("Preempt", "Scheduled", {}))
        else:
            self.events = [e for e in self.events if e["EventType"] != "Preempt"]
        self.incarnation += 1

    @staticmethod
    def _event(event_type: str, status: str, fields: dict[str, Any]) -> dict[str, Any]:
        # The least notice Azure documents: 30 s for Preempt, 15 minutes for Reboot.
        ahead = 30 if event_type == "Preempt" else 900
        event: dict[str, Any] = {
            "EventId": str(uuid.uuid4()).upper(),
            "EventStatus": status,
            "EventType": event_type,
            "ResourceType": "VirtualMachine",
            "Resources": ["fake-vm"],
            "NotBefore": formatdate(time.time() + ahead, usegmt=True),
            "Description": "",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }
        event.update(fields)
        return event

    def answer(
        self, method: str, path: str, seen: Seen, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        js = {"Content-Type": "application/json; charset=utf-8"}
        if seen.header("Metadata").lower() != "true":
            error = {"error": "Bad request. Required metadata header not specified"}
            return 400, js, json.dumps(error).encode()
        if path == "/metadata/versions":
            return 200, js, json.dumps({"apiVersions": list(_AZURE_VERSIONS)}).encode()
        if path != "/metadata/scheduledevents":
            return 404, js, json.dumps({"error": "Not found"}).encode()
        if method not in ("GET", "POST"):
            return 405, js, json.dumps({"error": "Method not allowed"}).encode()
        version = seen.query.get("api-version", [""])[0]
        if version not in _AZURE_VERSIONS:
            said = "was not specified" if not version else "is invalid"
            refusal = {
                "error": f"Bad request. api-version {said} in the request. For more"
                " information refer to aka.ms/azureimds",
                "newest-versions": list(reversed(_AZURE_VERSIONS))[:3],
            }
            return 400, js, json.dumps(refusal).encode()
        if self.first_call_delay_s:
            time.sleep(self.first_call_delay_s)
            self.first_call_delay_s = 0.0
        if method == "POST":
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                for start in json.loads(body)["StartRequests"]:
                    self.approved.append(str(start["EventId"]))
            return 200, js, b""
        with self.lock:
            document = {"DocumentIncarnation": self.incarnation, "Events": list(self.events)}
        return 200, js, json.dumps(document).encode()


FAKES: dict[str, Callable[[], FakeCloud]] = {
    "aws": AwsImds,
    "gcp": GcpMetadata,
    "azure": AzureImds,
}
