"""The web view in a real browser, over the whole service: a real redis-server,
Celery worker and beat (bench/harness/pipeline.py), the toy trainer as the job, the view
served by uvicorn on a free loopback port, and Debian's Chromium driven by
Playwright (never a downloaded browser: `make system-deps` installs `chromium`).

An operator opens the runs page, sees the progress move, opens the run, stops it
(with the confirmation step), watches the countdown of the stop in flight fall, and
sees the run end `stopped`. Screenshots of each page go to `test-output/web/`.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect, sync_playwright

from bench.harness.pipeline import running_pipeline, toy
from producers.api import Runwarden
from producers.web import make_server
from schemas import RunState
from schemas.events import LaunchSpec

from ...conftest import ROOT

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
SHOTS = ROOT / "test-output" / "web"
USER, PASSWORD = "operator", "browser-pw 'quoted' $(x)"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# 300 steps of 0.25 s: the run is stopped long before its end (about 10 s in).
# The job proves at once and then hangs: its stop waits for the end deadline with
# both deadlines shown, then cancels, and the run ends stopped (the proof wins).
END_TIMEOUT_S = 20
_LEFT = re.compile(r"(in|overdue by) (?:(\d+) h (\d\d) min|(?:(\d+) min )?(\d+) s)")


@contextmanager
def serving(api: Runwarden) -> Iterator[str]:
    """The web view on a free loopback port, in a thread; yields its base URL."""
    server = make_server(api, "127.0.0.1", 0, user=USER, password=PASSWORD)
    thread = threading.Thread(target=server.run, name="web", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("the web view did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def seconds_left(text: str) -> int:
    """The seconds a countdown's text says are left (negative: overdue)."""
    match = _LEFT.fullmatch(text.strip())
    assert match, f"not a countdown: {text!r}"
    sign, hours, minutes_h, minutes, seconds = match.groups()
    total = int(hours) * 3600 + int(minutes_h) * 60 if hours else 0
    total += int(minutes or 0) * 60 + int(seconds or 0)
    return total if sign == "in" else -total


def step_of(row: Locator) -> int:
    value = row.locator(".progress-text").get_attribute("data-step")
    assert value, "no step shown"
    return int(value)


def shoot(page: Page, name: str) -> Path:
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def test_an_operator_follows_and_stops_a_run_in_a_real_browser(tmp_path: Path) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (`make system-deps`)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
    env = {"RUNWARDEN_END_TIMEOUT_S": str(END_TIMEOUT_S)}
    with (
        running_pipeline(tmp_path, extra_env=env) as pipeline,
        serving(pipeline.api) as base,
        sync_playwright() as playwright,
    ):
        command = toy("--steps", "300", "--step-time", "0.25", "--hang-after-proof")
        spec = LaunchSpec(target="local", command=command, name="web demo")
        run_id = pipeline.api.launch(spec, wait_s=60).id
        pipeline.wait_step(run_id, 2)
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            # Wrong credentials: the browser gets no page (the server answers 401).
            wrong = browser.new_context(http_credentials={"username": USER, "password": "x"})
            refused = wrong.new_page().goto(base + "/")
            assert refused is not None
            assert refused.status == 401
            wrong.close()
            context = browser.new_context(
                http_credentials={"username": USER, "password": PASSWORD},
                viewport={"width": 1280, "height": 800},
            )
            page = context.new_page()
            problems: list[str] = []
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.on(
                "console",
                lambda message: (
                    problems.append(f"console: {message.text}") if message.type == "error" else None
                ),
            )
            shots = []

            # The runs page: the progress moves by itself (the page refreshes).
            page.goto(base + "/")
            row = page.locator(f'tr[data-run="{run_id}"]')
            expect(row).to_be_visible()
            first = step_of(row)
            expect(row.locator(".progress-text")).not_to_have_attribute(
                "data-step", str(first), timeout=15_000
            )
            assert step_of(row) > first
            expect(page.locator("#live-status")).to_contain_text("live")
            shots.append(shoot(page, "1-runs"))

            # The run page: Stop, a confirmation step, then the stop in flight.
            row.locator(f'a[href="/runs/{run_id}"]').click()
            expect(page.locator("h1")).to_contain_text(run_id)
            page.select_option("#reason", "requested")
            page.click("#stop-button")
            expect(page.locator("h1")).to_contain_text("Stop run")
            assert pipeline.api.get_stop(run_id) is None  # nothing asked before confirming
            shots.append(shoot(page, "2-confirm-stop"))
            page.click("#confirm-button")
            expect(page.locator(".alert.notice")).to_contain_text("Snapshot asked")
            stop = page.locator("#open-stop")
            expect(stop).to_have_attribute("data-phase", "waiting_end", timeout=15_000)
            expect(stop).to_contain_text("web")
            expect(stop.locator(".end .countdown")).to_be_visible()
            shots.append(shoot(page, "3-run-with-stop"))

            # The stops page: the countdown to the end deadline falls, every second.
            page.goto(base + "/stops")
            countdown = page.locator(f'tr[data-run="{run_id}"] td.end .countdown')
            expect(countdown).to_be_visible()
            before = seconds_left(countdown.inner_text())
            assert 0 < before <= END_TIMEOUT_S
            page.wait_for_timeout(2_200)
            after = seconds_left(countdown.inner_text())
            assert before - 4 <= after < before, (before, after)
            shots.append(shoot(page, "4-stops-in-flight"))

            # The end: cancelled at the end deadline, stopped with its snapshot.
            page.goto(f"{base}/runs/{run_id}")
            expect(page.locator("#run-state")).to_have_attribute(
                "data-state", "stopped", timeout=(END_TIMEOUT_S + 40) * 1000
            )
            expect(page.locator("#no-stop")).to_be_visible(timeout=10_000)
            expect(page.locator('section[data-live="history"]')).to_contain_text("web")
            expect(page.locator('section[data-live="actions"]')).to_contain_text("has ended")
            shots.append(shoot(page, "5-final-stopped"))
            assert not problems, problems
        finally:
            browser.close()
            pipeline.kill_jobs()
        run = pipeline.api.get_run(run_id)
        assert run.state is RunState.STOPPED, run
        assert run.snapshot is not None
        # Signed by the operator's key, from the web view.
        assert pipeline.api.store.stops.history(run_id)[0].asked_by == "operator/web"
    for path in shots:
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC), path
        assert len(data) > 5_000, path
