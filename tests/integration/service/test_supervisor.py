"""`runwarden serve` as a supervisor, with real processes (serve as a subprocess, its
embedded redis-server, Celery workers, beat, Flower): a child killed with `kill -9`
(beat, a worker, Flower) is started again with a line on stderr, and `runwarden
status` counts the restart; `kill -9` of serve's whole process group, or of serve,
leaves no process behind, and the next serve starts on the same state directory.

One serve (with Flower) is shared by the module; the last test kills its group."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.harness.ports import free_port
from producers.health import read_health
from schemas import Settings

from ...conftest import ROOT, wait_for

SERVE_UP_S = 60.0
"""Longest wait for a serve to answer (worker imports on a loaded machine)."""


def _env(state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWARDEN_")}
    env.update(RUNWARDEN_STATE_DIR=str(state_dir), PYTHONPATH=str(ROOT))
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "producers.cli", *args],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


def _status(env: dict[str, str], *, cli: bool = False) -> dict[str, Any]:
    """What `runwarden status --json` prints: read in this process (no interpreter to
    start at each poll), or with `cli` from the command itself."""
    if cli:
        report: dict[str, Any] = json.loads(_cli(env, "status", "--json").stdout)
        return report
    settings = Settings(state_dir=Path(env["RUNWARDEN_STATE_DIR"]), redis_url=None)
    return read_health(settings, timeout_s=2).model_dump(mode="json")


def _children(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """serve's children by name, from `status --json` (empty without a serve)."""
    serves = report.get("serve") or []
    return {c["name"]: c for s in serves for c in s["children"]}


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is dead: only its reaping is late)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(pid: int) -> set[int]:
    """Every live process under `pid` (its children, theirs, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {p for p in found if _alive(p)}


@dataclass
class Serve:
    """A `runwarden serve` started by a test, its output in `log`."""

    proc: subprocess.Popen[bytes]
    env: dict[str, str]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_up(self) -> dict[str, Any]:
        """Waits until `status` is ok with every child of serve up; returns the report."""

        def up() -> dict[str, Any] | None:
            assert self.proc.poll() is None, self.text()
            report = _status(self.env)
            children = _children(report)
            if report["ok"] and children and all(c["state"] == "up" for c in children.values()):
                return report
            time.sleep(0.2)
            return None

        report: dict[str, Any] = wait_for(up, timeout_s=SERVE_UP_S)  # type: ignore[assignment]
        return report

    def stop(self) -> int:
        """Ctrl-C; returns its exit code (kills its group if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise


def start_serve(state_dir: Path, log: Path, *args: str) -> Serve:
    env = _env(state_dir)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "producers.cli", "serve", "--concurrency", "1", *args],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # a group of its own, as in a terminal
        )  # fmt: skip
    return Serve(proc, env, log)


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    tmp = tmp_path_factory.mktemp("supervised")
    started = start_serve(
        tmp / "state", tmp / "serve.log", "--flower", "--flower-port", str(free_port())
    )
    try:
        started.wait_up()
        yield started
    finally:
        if started.proc.poll() is None:  # the last test kills it
            assert started.stop() == 0, started.text()


def _live(serve: Serve, role: str, name: str, pid: Callable[[int], bool]) -> bool:
    """Whether a process of `role` named `name...` with a `pid` as wanted has a live
    heartbeat (a killed one's lives on up to 3 s)."""
    processes = _status(serve.env)[role]
    return any(p["alive"] and p["name"].startswith(name) and pid(p["pid"]) for p in processes)


def _kill_and_see_restarted(serve: Serve, name: str, pid: int, shown_pid: int) -> dict[str, Any]:
    """Kills `pid` (of serve's child `name`, shown by serve as `shown_pid`) with SIGKILL;
    waits for the line saying so and the one of the restart, then for `status` to be
    ok with the child up again under a new pid, restarted once more; returns its row."""
    before = _children(_status(serve.env))[name]["restarts"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: f"serve: {name} (pid {shown_pid}) " in serve.text(), timeout_s=10)
    wait_for(
        lambda: f"serve: {name} restarted (pid " in serve.text().split(f"(pid {shown_pid}) ")[-1]
    )
    report = serve.wait_up()
    row = _children(report)[name]
    assert row["restarts"] == before + 1, row
    assert row["pid"] != shown_pid, row
    assert row["last_end_age_s"] is not None, row
    assert row["last_end_age_s"] < 60, row
    assert not _alive(pid)
    return row


