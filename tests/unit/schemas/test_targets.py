"""`schemas.targets`: a local target may name the user its jobs run as; the name is
checked, and an SSH target refuses one."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas import SshOptions, TargetConfig, check_user_name


@pytest.mark.parametrize("name", ["rwjob", "_svc", "Train.er-1", "a", "u" * 32])
def test_a_user_name_is_kept(name: str) -> None:
    config = TargetConfig(name="here", kind="local", workdir="/srv/runs", run_as=name)
    assert config.run_as == name
    assert check_user_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-u",  # an option to sudo, runuser
        "0day",  # a uid to some tools
        "#1000",  # sudo's uid syntax
        "machine$",
        "u" * 33,
        "sp ace",
        "quo'te",
        "$(touch PWNED)",
        "`id`",
        "new\nline",
        "name\n",
        "a/b",
        "a:b",
        "ünï",
    ],
)
def test_a_name_that_is_not_a_user_name_is_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="is not a user name"):
        TargetConfig(name="here", kind="local", workdir="/srv/runs", run_as=name)


def test_root_is_said_explicitly_and_is_no_user_to_change_to() -> None:
    """`run_as: root` is the operator's word that a root worker may run the target's
    jobs as root; it never names a user to change to."""
    here = TargetConfig(name="here", kind="local", workdir="/srv/runs", run_as="root")
    assert here.jobs_as_root
    assert not TargetConfig(name="here", kind="local", workdir="/srv/runs").jobs_as_root
    with pytest.raises(ValueError, match="run_as root protects nothing"):
        check_user_name("root")


def test_an_ssh_target_runs_its_jobs_as_a_user_of_theirs_never_as_root() -> None:
    ssh = SshOptions(destination="u@h")
    config = TargetConfig(name="gpu", kind="ssh", workdir="/srv/runs", ssh=ssh, run_as="rwjob")
    assert config.run_as == "rwjob"
    assert not config.jobs_as_root
    with pytest.raises(ValidationError, match="run_as root is for local targets"):
        TargetConfig(name="gpu", kind="ssh", workdir="/srv/runs", ssh=ssh, run_as="root")


def test_a_stored_target_without_run_as_still_reads() -> None:
    config = TargetConfig.model_validate({"name": "old", "kind": "local", "workdir": "/w"})
    assert config.run_as is None
    assert config.model_dump(mode="json")["run_as"] is None
