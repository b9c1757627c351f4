"""`schemas.job`: the JSON shapes of `JobId`, `Container` and `JobStatus`, shared with
overbrainer's serde types (docs/protocol.md), and `JobCommand`'s checks."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from schemas import Container, JobCommand, JobId, JobStatus, check_pid, check_secret_name
from schemas.events import LaunchSpec
from schemas.job import SHELL_NAMES
from schemas.protocol import MARK_FORM, mark_entry, new_mark

# --- JobId and Container, shared with overbrainer's serde types -------------------


def test_job_id_shape_round_trips() -> None:
    text = '{"dir":"/w/r1","pid":42,"container":null}'
    job = JobId.model_validate_json(text)
    assert job == JobId(dir="/w/r1", pid=42)
    assert job.model_dump_json() == text
    assert json.loads(job.model_dump_json()) == {"dir": "/w/r1", "pid": 42, "container": None}
    assert JobId.model_validate({"dir": "/w/r1", "pid": 42}) == job  # serde: Option defaults


def test_job_id_with_a_container() -> None:
    text = '{"dir":"/w/r1","pid":42,"container":{"engine":"docker","name":"x"}}'
    job = JobId.model_validate_json(text)
    assert job.container == Container(engine="docker", name="x")
    assert job.model_dump_json() == text
    assert Container(engine="podman", name="a.b_c-1").model_dump() == {
        "engine": "podman",
        "name": "a.b_c-1",
    }


@pytest.mark.parametrize("pid", [0, 1, -5, True, False, "42", 42.0, None, 2**31, 2**40])
def test_job_id_refuses_bad_pids(pid: Any) -> None:
    with pytest.raises(ValidationError):
        JobId.model_validate({"dir": "/w/r1", "pid": pid, "container": None})
    with pytest.raises(ValidationError):
        JobId.model_validate_json(json.dumps({"dir": "/w/r1", "pid": pid, "container": None}))


@pytest.mark.parametrize("pid", [2, 42, 2**31 - 1])
def test_job_id_accepts_valid_pids(pid: int) -> None:
    assert JobId(dir="/w", pid=pid).pid == pid
    assert check_pid(pid) == pid


@pytest.mark.parametrize("directory", ["w/r1", "", "./r1", "/w/r\0"])
def test_job_id_refuses_a_bad_dir(directory: str) -> None:
    with pytest.raises(ValidationError):
        JobId(dir=directory, pid=42)


def test_job_id_dir_may_hold_any_other_character() -> None:
    hostile = "/w/r $(touch PWNED) 'q' \"d\" `x` ;&|<>*\n"
    job = JobId(dir=hostile, pid=42)
    assert JobId.model_validate_json(job.model_dump_json()) == job


MARK = "0123456789abcdef" * 2


@pytest.mark.parametrize(
    "cgroup",
    [
        "/sys/fs/cgroup/unified",  # the hierarchy itself
        "/sys/fs/cgroup/unified/system.slice",  # every service of the machine
        f"/sys/fs/cgroup/system.slice/{MARK}",
        f"/sys/fs/cgroup/runwarden/{MARK[:31]}",
        f"/sys/fs/cgroup/runwarden/{MARK}/child",
        f"/sys/fs/cgroup/runwarden/../system.slice/runwarden/{MARK}/..",
        f"/sys/fs/cgroup/x/../runwarden/{MARK}",
        f"sys/fs/cgroup/runwarden/{MARK}",
    ],
)
def test_job_id_takes_no_cgroup_but_a_run_s(cgroup: str) -> None:
    """A cancel ends every process of the job's cgroup as root: a record written into
    Redis by anyone else can never make it another directory."""
    with pytest.raises(ValidationError, match="not a run's cgroup"):
        JobId(dir="/w/r", pid=4242, cgroup=cgroup)
    ok = f"/sys/fs/cgroup/unified/runwarden/{MARK}"
    assert JobId(dir="/w/r", pid=4242, cgroup=ok).cgroup == ok


@pytest.mark.parametrize(
    "container",
    [
        {"engine": "Docker", "name": "x"},
        {"engine": "lxc", "name": "x"},
        {"engine": "docker", "name": ""},
        {"engine": "docker", "name": "-x"},
        {"engine": "docker", "name": "x y"},
        {"engine": "docker", "name": "x;rm"},
        {"engine": "docker", "name": "x" * 129},
        {"engine": "docker"},
    ],
)
def test_container_refuses_bad_values(container: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        Container.model_validate(container)


# Regression (found by review, failed before its fix): a `JobId` with a field it does not know
# reads, as serde reads it.
def test_job_id_ignores_unknown_fields_like_serde() -> None:
    job = JobId.model_validate_json('{"dir":"/w/r1","pid":42,"container":null,"new":1}')
    assert job.pid == 42


# --- JobStatus, shared with overbrainer's serde type ------------------------------


@pytest.mark.parametrize(
    ("status", "shape"),
    [
        (JobStatus.RUNNING, "running"),
        (JobStatus.exited(3), {"exited": 3}),
        (JobStatus.exited(0), {"exited": 0}),
        (JobStatus.exited(-1), {"exited": -1}),
        (JobStatus.exited(2**31 - 1), {"exited": 2**31 - 1}),
        (JobStatus.exited(-(2**31)), {"exited": -(2**31)}),
        (JobStatus.CANCELLED, "cancelled"),
        (JobStatus.LOST, "lost"),
    ],
)
def test_job_status_shapes_both_ways(status: JobStatus, shape: str | dict[str, int]) -> None:
    assert status.model_dump() == shape
    assert json.loads(status.model_dump_json()) == shape
    assert JobStatus.model_validate(shape) == status
    assert JobStatus.model_validate_json(json.dumps(shape)) == status


@pytest.mark.parametrize(
    "shape",
    [
        "exited",
        "Running",
        "done",
        "",
        {"exited": 2**31},
        {"exited": -(2**31) - 1},
        {"exited": 1.5},
        {"exited": None},
        {"exited": [3]},
        {"exited": 3, "running": 1},
        {"running": None},
        {"kind": "running", "code": 3},
        {"kind": "exited"},
        None,
        3,
    ],
)
def test_job_status_refuses_other_shapes(shape: Any) -> None:
    with pytest.raises(ValidationError):
        JobStatus.model_validate(shape)
    with pytest.raises(ValidationError):
        JobStatus.model_validate_json(json.dumps(shape))


def test_job_status_properties() -> None:
    assert not JobStatus.RUNNING.is_finished
    assert JobStatus.exited(0).is_finished
    assert JobStatus.CANCELLED.is_finished
    assert JobStatus.LOST.is_finished
    assert str(JobStatus.exited(3)) == "exited(3)"
    assert str(JobStatus.LOST) == "lost"
    assert JobStatus.exited(3) == JobStatus.model_validate({"exited": 3})
    assert JobStatus.exited(3) != JobStatus.exited(4)


# Regression (found by review, failed before its fix): a `JobStatus` is refused wherever serde
# refuses it (no coercion of strings, booleans, floats or null).
@pytest.mark.parametrize(
    "raw", ['{"exited":"3"}', '{"exited":true}', '{"exited":3.0}', '{"exited":null}', '"exited"']
)
def test_job_status_is_as_strict_as_serde(raw: str) -> None:
    with pytest.raises(ValidationError):
        JobStatus.model_validate_json(raw)


# --- job commands -----------------------------------------------------------------


def test_job_command_accepts_valid_input() -> None:
    job = JobCommand(
        dir="/w/r $(x)",
        script="echo 'hi'",
        env={"RUNWARDEN_SNAPSHOT_REQUEST": "/w/r/snapshot.request", "_X1": "a\nb"},
        secrets={"HF_TOKEN": SecretStr("s3cr3t $(x) 'q'")},
    )
    assert job.secrets["HF_TOKEN"].get_secret_value() == "s3cr3t $(x) 'q'"
    assert "s3cr3t" not in repr(job)
    assert "s3cr3t" not in str(job)


@pytest.mark.parametrize(
    "name", ["", "1ABC", "A-B", "A B", "A=B", "A\nB", "é", "A$", "$(x)", "A\0"]
)
def test_job_command_refuses_bad_env_names(name: str) -> None:
    with pytest.raises(ValidationError, match="environment variable name"):
        JobCommand(dir="/w/r", script="true", env={name: "x"})
    with pytest.raises(ValidationError, match="environment variable name"):
        JobCommand(dir="/w/r", script="true", secrets={name: SecretStr("x")})


@pytest.mark.parametrize("value", ["hunter2\nmore", "hunter2\r", "\0hunter2", "a\r\nhunter2"])
def test_job_command_refuses_bad_secret_values_naming_the_variable(value: str) -> None:
    with pytest.raises(ValidationError) as raised:
        JobCommand(dir="/w/r", script="true", secrets={"HF_TOKEN": SecretStr(value)})
    messages = [error["msg"] for error in raised.value.errors(include_input=False)]
    assert messages == ["Value error, HF_TOKEN cannot be passed to the job"]
    assert all("hunter2" not in message for message in messages)
    assert "hunter2" not in str(raised.value)


# Regression (found by review, failed before its fix): the value of a rejected secret never appears
# in the error (its name does).
def test_a_rejected_secret_value_never_appears_in_the_error() -> None:
    with pytest.raises(ValidationError) as raised:
        JobCommand(dir="/w/r", script="true", secrets={"HF_TOKEN": "hunter2\n"})  # type: ignore[dict-item]
    assert "hunter2" not in str(raised.value)
    assert "hunter2" not in raised.value.json()
    assert "HF_TOKEN" in str(raised.value)


def test_job_command_refuses_nul_in_env_values_and_scripts() -> None:
    with pytest.raises(ValidationError, match="NAME cannot hold a NUL byte"):
        JobCommand(dir="/w/r", script="true", env={"NAME": "a\0b"})
    with pytest.raises(ValidationError, match="NUL"):
        JobCommand(dir="/w/r", script="echo \0")
    with pytest.raises(ValidationError):
        JobCommand(dir="/w/r", script="")


@pytest.mark.parametrize("directory", ["relative", "", "./w", "~/w", "w/../r", "/w/r\0"])
def test_job_command_refuses_a_bad_dir(directory: str) -> None:
    with pytest.raises(ValidationError):
        JobCommand(dir=directory, script="true")


def test_job_command_forbids_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        JobCommand.model_validate({"dir": "/w", "script": "true", "argv": ["x"]})


def test_job_command_fields() -> None:
    command = JobCommand(dir="/w/r", script="true")
    assert command.deadline_request_after_s is None
    assert command.watchdog_poll_s == 5.0
    command = JobCommand.model_validate(
        {"dir": "/w/r", "script": "true", "deadline_request_after_s": 0.5, "watchdog_poll_s": 0.2}
    )
    assert command.deadline_request_after_s == 0.5
    assert command.watchdog_poll_s == 0.2
    for bad in ({"deadline_request_after_s": 0}, {"deadline_request_after_s": float("nan")},
                {"deadline_request_after_s": 1e10}, {"watchdog_poll_s": 0},
                {"watchdog_poll_s": float("inf")}):  # fmt: skip
        with pytest.raises(ValueError, match=next(iter(bad))):
            JobCommand(dir="/w/r", script="true", **bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(SHELL_NAMES))
def test_a_secret_a_shell_sets_by_itself_is_refused_naming_why(name: str) -> None:
    """Every shell on a job's way resets `IFS` (and `PWD`, `PPID`; `cd` sets `OLDPWD`;
    `OPTIND` must be a number): such a secret would reach the job changed or not at
    all, so the launch and the job are refused with the reason. An env variable of
    that name (runwarden's own) is left alone."""
    message = f"a secret cannot be named {name}: the shells that start the job set it"
    with pytest.raises(ValidationError, match=message):
        JobCommand(dir="/w/r", script="true", secrets={name: SecretStr("x")})
    with pytest.raises(ValidationError, match=message):
        LaunchSpec(target="t", command="true", secrets=(name,))
    assert JobCommand(dir="/w/r", script="true", env={name: "x"}).env == {name: "x"}
    assert check_secret_name(f"{name}_") == f"{name}_"


@pytest.mark.parametrize("name", ["RUNWARDEN_RUN_ID", "RUNWARDEN_MARK", "RUNWARDEN_X"])
def test_a_secret_named_as_the_service_s_own_variables_is_refused(name: str) -> None:
    """Set last, a secret `RUNWARDEN_MARK` (or any `RUNWARDEN_*`) would replace the run's
    mark or id in its processes: its cancel would miss them, or another run's take them."""
    message = f"a secret cannot be named {name}: RUNWARDEN_\\* are the service's own"
    with pytest.raises(ValidationError, match=message):
        LaunchSpec(target="t", command="true", secrets=(name,))
    with pytest.raises(ValidationError, match=message):
        JobCommand(dir="/w/r", script="true", secrets={name: SecretStr("x")})


def test_a_mark_s_entry_names_its_variable_by_its_form() -> None:
    """A token (`new_mark`) is carried as `RUNWARDEN_MARK`; a run id (the mark of a run
    launched before marks) as `RUNWARDEN_RUN_ID`."""
    mark = new_mark()
    assert re.fullmatch(r"[0-9a-f]{32}", mark)
    assert mark != new_mark()
    assert mark_entry(mark) == f"RUNWARDEN_MARK={mark}"
    assert mark_entry("20261202-010000-abcde") == "RUNWARDEN_RUN_ID=20261202-010000-abcde"
    assert MARK_FORM.fullmatch(mark)