def test_a_killed_beat_is_restarted_and_counted(serve: Serve) -> None:
    beat = _children(serve.wait_up())["beat"]["pid"]
    row = _kill_and_see_restarted(serve, "beat", beat, beat)
    assert row["last_end"] == "killed by SIGKILL", row
    wait_for(lambda: _live(serve, "beats", "beat@", lambda pid: pid == row["pid"]), timeout_s=30)
    assert f"serve: beat (pid {beat}) killed by SIGKILL; restarting it in 1 s" in serve.text()
    # The table says it too.
    table = _cli(serve.env, "status").stdout
    [line] = [x for x in table.splitlines() if x.split()[:3] == ["child", "up", "beat"]]
    assert "1 restart(s), last killed by SIGKILL" in line, table
    assert serve.proc.poll() is None


def test_a_killed_worker_is_restarted_and_counted(serve: Serve) -> None:
    report = serve.wait_up()
    # The worker's own process, as `status` shows it (under serve's reaper).
    [celery] = [
        w["pid"] for w in report["workers"] if w["name"].startswith("watch@") and w["alive"]
    ]
    reaper = _children(report)["watch worker"]["pid"]
    pool = _descendants(celery)
    assert pool, "the worker has its pool processes"
    row = _kill_and_see_restarted(serve, "watch worker", celery, reaper)
    assert row["last_end"] == "exited with code 137 (128 + SIGKILL)", row
    # Nothing of the killed worker is left (its pool dies with it), and a new one serves.
    wait_for(lambda: not any(_alive(p) for p in pool | {reaper}), timeout_s=10)
    wait_for(lambda: _live(serve, "workers", "watch@", lambda pid: pid != celery), timeout_s=30)


def test_a_killed_flower_is_restarted_and_counted(serve: Serve) -> None:
    flower = _children(serve.wait_up())["flower"]["pid"]
    row = _kill_and_see_restarted(serve, "flower", flower, flower)
    assert row["last_end"] == "killed by SIGKILL", row
    # `status --json` carries the restarts.
    children = _children(_status(serve.env, cli=True))
    assert children["flower"]["restarts"] == 1, children
    assert children["beat"]["restarts"] >= 1, children


def test_kill_9_of_serves_group_or_of_serve_leaves_nothing_and_the_next_serve_starts(
    serve: Serve,
) -> None:
    state, log = Path(serve.env["RUNWARDEN_STATE_DIR"]), serve.log
    serve.wait_up()
    left = _descendants(serve.proc.pid)
    assert len(left) >= 5, left  # redis, three workers (and their pools), beat, flower
    # Its whole group: serve alone (each child is in a session of its own). The next
    # serve starts at once, while the last one's Redis may still be ending.
    os.killpg(serve.proc.pid, signal.SIGKILL)
    serve.proc.wait()
    serves = [start_serve(state, log)]
    try:
        wait_for(lambda: not any(_alive(p) for p in left), timeout_s=30)
        serves[0].wait_up()
        # kill -9 of serve: nothing left either, its Redis gone with it.
        left = _descendants(serves[0].proc.pid)
        serves[0].proc.send_signal(signal.SIGKILL)
        serves[0].proc.wait()
        wait_for(lambda: not any(_alive(p) for p in left), timeout_s=30)
        assert _cli(serve.env, "runs").returncode == 1  # "nothing is serving"
        serves.append(start_serve(state, log))
        serves[1].wait_up()
        left = _descendants(serves[1].proc.pid)
        assert serves[1].stop() == 0, serves[1].text()
        wait_for(lambda: not any(_alive(p) for p in left), timeout_s=10)
    finally:
        for started in serves:
            if started.proc.poll() is None:
                os.killpg(started.proc.pid, signal.SIGKILL)
                started.proc.wait()
