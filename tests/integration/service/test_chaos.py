"""A short, seeded chaos campaign (bench/harness/chaos.py; the long one is bench/chaos.py):
16 runs, 11 drawn from the hostile-job matrix and honest toy trainers and 5 always
there (`ALWAYS`), on the local target and an SSH target (a real sshd), 8 at once,
while faults are injected in a fixed order: a duplicate and late burst of task
messages, kill -9 of a worker (and a restart), kill -9 of beat (and a restart), a
Redis restart (AOF), sshd killed mid-command (and started again).

Every run must end in the state its plan calls for, its job's group must have had
at most one SIGTERM per cancel, nothing of its job may be alive afterwards, one job
launched for it; no file may be written outside a run or artifact directory.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.harness.chaos import Campaign, Plan, draw_plans, running_campaign
from bench.harness.hostile import CASES

pytestmark = pytest.mark.slow

SEED = 20261130
RUNS = 16
ALWAYS = (
    ("local", "setsid-child", "stop"),
    ("ssh", "nohup-daemon", "deadline"),
    ("local", "forged-exit-code", "stop"),
    ("ssh", None, "cancel"),
    ("local", None, "stop-hang"),
)
"""Runs every campaign here has, beside the drawn ones: processes leaving the group,
a forged end, an honest cancel and an end deadline."""


def plans() -> list[Plan]:
    drawn = draw_plans(random.Random(SEED), RUNS - len(ALWAYS), ["local", "ssh"])
    cases = {case.name: case for case in CASES}
    return drawn + [
        Plan(len(drawn) + i, target, cases[name] if name else None, action)
        for i, (target, name, action) in enumerate(ALWAYS)
    ]


FAULT_ORDER = ("messages", "kill-worker", "kill-beat", "restart-redis", "kill-sshd", "messages")


def test_a_short_chaos_campaign_breaks_no_invariant(tmp_path: Path) -> None:
    with running_campaign(tmp_path, SEED, ssh=True) as campaign:
        injected: list[str] = []

        def faults(campaign: Campaign) -> None:
            time.sleep(4.0)  # the first runs are up
            for kind in FAULT_ORDER:
                campaign.inject(kind)
                injected.append(kind)
                time.sleep(2.0)

        injector = threading.Thread(target=faults, args=(campaign,), daemon=True)
        injector.start()
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(campaign.run, plans()))
        injector.join(120)
        violations = campaign.finish()

    assert injected == list(FAULT_ORDER)
    assert len(results) == RUNS
    broken = {f"{r.plan.name} {r.run_id}": r.violations for r in results if r.violations}
    assert broken == {}
    assert violations == []
    # The campaign did what it says: every kind of run, cancels that were counted.
    assert {r.plan.case is None for r in results} == {True, False}
    cancelled = [r for r in results if r.cancels]
    assert cancelled
    assert all(r.terms <= r.cancels for r in cancelled)
    assert campaign.deadlines, "no deadline fired"
