"""Bulk stops end to end (issue 23): real redis-server, Celery worker and beat
(bench/harness/pipeline.py, shortened clocks), toy trainers that honour stops, one
service for the module. Through the CLI (`stop --target --label`), the API
(`Runwarden.stop_many` by name glob) and a raw signed `send_task` of another producer:
each checks the summary, that every selected run ends `stopped` with its checkpoint,
and that the runs not selected keep running; a producer a target does not allow has
that target's runs refused, each with why, and cannot stop one of them singly either.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline, toy
from bench.harness.users import as_the_worker
from schemas import RunLimits, RunRecord, RunState, TargetConfig
from schemas.events import TASK_SNAPSHOT_REQUEST, TASK_STOP_MANY, LaunchSpec, StopManySummary

from ...conftest import ROOT, wait_for

pytestmark = pytest.mark.slow

TAG = secrets.token_hex(3)
"""In the runs' names: their ids unique to this module."""
TOY = ("--steps", "100000", "--step-time", "0.05")
BILLING = "billing"
"""A producer allowed on target `bulk-a` only (and on `local`, which names none)."""


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    tmp = tmp_path_factory.mktemp("bulk-stop")
    with running_pipeline(tmp) as started:
        for name, producers in (("bulk-a", (BILLING,)), ("bulk-b", ("ops",))):
            (tmp / name).mkdir()
            started.api.add_target(
                TargetConfig(
                    name=name,
                    kind="local",
                    workdir=str(tmp / name),
                    producers=producers,
                    **as_the_worker(),
                )
            )
        try:
            yield started
        finally:
            started.kill_jobs()


def launch(pipeline: Pipeline, name: str, target: str = "local", **labels: str) -> RunRecord:
    spec = LaunchSpec(target=target, name=f"{name}-{TAG}", command=toy(*TOY), labels=labels,
                      limits=RunLimits(disk=False))  # fmt: skip
    return pipeline.api.launch(spec, wait_s=60)


def launch_all(pipeline: Pipeline, *specs: tuple[str, str, dict[str, str]]) -> list[RunRecord]:
    with ThreadPoolExecutor(len(specs)) as pool:  # the worker's two processes at once
        runs = list(pool.map(lambda spec: launch(pipeline, spec[0], spec[1], **spec[2]), specs))
    for run in runs:
        pipeline.wait_step(run.id, 2)  # each job reads requests from now on
    return runs


def assert_stopped_with_checkpoint(pipeline: Pipeline, runs: list[RunRecord], reason: str) -> None:
    for run in runs:
        ended = pipeline.wait_state(run.id, timeout_s=60)
        assert ended.state is RunState.STOPPED, ended
        assert ended.snapshot is not None
        assert ended.snapshot.reason == reason
        assert (Path(run.remote_dir) / ended.snapshot.checkpoint).is_dir()


def assert_running(pipeline: Pipeline, runs: list[RunRecord]) -> None:
    for run in runs:
        now = pipeline.api.get_run(run.id)
        assert now.state is RunState.RUNNING, now
        assert pipeline.api.get_stop(run.id) is None
        assert not (Path(run.remote_dir) / "snapshot.request").exists()


def cancel(pipeline: Pipeline, runs: list[RunRecord]) -> None:
    for run in runs:
        pipeline.api.cancel(run.id)


def cli(pipeline: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "producers.cli", *args],
        env={**pipeline.env, "COLUMNS": "200"}, cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert "Traceback" not in result.stdout + result.stderr, result
    return result


def test_the_cli_stops_the_runs_of_a_label_and_no_other(pipeline: Pipeline) -> None:
    one, two, other, keep = launch_all(
        pipeline,
        ("cli-1", "local", {"sweep": f"cli{TAG}"}),
        ("cli-2", "local", {"sweep": f"cli{TAG}", "seed": "2"}),
        ("cli-3", "local", {"sweep": f"other{TAG}"}),
        ("cli-4", "bulk-a", {"sweep": f"cli{TAG}"}),  # another target
    )
    shown = json.loads(cli(pipeline, "show", two.id, "--json").stdout)
    assert shown["labels"] == {"seed": "2", "sweep": f"cli{TAG}"}
    result = cli(pipeline, "stop", "--target", "local", "--label", f"sweep=cli{TAG}",
                 "--reason", "cost", "--json")  # fmt: skip
    assert result.returncode == 0, result
    summary = StopManySummary.model_validate_json(result.stdout)
    assert sorted(summary.asked) == sorted([one.id, two.id])
    assert summary.already_stopping == summary.not_running == summary.refused == ()
    assert_stopped_with_checkpoint(pipeline, [one, two], "cost")
    assert_running(pipeline, [other, keep])
    # Asked again: both ended; nothing else is selected.
    again = cli(pipeline, "stop", "--target", "local", "--label", f"sweep=cli{TAG}")
    assert again.returncode == 0, again
    assert "asked: 0" in again.stdout
    assert "not running: 2" in again.stdout
    cancel(pipeline, [other, keep])


