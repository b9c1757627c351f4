"""The run page's ledger: a small table of the run's events, newest first, with
job-written text escaped (the web view over a fakeredis store, as in test_app)."""

from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient

from schemas import RunState, SnapshotReason
from schemas.ledger import CancelDecided, RunEnded, StopOpened

from .test_app import HOSTILE, NOW, RecordingRunwarden, api, client, make_run, server

__all__ = ["api", "client", "server"]  # the fixtures this module uses from test_app


def test_the_run_page_shows_the_ledger_newest_first(
    api: RecordingRunwarden, client: TestClient
) -> None:
    make_run(api, "r1")
    assert "Nothing in the ledger yet." in client.get("/runs/r1").text
    stop, _ = api.store.stops.open("r1", SnapshotReason.COST, "policy:cost", NOW, 60)
    late = NOW + timedelta(seconds=61)
    ended = api.store.runs.transition("r1", RunState.CANCELLED, message=HOSTILE)
    for event in (StopOpened.of(stop), CancelDecided.of(stop, "no proof", late),
                  RunEnded.of(ended, late)):  # fmt: skip
        api.store.ledger.record(event)
    page = client.get("/runs/r1").text
    table = page[page.index('id="ledger"'):]
    table = table[: table.index("</table>")]
    rows = [kind for kind in ("run_ended", "cancel_decided", "stop_opened")
            if f'data-kind="{kind}"' in table]  # fmt: skip
    assert rows == ["run_ended", "cancel_decided", "stop_opened"]
    assert table.index('data-kind="run_ended"') < table.index('data-kind="stop_opened"')
    assert "cancel decided: proof timeout" in table
    assert "asked by policy:cost" in table
    assert stop.stop_id[:8] in table
    assert "<script>" not in table
    assert "&lt;script&gt;" in table
