"""The on-target scripts are files (`workers/executors/sh/`): the protocol's names they
write literally are those of `schemas.protocol`, and no Python string under
`workers/` holds shell text."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from schemas import protocol
from workers.executors.scripts.common import sh
from workers.executors.scripts.launch import WATCHDOG_PID_FILE

ROOT = Path(__file__).resolve().parents[4]
SH_DIR = ROOT / "workers" / "executors" / "sh"

PROTOCOL_NAMES: dict[str, set[str]] = {
    "status_fn": {protocol.CANCEL_FILE, protocol.CANCELLING_FILE, protocol.EXIT_FILE},
    "cancel": {protocol.CANCEL_FILE, protocol.CANCELLING_FILE, protocol.EXIT_FILE},
    "claim": {protocol.CLAIM_FILE},
    "disk": {protocol.OUTPUT_DIR},
    "watchdog": {protocol.PID_FILE, protocol.SNAPSHOT_REQUEST, protocol.JOBSIDE_DIR},
    "follow": {
        protocol.JOB_LOG,
        protocol.METRICS_FILE,
        protocol.NOTICE_FILE,
        protocol.NOTICE_STATE_FILE,
        protocol.SNAPSHOT_FILE,
        protocol.SNAPSHOT_REQUEST,
    },
}
"""The protocol's names each script writes literally (all of them: see below)."""
SCRATCH_ONLY: frozenset[str] = frozenset({"doctor"})
"""Scripts whose `"$dir/name"` paths are in a scratch directory of their own, never in
a run directory."""

CGROUP_FILES: frozenset[str] = frozenset({"cgroup.procs", "cgroup.events", "cgroup.kill"})
"""The kernel's files of a run's cgroup directory (`sh/cgroup.sh`): named in a cgroup,
never in a run directory."""

NOT_YET_FILES: frozenset[str] = frozenset()
"""Modules whose scripts still are Python strings."""

_PROTOCOL_VALUES = {
    value for name, value in vars(protocol).items() if name.isupper() and isinstance(value, str)
}
# A name under a run directory in a script: "$1/exit_code", "$rw_dir/cancelled".
_IN_DIR = re.compile(r'"\$\{?[A-Za-z0-9_]+\}?/([A-Za-z0-9_.-]+)"')
_SHELL_TEXT = re.compile(r"\brw_[a-z0-9_]+\(\) *\{|\$\(")


def sh_files() -> list[str]:
    return sorted(path.stem for path in SH_DIR.glob("*.sh"))


@pytest.mark.parametrize("name", sh_files())
def test_each_script_loads_names_its_shell_and_holds_no_template(name: str) -> None:
    text = sh(name)
    assert text.startswith("# shellcheck shell=sh\n")
    assert re.search(r"\{\{|@[A-Z_]+@", text) is None


@pytest.mark.parametrize("name", sh_files())
def test_the_protocol_names_a_script_writes_are_those_of_schemas_protocol(name: str) -> None:
    text = sh(name)
    if name not in SCRATCH_ONLY:
        assert set(_IN_DIR.findall(text)) - CGROUP_FILES <= _PROTOCOL_VALUES
    assert PROTOCOL_NAMES.get(name, set()) <= _PROTOCOL_VALUES
    for value in PROTOCOL_NAMES.get(name, set()):
        assert re.search(rf"(?<![A-Za-z0-9_.]){re.escape(value)}(?![A-Za-z0-9_])", text), value


def test_the_watchdog_records_its_pid_where_spawn_looks() -> None:
    assert f'"$rw_dir/{WATCHDOG_PID_FILE}"' in sh("watchdog")


def shell_strings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text("utf-8"))
    return [
        node.value[:60]
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _SHELL_TEXT.search(node.value)
    ]


def test_no_python_string_under_workers_holds_shell_text() -> None:
    found = {
        str(path.relative_to(ROOT)): strings
        for path in sorted((ROOT / "workers").rglob("*.py"))
        if str(path.relative_to(ROOT)) not in NOT_YET_FILES
        and (strings := shell_strings(path))
    }
    assert found == {}