def test_the_cli_refuses_a_bad_selection_or_label_before_anything_is_done(
    pipeline: Pipeline,
) -> None:
    before = len(pipeline.api.list_runs())
    for args, why in (
        (["launch", "--target", "local", "--label", "sweep=a b", "--", "true"], "value 'a b'"),
        (["stop", "--target", "local"], "--all, --label or --name-glob"),
        (["stop", "--target", "local", "--label", "-x=1"], "label key '-x'"),
        (["stop", "--target", "nowhere", "--all"], "nowhere"),
    ):
        result = cli(pipeline, *args)
        assert result.returncode == 2, result
        assert why in result.stderr, result
    assert len(pipeline.api.list_runs()) == before


def test_the_api_stops_by_name_glob_and_says_what_is_not_running(pipeline: Pipeline) -> None:
    first, second, keep = launch_all(
        pipeline,
        ("api-x1", "local", {}),
        ("api-x2", "local", {}),
        ("api-y1", "local", {}),
    )
    summary = pipeline.api.stop_many("local", name_glob=f"api-x?-{TAG}")
    assert sorted(summary.asked) == sorted([first.id, second.id])
    assert summary.refused == ()
    assert_stopped_with_checkpoint(pipeline, [first, second], "requested")
    assert_running(pipeline, [keep])
    later = pipeline.api.stop_many(["local"], name_glob=f"api-*-{TAG}", asked_by="tests")
    assert later.asked == (keep.id,)
    assert sorted(later.not_running) == sorted([first.id, second.id])
    stop = pipeline.api.get_stop(keep.id)
    assert stop is not None
    assert stop.asked_by == "operator/tests"
    assert stop.proof_deadline > stop.asked_at  # its timers, as a single stop's
    assert_stopped_with_checkpoint(pipeline, [keep], "requested")


def test_a_raw_send_task_of_a_producer_stops_only_on_the_targets_it_may(
    pipeline: Pipeline,
) -> None:
    here, allowed, forbidden = launch_all(
        pipeline,
        ("raw-1", "local", {"sweep": f"raw{TAG}"}),
        ("raw-2", "bulk-a", {"sweep": f"raw{TAG}"}),
        ("raw-3", "bulk-b", {"sweep": f"raw{TAG}"}),
    )
    body = {"targets": ["local", "bulk-a", "bulk-b"], "labels": {"sweep": f"raw{TAG}"},
            "reason": "deadline", "asked_by": "nightly"}  # fmt: skip
    answer = pipeline.send(TASK_STOP_MANY, body, producer=BILLING).get(timeout=60)
    summary = StopManySummary.model_validate(answer)
    assert summary.asked == (here.id, allowed.id)
    assert [(r.run_id, r.why) for r in summary.refused] == [
        (forbidden.id, "producer 'billing' may not act on target 'bulk-b'")
    ]
    assert_stopped_with_checkpoint(pipeline, [here, allowed], "deadline")
    assert pipeline.api.ledger(allowed.id)[0].model_dump()["asked_by"] == "billing/nightly"
    assert_running(pipeline, [forbidden])
    # Nor singly: the same rule refuses the producer's single stop and cancel.
    for task in (TASK_SNAPSHOT_REQUEST, "runwarden.cancel"):
        with pytest.raises(Exception, match="may not act on target 'bulk-b'"):
            pipeline.send(task, {"run_id": forbidden.id}, producer=BILLING).get(timeout=30)
    assert_running(pipeline, [forbidden])
    wait_for(lambda: pipeline.api.get_run(forbidden.id).state is RunState.RUNNING)
    cancel(pipeline, [forbidden])
