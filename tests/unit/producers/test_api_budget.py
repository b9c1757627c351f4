"""`producers.api.Runwarden.next_stop_budget`: a producer predicts a stop's timeouts
by the rule the workers published (their settings), never its own environment's,
unless no worker published one, and says which."""

from __future__ import annotations

import fakeredis

from producers.api import Runwarden
from schemas import Settings
from schemas.budget import StopTimeouts, TimeoutSource
from store import RunStore

from ..conftest import record


def client(**settings: float) -> Runwarden:
    api = Runwarden(Settings(**settings))  # type: ignore[arg-type]
    api._store = RunStore(fakeredis.FakeRedis(server=fakeredis.FakeServer()))
    return api


def test_the_next_stop_is_predicted_by_the_workers_rule() -> None:
    api = client(proof_timeout_s=1800, end_timeout_s=600)
    run = record()
    assert api.store.runs.create(run)
    budget, where = api.next_stop_budget(run)
    assert (budget.proof_timeout_s, budget.source) == (1800, TimeoutSource.DEFAULT)
    assert where == "this client's settings: no worker has published its own"

    workers = Settings(proof_timeout_s=10, end_timeout_s=4)
    api.store.budgets.publish_rule("w1@host", workers.budget_rule)
    budget, where = api.next_stop_budget(run)
    assert (budget.proof_timeout_s, budget.end_timeout_s) == (10, 4)
    assert "the configured 10 s" in budget.why
    assert where == "the workers' settings (w1@host)"

    own = record(id="r2", timeouts=StopTimeouts(proof_timeout_s=45))
    assert api.store.runs.create(own)
    budget, _ = api.next_stop_budget(own)
    assert (budget.proof_timeout_s, budget.end_timeout_s) == (45, 4)  # the end: the workers'
