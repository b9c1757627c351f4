"""`schemas.health` and `schemas.health_report`: what a reading says is down, what it
warns about, and the shape of the report `runwarden status --json` prints."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from schemas import Deadline, Settings
from schemas.health import (
    HEARTBEAT_KEPT_S,
    DeadlinesReading,
    HealthReadings,
    Heartbeat,
    SeenProcess,
    ServeChild,
    ServeState,
    periodic_tasks,
)
from schemas.health_report import LATE_AFTER_S, HealthReport, assess, unreachable

NOW = 1_800_000_000.0
PERIODS = {"runwarden.follow_tick": 5.0, "runwarden.reconcile": 10.0}
BOTH = ("runwarden", "runwarden.retrieve", "runwarden.watch", "celery")


def worker(name: str = "w1@h", queues: tuple[str, ...] = BOTH, age: float = 0.5) -> SeenProcess:
    beat = Heartbeat(name=name, hostname="h", pid=10, queues=queues, started=NOW - 60, at=NOW - age)
    return SeenProcess(name=name, last_seen=NOW - age, heartbeat=beat)


def gone(name: str, age: float) -> SeenProcess:
    return SeenProcess(name=name, last_seen=NOW - age, heartbeat=None)


def beat(name: str = "beat@h", started: float = NOW - 60) -> SeenProcess:
    record = Heartbeat(name=name, hostname="h", pid=11, started=started, at=NOW - 0.2)
    return SeenProcess(name=name, last_seen=NOW - 0.2, heartbeat=record)


def readings(**changes: Any) -> HealthReadings:
    """A healthy reading: one worker on every queue, one beat, every task just ran."""
    fields: dict[str, Any] = {
        "now": NOW,
        "used_memory": 1000,
        "maxmemory": 0,
        "workers": (worker(),),
        "beats": (beat(),),
        "ticks": {task: NOW - 1 for task in PERIODS},
        "queues": {q: {0: 0, 3: 0, 6: 0, 9: 0} for q in BOTH},
        "unacked": 0,
        "deadlines": DeadlinesReading(pending=0, overdue=0, next=None),
    }
    return HealthReadings(**(fields | changes))


def judge(reading: HealthReadings, late_after_s: float = LATE_AFTER_S) -> HealthReport:
    return assess(reading, address="redis://r:6379/0", periods=PERIODS, late_after_s=late_after_s)


def test_a_healthy_reading_is_ok_without_warnings() -> None:
    report = judge(readings())
    assert report.ok
    assert report.problems == ()
    assert report.warnings == ()
    assert [w.name for w in report.workers] == ["w1@h"]
    assert report.workers[0].alive
    assert report.workers[0].heartbeat_age_s == 0.5
    assert report.beats[0].alive
    assert report.checked_at == NOW


@pytest.mark.parametrize("missing", ["runwarden", "runwarden.retrieve", "runwarden.watch"])
def test_a_queue_no_live_worker_consumes_is_down(missing: str) -> None:
    queues = tuple(q for q in BOTH if q != missing)
    report = judge(readings(workers=(worker(queues=queues),)))
    assert not report.ok
    assert report.problems == (f"workers: no live worker consumes the queue {missing!r}",)


def test_the_celery_queue_alone_is_not_required() -> None:
    queues = ("runwarden", "runwarden.retrieve", "runwarden.watch")
    report = judge(readings(workers=(worker(queues=queues),)))
    assert report.ok


def test_two_workers_may_share_the_queues() -> None:
    workers = (
        worker("a@h", ("runwarden",)),
        worker("b@h", ("runwarden.retrieve", "runwarden.watch")),
    )
    assert judge(readings(workers=workers)).ok


def test_a_worker_whose_heartbeat_lapsed_is_down_listed_and_warned_about() -> None:
    report = judge(readings(workers=(gone("w1@h", 7.25),)))
    assert not report.ok
    assert len(report.problems) == 3  # every required queue
    (shown,) = report.workers
    assert not shown.alive
    assert shown.heartbeat_age_s == 7.25
    assert shown.pid is None
    assert report.warnings == ("worker w1@h: no heartbeat for 7.2 s (ended without a shutdown)",)


def test_a_dead_worker_does_not_hide_a_live_one_and_is_only_a_warning() -> None:
    report = judge(readings(workers=(worker(), gone("old@h", 30))))
    assert report.ok
    assert [w.alive for w in report.workers] == [True, False]
    assert len(report.warnings) == 1


def test_a_process_gone_longer_than_kept_is_not_listed() -> None:
    report = judge(readings(workers=(worker(), gone("old@h", HEARTBEAT_KEPT_S + 1))))
    assert [w.name for w in report.workers] == ["w1@h"]
    assert report.warnings == ()


def test_no_worker_at_all_is_down() -> None:
    report = judge(readings(workers=()))
    assert not report.ok
    assert report.workers == ()


def test_no_live_beat_is_down() -> None:
    report = judge(readings(beats=(gone("beat@h", 4),)))
    assert not report.ok
    assert "beat: no live beat (periodic tasks are not sent)" in report.problems
    assert report.beats[0].heartbeat_age_s == 4


def test_two_live_beats_are_a_warning() -> None:
    report = judge(readings(beats=(beat("beat@a"), beat("beat@b"))))
    assert report.ok
    assert report.warnings == ("beat: 2 live beats (each sends every periodic task)",)


def test_lateness_is_now_minus_last_run_minus_period() -> None:
    ticks = {"runwarden.follow_tick": NOW - 12.5, "runwarden.reconcile": NOW - 3}
    report = judge(readings(ticks=ticks), late_after_s=7.0)
    follow, reconcile = report.periodic
    assert (follow.task, follow.period_s, follow.last_run_age_s) == (
        "runwarden.follow_tick",
        5,
        12.5,
    )
    assert follow.late_s == 7.5
    assert follow.late
    assert reconcile.late_s == 0.0  # ran 3 s ago, every 10 s: early is not negative lateness
    assert not reconcile.late
    assert report.problems == (
        "periodic: runwarden.follow_tick late by 7.5 s (every 5 s; over 7 s)",
    )


def test_late_exactly_at_the_threshold_is_not_down() -> None:
    ticks = {"runwarden.follow_tick": NOW - 15, "runwarden.reconcile": NOW}
    report = judge(readings(ticks=ticks), late_after_s=10.0)
    assert report.periodic[0].late_s == 10.0
    assert report.ok


def test_a_task_never_run_is_late_from_the_start_of_the_oldest_live_beat() -> None:
    beats = (beat("beat@a", started=NOW - 50), beat("beat@b", started=NOW - 20))
    report = judge(readings(ticks={}, beats=beats), late_after_s=30.0)
    follow, reconcile = report.periodic
    assert follow.last_run_age_s is None
    assert follow.late_s == 45.0
    assert follow.late
    assert reconcile.late_s == 40.0


def test_a_fresh_beat_makes_tasks_never_run_not_late() -> None:
    report = judge(readings(ticks={}, beats=(beat(started=NOW - 2),)))
    assert report.ok
    assert [t.late_s for t in report.periodic] == [0.0, 0.0]


def test_lateness_without_a_run_or_a_live_beat_is_unknown_and_not_a_second_problem() -> None:
    report = judge(readings(ticks={}, beats=()))
    assert [t.late_s for t in report.periodic] == [None, None]
    assert report.problems == ("beat: no live beat (periodic tasks are not sent)",)


def test_memory_above_80_percent_of_maxmemory_is_a_warning() -> None:
    report = judge(readings(used_memory=850, maxmemory=1000))
    assert report.ok
    assert report.redis.memory_fraction == 0.85
    assert report.warnings == ("redis: 85% of maxmemory in use (850 of 1000 bytes), above 80%",)
    assert judge(readings(used_memory=800, maxmemory=1000)).warnings == ()


def test_memory_without_maxmemory_has_no_fraction() -> None:
    report = judge(readings(used_memory=10**9, maxmemory=0))
    assert report.redis.memory_fraction is None
    assert report.warnings == ()


def test_memory_not_reported_is_a_warning() -> None:
    report = judge(readings(used_memory=None, maxmemory=None))
    assert report.ok
    assert report.warnings == ("redis: memory not reported (INFO refused)",)


def test_queue_depth_counts_every_priority_list() -> None:
    queues = {"runwarden": {0: 4, 3: 0, 6: 2, 9: 0}, "celery": {0: 0, 3: 0, 6: 0, 9: 0}}
    report = judge(readings(queues=queues))
    assert [(q.name, q.depth, q.by_priority) for q in report.queues] == [
        ("runwarden", 6, {"0": 4, "6": 2}),
        ("celery", 0, {}),
    ]


def test_the_next_deadline_and_its_time_left() -> None:
    due = datetime.fromtimestamp(NOW + 42.5, UTC)
    first = Deadline(run_id="r1", stop_id="0123456789abcdef", kind="proof", due=due)
    report = judge(readings(deadlines=DeadlinesReading(pending=3, overdue=0, next=first)))
    assert report.deadlines is not None
    assert (report.deadlines.pending, report.deadlines.overdue) == (3, 0)
    assert report.deadlines.next is not None
    assert report.deadlines.next.model_dump() == {
        "run_id": "r1", "stop_id": "0123456789abcdef", "kind": "proof", "due_in_s": 42.5,
    }  # fmt: skip
    assert report.ok


def test_a_deadline_overdue_longer_than_the_threshold_is_a_warning() -> None:
    due = datetime.fromtimestamp(NOW - 40, UTC)
    first = Deadline(run_id="r1", stop_id="0123456789abcdef", kind="end", due=due)
    report = judge(readings(deadlines=DeadlinesReading(pending=1, overdue=1, next=first)))
    assert report.ok
    assert report.warnings == (
        "deadline end of run r1: overdue by 40.0 s (reconcile is not firing it)",
    )
    near = first.model_copy(update={"due": datetime.fromtimestamp(NOW - 2, UTC)})
    assert (
        judge(readings(deadlines=DeadlinesReading(pending=1, overdue=1, next=near))).warnings == ()
    )


def test_unreachable_is_down_with_nothing_else_known() -> None:
    report = unreachable("unix:///s.sock", "cannot reach Redis: refused", NOW, 30.0)
    assert not report.ok
    assert report.problems == ("redis: unreachable at unix:///s.sock: cannot reach Redis: refused",)
    assert not report.redis.reachable
    assert report.redis.error == "cannot reach Redis: refused"
    assert (report.workers, report.beats, report.periodic, report.queues) == ((), (), (), ())
    assert report.unacked is None
    assert report.deadlines is None


@pytest.mark.parametrize("late", [-1.0, float("inf"), float("nan")])
def test_a_bad_threshold_is_refused(late: float) -> None:
    with pytest.raises(ValueError, match="late_after_s"):
        judge(readings(), late_after_s=late)


def test_the_periods_come_from_the_settings() -> None:
    settings = Settings(follow_poll_s=1.5, policy_s=3.5, reconcile_s=4.5)
    assert periodic_tasks(settings) == {
        "runwarden.follow_tick": 1.5,
        "runwarden.policy_tick": 3.5,
        "runwarden.reconcile": 4.5,
    }


def test_the_json_shape_is_the_documented_one() -> None:
    due = datetime.fromtimestamp(NOW + 1, UTC)
    first = Deadline(run_id="r1", stop_id="0123456789abcdef", kind="proof", due=due)
    data = judge(readings(deadlines=DeadlinesReading(pending=1, overdue=0, next=first))).model_dump(
        mode="json"
    )
    assert set(data) == {
        "ok", "checked_at", "late_after_s", "problems", "warnings", "redis", "workers",
        "beats", "periodic", "queues", "unacked", "deadlines", "serve",
    }  # fmt: skip
    assert set(data["redis"]) == {
        "reachable", "address", "error", "used_memory", "maxmemory", "memory_fraction",
    }  # fmt: skip
    process = {"name", "hostname", "pid", "queues", "alive", "heartbeat_age_s"}
    assert set(data["workers"][0]) == process
    assert set(data["beats"][0]) == process
    assert set(data["periodic"][0]) == {"task", "period_s", "last_run_age_s", "late_s", "late"}
    assert set(data["queues"][0]) == {"name", "depth", "by_priority"}
    assert set(data["deadlines"]) == {"pending", "overdue", "next"}
    assert set(data["deadlines"]["next"]) == {"run_id", "stop_id", "kind", "due_in_s"}
    assert data["serve"] == []


def test_serves_record_is_reported_with_its_childrens_restarts() -> None:
    state = ServeState(
        name="serve@h", hostname="h", pid=7, started=NOW - 100, at=NOW - 1,
        children=(
            ServeChild(name="redis", pid=8),
            ServeChild(name="beat", pid=9, restarts=2, last_end="killed by SIGKILL",
                       last_end_ago_s=4.0),
            ServeChild(name="flower", state="restarting", restarts=1,
                       last_end="exited with code 1", last_end_ago_s=0.5),
        ),
    )  # fmt: skip
    report = judge(readings(serves=(state,)))
    assert report.ok  # a child being restarted is a warning: the heartbeats say what is down
    assert report.warnings == ("serve: flower is being restarted (exited with code 1, restart 2)",)
    [serve] = report.serve
    assert (serve.name, serve.pid, serve.up_s, serve.restarts) == ("serve@h", 7, 100.0, 3)
    beat = serve.children[1].model_dump()
    assert beat == {
        "name": "beat", "pid": 9, "state": "up", "restarts": 2,
        "last_end": "killed by SIGKILL", "last_end_age_s": 5.0,
    }  # fmt: skip
    assert serve.children[0].last_end_age_s is None
    assert serve.children[2].pid is None


def test_a_heartbeat_of_a_newer_version_still_reads() -> None:
    raw = '{"name": "w@h", "hostname": "h", "pid": 3, "queues": ["q"], "at": 1.0, "new": 1}'
    assert Heartbeat.model_validate_json(raw).queues == ("q",)
