"""The hostile-job matrix (test_hostile_jobs.py) on a local target whose jobs run as a
user of their own (`run_as`: the worker root, each run contained by its cgroup), every
test of it collected again here: a module of its own, so a test process of its own
runs this campaign beside the others (test_hostile_jobs_ssh_runas.py: an SSH one)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .test_hostile_jobs import *  # noqa: F403 - the matrix's tests, collected here again
from .test_hostile_jobs import Campaign, campaign_on

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["runas"])
def campaign(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Campaign]:
    yield from campaign_on(request, tmp_path_factory, request.param)
