"""The hostile-job matrix (test_hostile_jobs.py) on an SSH target whose jobs run as a
user of their own (`run_as`): a real sshd whose only login is the control user, the
jobs started through `sudo -n` with the sudoers line docs/security.md gives, no cgroup
over SSH (the `env -i` daemon is the expected failure it is on the plain SSH target).
The matrix's tests are collected again here, its per-case test over `RUN_AS_CASES`, in
a module of its own, so a test process of its own runs this campaign beside the
others."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .test_hostile_jobs import *  # noqa: F403 - the matrix's tests, collected here again
from .test_hostile_jobs import (
    MODES,
    RUN_AS_CASES,
    Campaign,
    Case,
    campaign_on,
    check_outcome,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["ssh-runas"])
def campaign(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Campaign]:
    yield from campaign_on(request, tmp_path_factory, request.param, RUN_AS_CASES)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", RUN_AS_CASES, ids=[c.name for c in RUN_AS_CASES])
def test_a_hostile_job_s_stop_ends_cancelled_on_time_and_leaves_nothing(
    campaign: Campaign, case: Case, mode: str, request: pytest.FixtureRequest
) -> None:
    """The matrix's check (`check_outcome`), over the run-as cases (`RUN_AS_CASES`)."""
    check_outcome(campaign, case, mode, request)
