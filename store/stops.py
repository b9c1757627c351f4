"""Stops and deadlines in the run store.

A run has at most one open stop, and an open stop at most one pending deadline of
each kind. Every change of a stop is a compare-and-set (a Lua script that writes
only if the stored JSON is byte for byte the one the decision was made on) that
moves the stop's deadlines in the same step, so a deadline is never lost between
the two (only `Stops.remove_deadline`, the reconciler's, touches one alone). A closed stop
goes to the run's capped stop history.

Each of these writes (a stop opened with its proof deadline, moved with its
deadlines, closed; a deadline claimed or removed) waits for the configured replicas
(`StoreBase.replicated`, Redis's `WAIT`) before it returns, and raises
`NotReplicated` when they did not acknowledge it in time: a failover keeps every
write that returned (docs/architecture.md, "Durability").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from schemas import (
    Conflict,
    Deadline,
    NotFound,
    NotRunning,
    SnapshotReason,
    StopPhase,
    StopState,
    new_stop_id,
)
from schemas.budget import StopBudget

from .base import (
    StoreBase,
    StorePart,
    aware,
    load_model,
    millis,
    replace_model,
    score,
    seconds,
    text,
    translated,
)
from .runs import Runs

__all__ = ["Stops", "stop_members"]

log = logging.getLogger(__name__)

_PHASE_RANK: Final = {
    StopPhase.WAITING_PROOF: 0,
    StopPhase.WAITING_END: 1,
    StopPhase.CANCELLING: 2,
    StopPhase.DONE: 3,
}


def stop_members(stop: StopState) -> tuple[str, str]:
    """The sorted-set members of both deadlines a stop may have."""
    base = f"{stop.run_id}|{stop.stop_id}|"
    return base + "proof", base + "end"


class Stops(StorePart):
    """Stops (`RunStore.stops`): open stops, their history, and the deadline table."""

    def __init__(self, shared: StoreBase, runs: Runs) -> None:
        super().__init__(shared)
        self._runs = runs

    @translated
    def open(
        self,
        run_id: str,
        reason: SnapshotReason,
        asked_by: str,
        now: datetime,
        proof_timeout_s: float,
        *,
        replace_reason: bool = False,
        budget: StopBudget | None = None,
    ) -> tuple[StopState, bool]:
        """Opens the stop of run `run_id`, or finds the one already open; returns it
        and whether this call opened it.

        - No open stop: creates one (a new random `stop_id`, phase `waiting_proof`,
          `proof_deadline = now + proof_timeout_s`) and adds its proof deadline to the
          deadlines set, atomically -> (stop, True). Schedule the proof countdown
          only then.
        - An open stop exists: no new stop and no new deadline -> (stop, False). Its
          reason stays the first one asked (a request already open is never asked
          twice), unless `replace_reason` is True, which changes only the reason
          (asking again changes nothing but the reason: pass it for a person's
          explicit `stop --reason`).

        `budget`, when given, is kept in a new stop, saying which timeouts it got and
        why (`schemas.budget`); its proof deadline is always `proof_timeout_s` from now.

        Two callers racing get one stop: exactly one sees True. A new stop is opened
        only for a running run, checked in the same script (a caller's own check may
        be stale: the run may have ended since); the caller checks the rest
        (NotStarted / NoSnapshots).

        Raises:
            NotFound: no such run.
            NotRunning: no stop is open and the run is not running.
            ValueError: a bad `asked_by` (1-100 characters, no control characters) or
                a timeout that is not a positive number of seconds.
            Conflict: too many concurrent writers.
        """
        key = self.keys.stop(run_id)
        reason = SnapshotReason(reason)
        asked_at = aware(now)
        fresh = StopState(
            run_id=run_id,
            stop_id=new_stop_id(),
            phase=StopPhase.WAITING_PROOF,
            reason=reason,
            asked_by=asked_by,
            asked_at=asked_at,
            proof_deadline=asked_at + timedelta(seconds=seconds(proof_timeout_s, "timeout")),
            budget=budget,
        )
        deadline = Deadline(
            run_id=run_id, stop_id=fresh.stop_id, kind="proof", due=fresh.proof_deadline
        )
        for _ in range(self._attempts):
            raw = self._r.get(key)
            if raw is not None:
                current = load_model(StopState, raw, f"stop of run {run_id!r}")
                if not replace_reason or current.reason is reason:
                    return current, False
                changed = replace_model(current, reason=reason)
                if self._cas_stop(raw, changed, remove=(), add=None):
                    self._replicated(f"the new reason of the stop of run {run_id!r}")
                    return changed, False
                continue
            done = self._script(
                "open_stop",
                keys=[key, self.keys.stops, self.keys.deadlines, self.keys.run(run_id)],
                args=[fresh.model_dump_json(), run_id, deadline.member, score(deadline.due)],
            )
            if done == -1:
                raise NotFound(run_id)
            if done == -2:
                raise NotRunning(run_id, self._runs.get(run_id).state)
            if done == 1:
                self._replicated(f"the stop of run {run_id!r} and its proof deadline")
                return fresh, True
        raise Conflict(f"the stop of run {run_id!r} keeps changing; try again", run_id=run_id)

    @translated
    def get(self, run_id: str) -> StopState | None:
        """The open stop of run `run_id`, or None."""
        raw = self._r.get(self.keys.stop(run_id))
        return None if raw is None else load_model(StopState, raw, f"stop of run {run_id!r}")

    @translated
    def get_many(self, run_ids: Sequence[str]) -> list[StopState | None]:
        """The open stops of `run_ids`, in order, in one round trip (MGET); None for a
        run without one."""
        if not run_ids:
            return []
        raws = self._r.mget([self.keys.stop(run_id) for run_id in run_ids])
        return [
            None if raw is None else load_model(StopState, raw, f"stop of run {run_id!r}")
            for run_id, raw in zip(run_ids, raws, strict=True)
        ]

    @translated
    def in_progress(self) -> list[StopState]:
        """Every open stop, oldest request first."""
        ids = sorted(text(i) for i in self._r.smembers(self.keys.stops))
        if not ids:
            return []
        raws = self._r.mget([self.keys.stop(i) for i in ids])
        stops = [
            load_model(StopState, raw, f"stop of run {i!r}")
            for i, raw in zip(ids, raws, strict=True)
            if raw is not None
        ]
        return sorted(stops, key=lambda s: (s.asked_at, s.run_id))

    @translated
    def history(self, run_id: str) -> list[StopState]:
        """The closed stops of run `run_id`, newest first (at most the history cap)."""
        raws = self._r.lrange(self.keys.stop_history(run_id), 0, -1)
        return [load_model(StopState, raw, f"closed stop of run {run_id!r}") for raw in raws]

    @translated
    def advance(
        self,
        run_id: str,
        stop_id: str,
        from_phase: StopPhase,
        to_phase: StopPhase,
        *,
        end_deadline: datetime | None = None,
        note: str | None = None,
        cancels: int | None = None,
    ) -> StopState | None:
        """Moves stop `stop_id` of run `run_id` from `from_phase` to `to_phase`, as one
        compare-and-set, and returns the new state; None, with nothing changed, when
        the open stop is not `stop_id` or not in `from_phase` (a late or duplicate
        task).

        The stop's deadlines move with it, in the same script: every pending deadline
        of this stop is removed, and when `end_deadline` is given it is recorded and
        added as the stop's `end` deadline. So: `waiting_proof -> waiting_end` with the
        end deadline; `-> cancelling` with an `end_deadline` if a cancel interrupted by
        a dead worker must be retried by `reconcile` (recommended: now + a grace
        period), without one otherwise. `to_phase` `done` closes the stop as
        [`close`] does. `note` and `cancels` (when given) replace theirs.

        Raises:
            ValueError: `to_phase` goes backwards, `from_phase` is done, or
                `to_phase` is `waiting_end` without an `end_deadline`.
            Conflict: too many concurrent writers.
        """
        from_phase, to_phase = StopPhase(from_phase), StopPhase(to_phase)
        if from_phase is StopPhase.DONE or _PHASE_RANK[to_phase] < _PHASE_RANK[from_phase]:
            raise ValueError(f"a stop cannot go from {from_phase} to {to_phase}")
        if to_phase is StopPhase.WAITING_END and end_deadline is None:
            raise ValueError("a stop waiting for the job's end needs its end deadline")
        key = self.keys.stop(run_id)
        for _ in range(self._attempts):
            raw = self._r.get(key)
            if raw is None:
                return None
            current = load_model(StopState, raw, f"stop of run {run_id!r}")
            if current.stop_id != stop_id or current.phase is not from_phase:
                return None
            changes: dict[str, Any] = {"phase": to_phase}
            if note is not None:
                changes["note"] = note
            if cancels is not None:
                changes["cancels"] = cancels
            if to_phase is StopPhase.DONE:
                closed = replace_model(current, closed_at=datetime.now(UTC), **changes)
                if self._archive_stop(raw, closed):
                    self._replicated(f"the close of the stop of run {run_id!r}")
                    return closed
                continue
            add = None
            if end_deadline is not None:
                changes["end_deadline"] = aware(end_deadline)
                add = Deadline(
                    run_id=run_id, stop_id=stop_id, kind="end", due=changes["end_deadline"]
                )
            changed = replace_model(current, **changes)
            if self._cas_stop(raw, changed, remove=stop_members(current), add=add):
                self._replicated(f"the stop of run {run_id!r} moved to {to_phase}")
                return changed
        raise Conflict(f"the stop of run {run_id!r} keeps changing; try again", run_id=run_id)

    @translated
    def close(
        self,
        run_id: str,
        stop_id: str | None = None,
        note: str | None = None,
        *,
        now: datetime | None = None,
    ) -> StopState | None:
        """Closes the open stop of run `run_id` (only if it is `stop_id`, when given):
        phase `done`, `closed_at` = `now` (default: the current time), `note` when
        given; its deadlines removed, the stop archived in the run's stop history and
        no longer open, all in one script. Returns the closed stop; None, with
        nothing changed, when there is no open stop or it is another one.

        Raises:
            Conflict: too many concurrent writers.
        """
        key = self.keys.stop(run_id)
        closed_at = aware(now or datetime.now(UTC))
        for _ in range(self._attempts):
            raw = self._r.get(key)
            if raw is None:
                return None
            current = load_model(StopState, raw, f"stop of run {run_id!r}")
            if stop_id is not None and current.stop_id != stop_id:
                return None
            changes: dict[str, Any] = {"phase": StopPhase.DONE, "closed_at": closed_at}
            if note is not None:
                changes["note"] = note
            closed = replace_model(current, **changes)
            if self._archive_stop(raw, closed):
                self._replicated(f"the close of the stop of run {run_id!r}")
                return closed
        raise Conflict(f"the stop of run {run_id!r} keeps changing; try again", run_id=run_id)

    def queue_close(self, pipe: Any, stop: StopState, now: datetime, note: str | None) -> None:
        """Queues on `pipe` what [`close`] does in its script, for a transaction
        that watches the stop's key."""
        changes: dict[str, Any] = {"phase": StopPhase.DONE, "closed_at": now}
        if note is not None:
            changes["note"] = note
        closed = replace_model(stop, **changes)
        history = self.keys.stop_history(stop.run_id)
        pipe.delete(self.keys.stop(stop.run_id))
        pipe.srem(self.keys.stops, stop.run_id)
        pipe.zrem(self.keys.deadlines, *stop_members(stop))
        pipe.lpush(history, closed.model_dump_json())
        pipe.ltrim(history, 0, self._history_cap - 1)

    def _cas_stop(
        self,
        expected: bytes | str,
        new: StopState,
        *,
        remove: Sequence[str],
        add: Deadline | None,
    ) -> bool:
        args: list[Any] = [expected, new.model_dump_json(), len(remove), *remove]
        if add is not None:
            args += [add.member, score(add.due)]
        keys = [self.keys.stop(new.run_id), self.keys.deadlines]
        return bool(self._script("cas_stop", keys=keys, args=args))

    def _archive_stop(self, expected: bytes | str, closed: StopState) -> bool:
        run_id = closed.run_id
        proof, end = stop_members(closed)
        done = self._script(
            "close_stop",
            keys=[
                self.keys.stop(run_id),
                self.keys.stops,
                self.keys.deadlines,
                self.keys.stop_history(run_id),
            ],
            args=[expected, closed.model_dump_json(), run_id, self._history_cap, proof, end],
        )
        return bool(done)

    # --- deadlines --------------------------------------------------------------------

    @translated
    def due_deadlines(self, now: datetime, limit: int = 100) -> list[Deadline]:
        """Pending deadlines due at or before `now`, earliest first (at most `limit`).
        A deadline stays pending until its stop moves on or closes, or it is
        removed; [`Stops.claim_deadline`] keeps two reconcilers from firing it at once."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        reply = self._r.zrangebyscore(
            self.keys.deadlines, "-inf", score(aware(now)), start=0, num=limit, withscores=True
        )
        return self._deadlines_of(reply)

    @translated
    def pending_deadlines(self, limit: int = 1000) -> list[Deadline]:
        """Every pending deadline, earliest first (at most `limit`)."""
        reply = self._r.zrange(self.keys.deadlines, 0, limit - 1, withscores=True)
        return self._deadlines_of(reply)

    def _deadlines_of(self, reply: Any) -> list[Deadline]:
        deadlines: list[Deadline] = []
        for member, due in reply:
            name = text(member)
            try:
                deadlines.append(Deadline.from_member(name, datetime.fromtimestamp(due, UTC)))
            except ValueError:
                # Written by something other than this store: it names no stop, and
                # left there it would come back on every call.
                log.warning("dropping malformed deadline member %r", name[:200])
                self._r.zrem(self.keys.deadlines, member)
        return deadlines

    @translated
    def arm_deadline(self, deadline: Deadline, ttl_s: float) -> bool:
        """Marks `deadline`'s countdown task as sent for `ttl_s` seconds (until a
        little past its time), atomically; True when this caller marked it (and sends
        the countdown), False when it was marked already. Apart from the firing lease
        ([`claim_deadline`]): a countdown that was lost leaves its deadline to fire as
        overdue at once. Losing a mark (a failover) only sends a countdown twice,
        which acts once."""
        return bool(self._r.set(self.keys.armed(deadline.member), "1", nx=True,
                                px=millis(ttl_s, "armed")))  # fmt: skip

    @translated
    def claim_deadline(self, deadline: Deadline, worker_id: str, lease_s: float) -> bool:
        """Takes the lease on `deadline` for `lease_s` seconds, atomically; True when
        this caller got it. False when the deadline is no longer pending or another
        worker holds a lease on it: only the holder fires it. The lease is not
        released early: it expires (keep `lease_s` short, a little longer than it
        takes to hand the deadline to its task)."""
        if not worker_id:
            raise ValueError("a worker id is not empty")
        done = self._script(
            "claim_deadline",
            keys=[self.keys.deadlines, self.keys.lease(deadline.member)],
            args=[deadline.member, worker_id, millis(lease_s, "lease")],
        )
        if done:
            self._replicated(f"the claim of deadline {deadline.member!r}")
        return bool(done)

    @translated
    def remove_deadline(self, deadline: Deadline) -> bool:
        """Removes `deadline` from the pending ones; whether it was pending. The stop's
        own state is not changed (use [`advance`] / [`close`] for that)."""
        removed = bool(self._r.zrem(self.keys.deadlines, deadline.member))
        if removed:
            self._replicated(f"the removal of deadline {deadline.member!r}")
        return removed
