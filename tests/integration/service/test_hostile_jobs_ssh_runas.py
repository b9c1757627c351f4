"""The hostile-job matrix (test_hostile_jobs.py) on an SSH target whose jobs run as a
user of their own (`run_as`): a real sshd whose only login is the control user, the
jobs started through `sudo -n` with the sudoers line docs/security.md gives, no cgroup
over SSH (the `env -i` daemon is the expected failure it is on the plain SSH target).
The matrix's tests are collected again here, its per-case test over `RUN_AS_CASES`, in
a module of its own, so a test process of its own runs this campaign beside the
others."""

from __future__ import annotations

import pytest

from .test_hostile_jobs import *  # noqa: F403 - the matrix's tests, collected here again
from .test_hostile_jobs import run_as_campaign

pytestmark = pytest.mark.slow

campaign, test_a_hostile_job_s_stop_ends_cancelled_on_time_and_leaves_nothing = run_as_campaign(
    "ssh-runas"
)
