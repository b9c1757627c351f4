"""The hostile-job matrix (test_hostile_jobs.py) on an SSH target whose jobs run as a
user of their own (`run_as`): a real sshd whose only login is the control user, not
root, its sessions in a cgroup delegated to it and the user a member of the jobs'
user's group, the jobs started through `sudo -n` with the sudoers line
docs/security.md gives: each run in a cgroup of its own, which the `env -i` daemon
cannot leave.
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
