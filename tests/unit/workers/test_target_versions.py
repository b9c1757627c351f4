"""`workers.target_versions`: the highest version seen of each target, in the state
directory, never lowered: by an older record, by another process's update, or by a
damaged file read as empty being written over a newer one."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from schemas.auth import Unauthenticated
from workers.target_versions import VERSIONS_FILE, TargetVersions


def test_a_newer_version_is_recorded_and_an_older_one_refused(tmp_path: Path) -> None:
    versions = TargetVersions(tmp_path / "state")
    assert versions.seen("gpu1") == 0
    versions.check("gpu1", 5)
    versions.check("gpu1", 5)  # the same record again
    versions.check("gpu2", 3)
    assert (versions.seen("gpu1"), versions.seen("gpu2")) == (5, 3)
    with pytest.raises(Unauthenticated, match="version 4, older than version 5"):
        versions.check("gpu1", 4)
    assert TargetVersions(tmp_path / "state").seen("gpu1") == 5  # another process reads it


def _raise(state: str, version: int) -> int:
    return TargetVersions(Path(state)).raise_to("t", version)


def test_processes_raising_at_once_never_lower_it(tmp_path: Path) -> None:
    with ProcessPoolExecutor(4) as pool:
        list(pool.map(_raise, [str(tmp_path)] * 40, range(1, 41)))
    assert TargetVersions(tmp_path).seen("t") == 40
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_state_directory_that_cannot_be_written_refuses_the_record(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        blocked = tmp_path / "file"
        blocked.write_text("")  # a file where the directory should be: even root fails
        versions = TargetVersions(blocked / "state")
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        versions = TargetVersions(tmp_path / "ro" / "state")
    with pytest.raises(Unauthenticated, match="versions seen cannot be recorded"):
        versions.check("gpu1", 1)


def test_a_damaged_file_reads_as_nothing_seen(tmp_path: Path) -> None:
    (tmp_path / VERSIONS_FILE).write_text("{not json")
    versions = TargetVersions(tmp_path)
    assert versions.seen("gpu1") == 0
    versions.check("gpu1", 2)
    assert versions.seen("gpu1") == 2
