"""Every Redis key of the run store, named in one place.

`P` is the prefix (default `rw:`); `<id>` a run id, only `[a-z0-9_.-]` as
`schemas.ids` checks it, so never `:` or `|`; `<lkey>` a launch's idempotency
key, only `[A-Za-z0-9_.-]` as `schemas.idempotency` checks it; `<target>` a target name.

| key | type | holds |
| --- | --- | --- |
| `P targets` | hash | target name -> target config (JSON object) |
| `P run:<id>` | string | the run record (`RunRecord` JSON) |
| `P runs` | sorted set | run ids, score = `created` (unix seconds) |
| `P runs:t:<target>` | sorted set | the same, for one target |
| `P runs:s:<state>` | set | ids of the runs in `<state>` (a `RunState`), for the metrics (12) |
| `P launch:<lkey>` | string | id of the run the launch with key `<lkey>` started (1) |
| `P preparing` | sorted set | ids of the runs in `preparing`, score = `created` (2) |
| `P preparing:keys` | hash | run id -> launch key, for the runs of `P preparing` with one (2) |
| `P follow:targets` | set | targets with at least one followed run |
| `P follow:t:<target>` | set | ids of the followed runs of a target |
| `P offsets:<id>` | hash | `log`, `metrics`: byte offsets the follower has read to (7) |
| `P stop:<id>` | string | the run's open stop (`StopState` JSON); absent when none |
| `P stops` | set | ids of the runs with an open stop |
| `P stops:h:<id>` | list | closed stops of the run (`StopState` JSON), newest first, capped |
| `P deadlines` | sorted set | `run_id|stop_id|kind`, score = due (unix seconds) |
| `P lease:<run_id|stop_id|kind>` | string | worker id holding a deadline (expires) |
| `P replicated` | string | a counter: each write a deadline depends on, then `WAIT` (13) |
| `P log:<id>` | stream | `l` = one line of `job.log`, cut to the line cap (8) (7) |
| `P metrics:<id>` | stream | `m` = one metrics record, JSON (8) (7) |
| `P streambytes:<id>` | hash | `log`, `metrics`: bytes each stream has taken in (8) (7) |
| `P progress:<id>` | hash | `Progress` fields, each a JSON value (7) |
| `P saves:<id>` | list | the run's save times (`SaveSample` JSON), newest first, at most 20 (10) |
| `P once:<key>` | string | marker of an effect done once (expires) |
| `P retrievals` | sorted set | ids of runs with `artifacts` pending, score = next attempt |
| `P continuations` | sorted set | preempted runs whose continuation waits, score = next try (4) |
| `P lock:<key>` | string | a lock holder's token (expires; its holder extends, releases) (3) |
| `P ledger:<id>` | list | the run's ledger events (`schemas.ledger` JSON), oldest first (5) |
| `P ledger` | sorted set | ids of the runs with a ledger, score = their newest event (unix s) |
| `P prom` | hash | the stored counters and histograms of the metrics (`store.counters`) |
| `P hook:<name>|<id>` | list | webhook `<name>`'s deliveries for run `<id>`, oldest first (6) |
| `P hooks` | sorted set | `<name>|<id>` with deliveries waiting, score = next attempt (unix s) |
| `P hooks:tries` | hash | `<name>|<id>` -> attempts made on the head delivery |
| `P hooks:failed` | list | deliveries given up (JSON), newest first, capped |
| `P hb:<role>` | sorted set | processes of `<role>` (`worker`, `beat`), score = last beat (9) |
| `P hb:<role>:<name>` | string | last heartbeat of `<name>` (`Heartbeat` JSON; expires) (9) |
| `P rules` | hash | worker name -> its stops' timeouts' rule (`BudgetRule` and `at`, JSON) |
| `P ticks` | hash | periodic task name -> when it last ran (unix seconds, Redis's clock) |
| `P serves` | sorted set | names of the `runwarden serve` processes, score = last write (11) |
| `P serve:<name>` | string | the record of serve `<name>` (`ServeState` JSON; expires) (11) |

(1) Set in the script that creates the run's record (`Runs.create`, with the record
and its indexes); moved only to the next id when the run's claimed directory was
taken; kept as long as the record (a launch with a used key returns its run).
(2) Written by the script that creates the record, left in the transaction that moves
the run on (`Runs.update`, `Runs.apply_transition`, `Launches.start`, `steps.end_run`); `reconcile`
settles the runs that stay in it too long (`workers.reconcile`).
(3) `retrieve:<id>`, `policy-tick:<target>`, `launch:<lkey>` (a launch at work, or
`reconcile` settling its run), `launch-run:<id>` (`reconcile` settling a run created
without a key), `continue:<id>` (a preempted run being continued).
(4) Kept in step with the record's `continuation` in the transaction that writes it
(`Runs.update`, `Runs.apply_transition`, `steps.end_run`), like `P retrievals` with `artifacts`.
(5) Never trimmed: kept as long as the run's record (neither is ever deleted by
runwarden).
(6) `<name>` is a webhook's name (`[a-z0-9_-]`), so never `|`; the list holds each
delivery's rendered body, never the webhook's URL or secret.
(7) The follow data of a run: expires the retention (`RUNWARDEN_RETENTION_DAYS`) after
the run ends, set in the transaction that ends it (`steps.end_run`); what a late follow
writes after that gets the same expiry (`Follow.record_tail`). The record, its indexes and
its stop history are kept.
(8) Each stream is kept to a byte budget and an entry cap, trimmed oldest first,
exactly, by the script that appends (`store/lua/append_stream.lua`), which keeps
`streambytes` in step; an entry's id is `<n>-1`, n the bytes its stream had taken
in before it (`store.streams`).
(9) Written by the heartbeat of a worker's main process and of beat (`store.health`,
`schemas.health.Heartbeat`);
unix seconds on Redis's clock. The key lapses `schemas.health.HEARTBEAT_TTL_S` after the
last heartbeat; a clean shutdown removes both.
(10) Pushed by the follow (`save` metrics lines, in the transaction that records
them) and by the end of a stop that proved (`store.budgets`); a resumed run reads
its resume sources' too, so it is kept as long as the record (at most 20 entries of
about 100 bytes: it never outgrows the record).
(11) Written by `runwarden serve` (`producers/service.py`, `store.health`): its
children, their restarts and how each last ended; unix seconds on Redis's clock. The
key lapses `schemas.health.SERVE_TTL_S` after the last write; a clean stop removes
both.
(12) Moved in every transaction that writes a record (`runs.index_preparing`, and the
script that creates it); a store from before these sets gets them once from its
records (`Runs.count_by_state`, under the marker `P runs:s` = "1").
(13) Only with `RUNWARDEN_REDIS_MIN_REPLICAS` above 0 (`StoreBase.replicated`): `WAIT`
counts the writes of its own connection, and a write made on another connection of
the pool is covered by this later one, on the `WAIT`'s.

Celery's Redis transport keeps its own keys in the same database, without our
prefix (`broker_*` below, read by `runwarden status`): each queue is a list named as
the queue, plus one list for each priority step `n` (3, 6, 9) that holds messages,
named `<queue>`, the bytes 0x06 0x16, then `<n>`; the hash `unacked` holds the
messages delivered and not yet acknowledged.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas import validate_run_id
from schemas.idempotency import validate_launch_key

__all__ = ["BROKER_PRIORITY_STEPS", "DEFAULT_PREFIX", "Keys"]

DEFAULT_PREFIX = "rw:"
_HOOK_NAME = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
BROKER_PRIORITY_STEPS = (0, 3, 6, 9)
"""The priority steps of Celery's Redis transport (kombu's defaults): one list each."""
_BROKER_SEP = "\x06\x16"
_ROLES = ("worker", "beat")


@dataclass(frozen=True)
class Keys:
    """The key builders of one store (see the module docstring for the layout). Every
    builder that takes a run id validates it (`InvalidRunId`, a `ValueError`), so no
    key is ever built from an unchecked id."""

    prefix: str = DEFAULT_PREFIX

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    # --- targets and runs ------------------------------------------------------------

    @property
    def targets(self) -> str:
        return self._key("targets")

    def run(self, run_id: str) -> str:
        return self._key("run", validate_run_id(run_id))

    @property
    def runs(self) -> str:
        return self._key("runs")

    def runs_of(self, target: str) -> str:
        return self._key("runs", "t", target)

    def runs_in(self, state: str) -> str:
        return self._key("runs", "s", state)

    @property
    def runs_by_state(self) -> str:
        """The marker that the sets of `runs_in` hold every run."""
        return self._key("runs", "s")

    # --- launches ---------------------------------------------------------------------

    def launch(self, key: str) -> str:
        """Raises `SchemaError` (a `ValueError`) for an invalid launch key."""
        return self._key("launch", validate_launch_key(key))

    @property
    def preparing(self) -> str:
        return self._key("preparing")

    @property
    def preparing_keys(self) -> str:
        return self._key("preparing", "keys")

    # --- the follow -------------------------------------------------------------------

    @property
    def followed_targets(self) -> str:
        return self._key("follow", "targets")

    def followed(self, target: str) -> str:
        return self._key("follow", "t", target)

    def offsets(self, run_id: str) -> str:
        return self._key("offsets", validate_run_id(run_id))

    def log(self, run_id: str) -> str:
        return self._key("log", validate_run_id(run_id))

    def metrics(self, run_id: str) -> str:
        return self._key("metrics", validate_run_id(run_id))

    def progress(self, run_id: str) -> str:
        return self._key("progress", validate_run_id(run_id))

    def saves(self, run_id: str) -> str:
        return self._key("saves", validate_run_id(run_id))

    def stream_bytes(self, run_id: str) -> str:
        return self._key("streambytes", validate_run_id(run_id))

    def follow_data(self, run_id: str) -> list[str]:
        """The keys of a run's follow data, which expire after its end (note 4)."""
        return [
            self.offsets(run_id),
            self.log(run_id),
            self.metrics(run_id),
            self.stream_bytes(run_id),
            self.progress(run_id),
        ]

    # --- stops and deadlines ----------------------------------------------------------

    def stop(self, run_id: str) -> str:
        return self._key("stop", validate_run_id(run_id))

    @property
    def stops(self) -> str:
        return self._key("stops")

    def stop_history(self, run_id: str) -> str:
        return self._key("stops", "h", validate_run_id(run_id))

    @property
    def deadlines(self) -> str:
        return self._key("deadlines")

    def lease(self, member: str) -> str:
        return self._key("lease", member)

    def armed(self, member: str) -> str:
        return self._key("armed", member)

    @property
    def replicated(self) -> str:
        return self._key("replicated")

    # --- retrievals and coordination --------------------------------------------------

    @property
    def retrievals(self) -> str:
        return self._key("retrievals")

    @property
    def continuations(self) -> str:
        return self._key("continuations")

    def once(self, key: str) -> str:
        return self._key("once", key)

    def lock(self, key: str) -> str:
        return self._key("lock", key)

    # --- the ledger, metrics and webhooks ---------------------------------------------

    def ledger(self, run_id: str) -> str:
        return self._key("ledger", validate_run_id(run_id))

    @property
    def ledger_runs(self) -> str:
        return self._key("ledger")

    @property
    def prom(self) -> str:
        return self._key("prom")

    def hook(self, member: str) -> str:
        """The delivery list of `member` (`<webhook name>|<run id>`, as
        [`hook_member`] builds it)."""
        return self._key("hook", member)

    @staticmethod
    def hook_member(name: str, run_id: str) -> str:
        """`<name>|<run_id>`; `ValueError` for a name outside `[a-z0-9_-]`."""
        if not name or not set(name) <= _HOOK_NAME:
            raise ValueError(f"invalid webhook name {name[:40]!r}")
        return f"{name}|{validate_run_id(run_id)}"

    @property
    def hooks(self) -> str:
        return self._key("hooks")

    @property
    def hook_tries(self) -> str:
        return self._key("hooks", "tries")

    @property
    def hook_failures(self) -> str:
        return self._key("hooks", "failed")

    # --- health -----------------------------------------------------------------------

    def heartbeats(self, role: str) -> str:
        """Raises `ValueError` for a role other than `worker` or `beat`."""
        return self._key("hb", _role(role))

    def heartbeat(self, role: str, name: str) -> str:
        """Raises `ValueError` for an unknown role or an empty name."""
        if not name:
            raise ValueError("a heartbeat needs a process name")
        return self._key("hb", _role(role), name)

    @property
    def budget_rules(self) -> str:
        return self._key("rules")

    @property
    def ticks(self) -> str:
        return self._key("ticks")

    @property
    def serves(self) -> str:
        return self._key("serves")

    def serve(self, name: str) -> str:
        """Raises `ValueError` for an empty name."""
        if not name:
            raise ValueError("a serve record needs a name")
        return self._key("serve", name)

    # --- the broker's keys (Celery's, without the prefix) -------------------------------

    @staticmethod
    def broker_queue(queue: str, step: int = 0) -> str:
        """The list of the broker holding the messages of `queue` at priority `step`
        (one of `BROKER_PRIORITY_STEPS`; `ValueError` otherwise)."""
        if step not in BROKER_PRIORITY_STEPS:
            raise ValueError(f"not a priority step of the broker: {step!r}")
        return queue if step == 0 else f"{queue}{_BROKER_SEP}{step}"

    @property
    def broker_unacked(self) -> str:
        return "unacked"


def _role(role: str) -> str:
    if role not in _ROLES:
        raise ValueError(f"not a role with a heartbeat: {role[:40]!r}")
    return role
