"""The webhooks' delivery queue in the run store: per webhook and run, a list of
deliveries in the order their events were recorded; a sorted set of the lists that
wait, scored by when their head is due; the attempts made on each head; the
deliveries given up.

A deliverer takes a list's lease ([`claim`]: its score moves to the lease's
end), attempts its head only, and then ends it ([`end`]: the next one is due
at once) or records the failure ([`retry`]: due again after a backoff).
Only the head of a list is ever attempted, so a run's deliveries to one webhook
arrive in order, one at a time; a lease that lapses (a deliverer killed) lets
another deliverer attempt the same head again: at least once. Every step compares
the head byte for byte, so a late deliverer changes nothing.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Final

from .base import StorePart, aware, score, text, translated

__all__ = ["FAILURES_CAP", "WebhookQueue"]

FAILURES_CAP: Final = 1000
"""Given-up deliveries kept (newest first)."""


class WebhookQueue(StorePart):
    """The webhooks' delivery queue (`RunStore.webhooks`)."""

    @translated
    def due(self, now: datetime, limit: int = 50) -> list[str]:
        """The lists (`<webhook>|<run id>`) whose head is due at `now`, earliest
        first, at most `limit`."""
        reply = self._r.zrangebyscore(self.keys.hooks, "-inf", score(aware(now)), 0, limit)
        return [text(member) for member in reply]

    @translated
    def claim(self, member: str, now: datetime, lease_s: float) -> bool:
        """Takes the lease of list `member` until `now + lease_s` when its head is due;
        True when this caller holds it."""
        at = score(aware(now))
        args = [member, at, at + lease_s]
        return bool(self._script("claim_delivery", keys=[self.keys.hooks], args=args))

    @translated
    def head(self, member: str) -> tuple[str, int] | None:
        """The head delivery of list `member` (its JSON) and the attempts made on it;
        None when the list is empty (its member is then dropped from the set)."""
        with self._r.pipeline(transaction=False) as pipe:
            pipe.lindex(self.keys.hook(member), 0)
            pipe.hget(self.keys.hook_tries, member)
            raw, tries = pipe.execute()
        if raw is None:
            self._r.zrem(self.keys.hooks, member)
            return None
        return text(raw), int(text(tries)) if tries is not None else 0

    @translated
    def end(
        self, member: str, head: str, now: datetime, failure: dict[str, Any] | None = None
    ) -> bool:
        """Removes `head` from list `member` (delivered; or given up, recording
        `failure` among the given-up deliveries); the next delivery is due at `now`.
        False, with nothing changed, when the head is no longer `head`."""
        record = "" if failure is None else json.dumps(failure, separators=(",", ":"))
        keys = [self.keys.hook(member), self.keys.hooks, self.keys.hook_tries,
                self.keys.hook_failures]  # fmt: skip
        args = [head, member, score(aware(now)), record, FAILURES_CAP]
        return bool(self._script("end_delivery", keys=keys, args=args))

    @translated
    def retry(self, member: str, head: str, attempts: int, due: datetime) -> bool:
        """Records `attempts` made on `head` of list `member`, the next due at `due`.
        False, with nothing changed, when the head is no longer `head`."""
        keys = [self.keys.hook(member), self.keys.hooks, self.keys.hook_tries]
        args = [head, member, attempts, score(aware(due))]
        return bool(self._script("retry_delivery", keys=keys, args=args))

    @translated
    def pending(self) -> int:
        """How many lists (webhook and run) have deliveries waiting."""
        return int(self._r.zcard(self.keys.hooks))

    @translated
    def failures(self, limit: int = 100) -> list[dict[str, Any]]:
        """The deliveries given up, newest first (at most `limit`): webhook, run,
        event id and kind, attempts, last error, when."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        found = []
        for raw in self._r.lrange(self.keys.hook_failures, 0, limit - 1):
            try:
                found.append(json.loads(text(raw)))
            except ValueError:
                continue
        return found
