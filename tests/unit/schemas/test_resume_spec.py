"""`schemas.events.resume_spec`: what `runwarden resume` and the continuation of a
preempted run launch. Every per-run launch setting of the source is kept, its own
`--preemption` included on any target; a setting added to the launch is kept too, or
this module says which one is not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schemas import Preemption, RunLimits, RunRecord, RunState
from schemas.budget import StopTimeouts
from schemas.chain import OnPreempt
from schemas.events import NOT_KEPT, RECORD_FIELD, LaunchSpec, launch_settings, resume_spec

from ..conftest import record

OWN = {
    "name": "gpt",
    "upload": "/src/gpt",
    "skip": ("data",),
    "secrets": ("HF_TOKEN",),
    "limits": RunLimits(max_hours=2),
    "timeouts": StopTimeouts(proof_timeout_s=45, end_timeout_s=20),
    "snapshots": True,
    "on_preempt": OnPreempt(targets=("a", "b"), max_preemptions=2),
}


def source(**changes: Any) -> RunRecord:
    return record(state=RunState.STOPPED, **{**OWN, **changes})


def test_every_launch_setting_is_kept_on_the_record() -> None:
    # A launch field the record does not keep could not be resumed with: add it to
    # `RunRecord` (set by the launch), or to `NOT_KEPT` when a resume must not copy it.
    kept = {RECORD_FIELD.get(name, name) for name in LaunchSpec.model_fields} - NOT_KEPT
    missing = sorted(kept - set(RunRecord.model_fields))
    assert missing == []


@pytest.mark.parametrize("target", [None, "local", "b"], ids=["own", "same", "another"])
def test_a_resume_keeps_every_per_run_setting(target: str | None) -> None:
    run = source(preemption_mode="gcp", preemption=Preemption(cloud="gcp"))
    spec = resume_spec(run, target=target, key="continue.r1")
    assert spec.target == (target or "local")
    assert (spec.command, spec.resume_from, spec.key) == ("true", "r1", "continue.r1")
    assert spec.preemption == "gcp"  # the run's own, wherever it goes
    for name, value in OWN.items():
        wanted = Path(value) if name == "upload" else value
        assert getattr(spec, name) == wanted, name
    settings = launch_settings(run)
    assert set(settings) == set(LaunchSpec.model_fields) - NOT_KEPT


def test_a_run_s_own_off_is_kept_elsewhere() -> None:
    assert resume_spec(source(preemption_mode="off"), target="b").preemption == "off"


def test_a_target_s_setting_is_that_of_the_target_run_on() -> None:
    took = source(preemption=Preemption(cloud="aws"))  # no own mode: the target's
    assert resume_spec(took).preemption == "aws"
    assert resume_spec(took, target="b").preemption is None
    assert resume_spec(source(), target="b").preemption is None
