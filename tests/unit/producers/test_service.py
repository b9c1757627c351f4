"""`producers.service` and `producers.supervision`: the supervisor's rules without
processes (the backoff, the give-up, how an end is told, one serve per state
directory); the real processes are in tests/integration/service/test_supervisor.py."""

from __future__ import annotations

import importlib.util
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from producers.embedded import NotServing
from producers.service import Service, ServiceOptions, _hold, _named
from producers.supervision import (
    GIVE_UP_DEATHS,
    RESTART_FIRST_S,
    RESTART_MAX_S,
    STEADY_S,
    Child,
    Supervisor,
    how_ended,
)
from schemas import Settings
from schemas.errors import MissingExtra


@dataclass
class _Dies(Child):
    """A child that ends as soon as it starts."""

    launched: int = 0

    def launch(self) -> None:
        self.launched += 1

    def ended(self) -> str | None:
        return "exited with code 1"

    @property
    def pid(self) -> int | None:
        return 4242


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_child_that_keeps_ending_is_restarted_with_a_doubling_backoff_then_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    monkeypatch.setattr("producers.supervision.time", SimpleNamespace(monotonic=clock))
    child = _Dies("beat", up_since=clock.now)
    supervisor = Supervisor([child])
    lines: list[str] = []
    waits = []
    for _ in range(50):
        changed, reason = supervisor.look(lines.append)
        assert changed
        if reason is not None:
            break
        if child.due is not None:
            waits.append(child.due - clock.now)
            clock.now = child.due
    assert reason == f"beat ended {GIVE_UP_DEATHS} times within 300 s (last: exited with code 1)"
    assert waits == [RESTART_FIRST_S * 2**i for i in range(GIVE_UP_DEATHS - 1)]
    assert child.launched == child.restarts == GIVE_UP_DEATHS - 1
    assert lines[0] == "serve: beat (pid 4242) exited with code 1; restarting it in 1 s"
    assert lines[1] == "serve: beat restarted (pid 4242, restart 1)"


def test_the_backoff_stops_at_its_maximum_and_resets_after_a_steady_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr("producers.supervision.time", SimpleNamespace(monotonic=clock))
    child = _Dies("worker", up_since=clock.now)
    for _ in range(8):  # up 10 s each time: not steady
        clock.now += 10
        Supervisor.ended(child, "killed by SIGKILL", clock.now)
        child.up_since = clock.now
    assert child.due is not None
    assert child.due - clock.now == RESTART_MAX_S
    assert len(child.ends) == 8
    clock.now += STEADY_S + 300  # up a while: the backoff starts over, old ends forgotten
    Supervisor.ended(child, "killed by SIGKILL", clock.now)
    assert child.due - clock.now == RESTART_FIRST_S
    assert list(child.ends) == [clock.now]


def test_how_an_end_is_told() -> None:
    assert how_ended(-signal.SIGKILL) == "killed by SIGKILL"
    assert how_ended(1) == "exited with code 1"
    assert how_ended(137) == "exited with code 137 (128 + SIGKILL)"
    assert how_ended(0) == "exited with code 0"


def test_one_serve_per_state_directory_and_a_dead_ones_file_is_stale(tmp_path: Path) -> None:
    (tmp_path / "serve.pid").write_text("999999\n")  # left by a serve that died
    held = _hold(tmp_path)
    try:
        assert (tmp_path / "serve.pid").read_text() == f"{os.getpid()}\n"
        with pytest.raises(NotServing, match=rf"\(pid {os.getpid()}\) already runs on"):
            _hold(tmp_path)
    finally:
        os.close(held)
    os.close(_hold(tmp_path))  # released with its holder


def test_each_process_is_named_by_what_it_runs(tmp_path: Path) -> None:
    options = ServiceOptions(flower=True)
    commands = Service(Settings(state_dir=tmp_path), options).commands()
    names = ["worker", "retrieval worker", "watch worker", "beat", "flower"]
    assert [_named(c) for c in commands] == names


def test_the_web_view_connects_as_web_on_the_embedded_server_only(tmp_path: Path) -> None:
    embedded = Service(Settings(state_dir=tmp_path), ServiceOptions(web=True))
    assert embedded.web_settings().redis_user == "web"
    assert embedded.settings.redis_user is None  # the rest of serve stays the operator
    given = Settings(state_dir=tmp_path, redis_url="redis://redis:6379/0")  # type: ignore[arg-type]
    assert Service(given, ServiceOptions(web=True)).web_settings() is given


@pytest.mark.parametrize(
    ("options", "missing", "extra"),
    [
        (ServiceOptions(), "paramiko", "worker"),
        (ServiceOptions(web=True), "fastapi", "web"),
        (ServiceOptions(metrics_port=9464), "prometheus_client", "web"),
        (ServiceOptions(flower=True), "flower", "flower"),
    ],
)
def test_serve_names_the_extra_it_misses_before_starting_anything(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    options: ServiceOptions,
    missing: str,
    extra: str,
) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == missing else found(name, *a)
    )
    state = tmp_path / "state"
    with pytest.raises(MissingExtra) as raised:
        Service(Settings(state_dir=state), options).prepare()
    assert f"pip install 'runwarden[{extra}]'" in str(raised.value)
    assert missing in str(raised.value)
    assert not state.exists()  # nothing started, not even the state directory


def test_serve_behind_sentinel_starts_no_redis_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a `sentinel://` URL serve starts no Redis (docs/operations.md): no embedded
    server made or supervised, no command of a Redis; the web view and the workers
    connect as serve does, through the sentinels."""

    class NoEmbedded:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("an embedded Redis made behind Sentinel")

    class NoStore:
        def __init__(self, settings: Settings) -> None:
            self.settings = settings

        def resign_targets(self) -> list[str]:
            return []

    monkeypatch.setattr("producers.service.EmbeddedRedis", NoEmbedded)
    monkeypatch.setattr("producers.service.Runwarden", NoStore)
    url = "sentinel://127.0.0.1:1,127.0.0.1:2/runwarden"
    settings = Settings(state_dir=tmp_path / "state", redis_url=url)  # type: ignore[arg-type]
    service = Service(settings, ServiceOptions())
    assert service.embedded is None
    try:
        said = service.prepare()
    finally:
        service._stop()
    assert not [line for line in said if line.startswith("redis")], said
    assert [c.name for c in service._supervisor.children] == []
    assert not [c for c in service.commands() if any("redis" in word for word in c)]
    assert all(c.env == service.env for c in service._processes())  # as serve, no `worker`
    assert Service(settings, ServiceOptions(web=True)).web_settings() is settings
