"""A real webhook receiver on loopback for the tests (stdlib `http.server` in a
thread): it records every request and answers the statuses it is told, in order;
and a listener that accepts connections and never answers."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    """One request as the receiver got it."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    status: int

    def json(self) -> Any:
        return json.loads(self.body)

    def signature_ok(
        self, secret: bytes, now: float | None = None, tolerance_s: float = 300
    ) -> bool:
        """Checks the signature as a receiver would, written here from the documented
        scheme (not with runwarden's own helper): HMAC-SHA256 over `<timestamp>.` and
        the body, the timestamp within `tolerance_s` of `now`."""
        timestamp = self.headers.get("x-runwarden-timestamp", "")
        signature = self.headers.get("x-runwarden-signature", "")
        if not timestamp.isdigit():
            return False
        if abs((now if now is not None else time.time()) - int(timestamp)) > tolerance_s:
            return False
        mac = hmac.new(secret, timestamp.encode() + b"." + self.body, hashlib.sha256)
        return hmac.compare_digest("sha256=" + mac.hexdigest(), signature)


@dataclass
class Receiver:
    """A running receiver: its URL, what it got, and the statuses still to answer
    (then 200): those of `statuses_for[path]` for that path first, then `statuses`."""

    url: str
    got: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    statuses_for: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for(
        self, count: int, timeout_s: float = 30.0, path: str | None = None
    ) -> list[Received]:
        """Waits until `count` requests (to `path`, when given) were answered 2xx;
        returns those."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                done = [r for r in self.got if 200 <= r.status < 300 and path in (None, r.path)]
            if len(done) >= count or time.monotonic() > deadline:
                return done
            time.sleep(0.05)


@contextmanager
def receiver() -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 (a free port), stopped at the end."""
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(min(length, 1 << 20))
            with state.lock:
                mine = state.statuses_for.get(self.path) or state.statuses
                status = mine.pop(0) if mine else 200
                headers = {k.lower(): v for k, v in self.headers.items()}
                state.got.append(Received(self.path, headers, body, time.time(), status))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def silent_listener() -> Iterator[str]:
    """A URL whose server accepts connections (the kernel completes them) and never
    answers: a receiver that hangs."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/hang"
    finally:
        sock.close()
