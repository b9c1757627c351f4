"""The hostile-job matrix (test_hostile_jobs.py) on a local target whose jobs run as a
user of their own (`run_as`: the worker root, each run contained by its cgroup), over
`RUN_AS_CASES`, the matrix's tests collected again here: a module of its own, so a test
process of its own runs this campaign beside the others (test_hostile_jobs_ssh_runas.py:
an SSH one)."""

from __future__ import annotations

import pytest

from .test_hostile_jobs import *  # noqa: F403 - the matrix's tests, collected here again
from .test_hostile_jobs import run_as_campaign

pytestmark = pytest.mark.slow

campaign, test_a_hostile_job_s_stop_ends_cancelled_on_time_and_leaves_nothing = run_as_campaign(
    "runas"
)
