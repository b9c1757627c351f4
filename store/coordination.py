"""Coordination between workers through the run store: once-markers (an effect done
by one caller within a time) and locks (held, extended and released by their holder
alone). Both expire, so a worker killed while holding one delays the next holder by
at most the time it was taken for."""

from __future__ import annotations

from .base import StorePart, millis, translated

__all__ = ["Coordination"]


class Coordination(StorePart):
    """`once` / `marked` / `forget` markers and token locks (`RunStore.locks`)."""

    @translated
    def once(self, key: str, ttl_s: float) -> bool:
        """True for the first caller of `key` within `ttl_s` seconds, False for every
        later one (SET NX with expiry). Guard an effect that must happen once with a
        key naming it ("cancel:<run_id>:<stop_id>"); keep `ttl_s` longer than any
        redelivery of the task. The marker is taken before the effect: if the effect
        then fails, delete nothing and let the caller decide (or use [`forget`])."""
        if not key:
            raise ValueError("a once key is not empty")
        return bool(self._r.set(self.keys.once(key), "1", nx=True, px=millis(ttl_s, "ttl")))

    @translated
    def forget(self, key: str) -> bool:
        """Removes the marker of [`once`] `key` (so the effect may happen again, e.g.
        after it failed); whether it existed."""
        return bool(self._r.delete(self.keys.once(key)))

    @translated
    def marked(self, key: str) -> bool:
        """Whether the marker of [`once`] `key` is held now."""
        return bool(self._r.exists(self.keys.once(key)))

    @translated
    def lock(self, key: str, token: str, ttl_s: float) -> bool:
        """Takes the lock `key` for the holder `token` (random, one per holder) for
        `ttl_s` seconds; True when taken. Unlike [`once`], only its holder can extend
        ([`extend`]) or release ([`unlock`]) it."""
        if not key or not token:
            raise ValueError("a lock key and token are not empty")
        return bool(self._r.set(self.keys.lock(key), token, nx=True, px=millis(ttl_s, "ttl")))

    @translated
    def extend(self, key: str, token: str, ttl_s: float) -> bool:
        """Moves the lock's expiry `ttl_s` seconds ahead; False when `token` no longer
        holds it (it lapsed, and maybe another holder took it)."""
        done = self._script(
            "extend_lock", keys=[self.keys.lock(key)], args=[token, millis(ttl_s, "ttl")]
        )
        return bool(done)

    @translated
    def unlock(self, key: str, token: str) -> bool:
        """Releases the lock if `token` still holds it; whether it did."""
        return bool(self._script("release_lock", keys=[self.keys.lock(key)], args=[token]))
