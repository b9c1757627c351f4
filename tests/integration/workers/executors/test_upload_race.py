"""An upload cannot be raced into copying what its check refused (issue 19): a thread
swaps a directory inside the checked project for a link to the secrets directory and
back as fast as it can while the project is uploaded again and again, through every
executor (`target`: local, shell, SSH against a real sshd). What was checked is what
is copied: the swapped directory arrives as the link it was at that moment, or as
the directory, never as the secrets directory's files. An upload whose checked path
itself became a link fails, copying nothing; an upload of a path that holds or is
inside the state or secrets directory is refused at the check."""

from __future__ import annotations

import os
import secrets as _secrets
import threading
import time
from pathlib import Path

import pytest

from schemas import Settings, TargetConfig
from workers.errors import NotAllowed
from workers.executors import CommandError
from workers.permits import check_upload

from ....conftest import Target

UPLOADS = {"local": 1000, "shell": 300, "ssh": 200}
"""Uploads per executor while the swapping runs: each a few milliseconds locally,
tens over a process or SSH."""

HOLD_S = 0.0003
"""How long the swapper leaves the directory as the link, and as the directory: shorter
than one upload, so that the uploads meet it in each state."""


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, Path, bytes, TargetConfig, Settings]:
    """A secrets directory holding keys that carry a marker, an upload root with a
    project whose `src/data` directory holds a file; the target allowing that root."""
    marker = f"SECRET-{_secrets.token_hex(8)}".encode()
    settings = Settings(state_dir=tmp_path / "state")
    keys = settings.secrets.path
    keys.mkdir(parents=True)
    for name in ("producer.operator.key", "producer.billing.key", "HF_TOKEN"):
        (keys / name).write_bytes(marker + b" " + name.encode())
    root = tmp_path / "root"
    data = root / "project" / "src" / "data"
    data.mkdir(parents=True)
    (data / "train.csv").write_bytes(b"x,y\n1,2\n")
    (root / "project" / "train.py").write_text("print('train')\n")
    target = TargetConfig(name="t", kind="local", workdir=str(tmp_path), upload_roots=(str(root),))
    return root / "project", keys, marker, target, settings


def _leaked(dest: Path, marker: bytes) -> list[str]:
    """The regular files under `dest` (links not followed) carrying `marker`."""
    found = []
    for dirpath, _, filenames in os.walk(dest, followlinks=False):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink() and marker in path.read_bytes():
                found.append(str(path))
    return found


@pytest.mark.parametrize("swapped", ["inside", "project"])
def test_a_directory_swapped_for_a_link_to_the_secrets_is_never_followed(
    target: Target, project: tuple[Path, Path, bytes, TargetConfig, Settings], swapped: str
) -> None:
    """As a launch does: the upload checked, then uploaded; `inside`: the project's
    `src/data` swapped, `project`: the checked directory itself."""
    source, keys, marker, config, settings = project
    moving = source / "src" / "data" if swapped == "inside" else source
    aside = moving.with_name(".aside")
    stop = threading.Event()
    swaps = 0

    def swap() -> None:
        # Each state held for HOLD_S: a thread that only renamed handed the GIL back and
        # forth with the uploads in lockstep, and a CI run's 1,000 local uploads all found
        # the directory in the same state (not there); a sleep makes the states last in
        # time, which the uploads then meet wherever they are.
        nonlocal swaps
        while not stop.is_set():
            os.rename(moving, aside)
            os.symlink(keys, moving)
            time.sleep(HOLD_S)
            os.unlink(moving)
            os.rename(aside, moving)
            time.sleep(HOLD_S)
            swaps += 1

    swapper = threading.Thread(target=swap, daemon=True)
    leaked: list[str] = []
    refused = failed = as_link = as_dir = gone = 0
    reasons: set[str] = set()
    swapper.start()
    try:
        for i in range(UPLOADS[target.kind]):
            try:
                checked = check_upload(config, source, settings)
            except NotAllowed:
                refused += 1  # checked while it was the link (or missing)
                continue
            dest = target.workdir / f"run-{i}"
            try:
                target.executor.upload(checked, str(dest))
            except CommandError as error:
                reasons.add(str(error))
                failed += 1
                continue
            finally:
                if dest.exists():
                    leaked += _leaked(dest, marker)
            copied = dest / "src" / "data"
            as_link += copied.is_symlink()
            as_dir += copied.is_dir() and not copied.is_symlink()
            gone += not copied.is_symlink() and not copied.exists()
    finally:
        stop.set()
        swapper.join()
    assert leaked == []
    assert swaps > 0
    assert all("no longer the directory that was checked" in r for r in reasons), reasons
    if swapped == "inside":
        # Never an upload failed, and the race was run: the uploads found the directory
        # in more than one of its states (the link, the directory with its file, not
        # there); which, and how often, is the machine's (a loaded run over SSH: 198
        # of 200 found it away).
        assert (refused, failed) == (0, 0)
        assert sum(n > 0 for n in (as_link, as_dir, gone)) >= 2, (as_link, as_dir, gone)
    else:
        # Checked as the link: refused; swapped after the check: the upload fails; else
        # copied as the directory. Which of these, and how often, is the machine's.
        assert refused + failed > 0, (as_dir, refused, failed)


def test_a_checked_path_that_became_a_link_fails_the_upload_and_copies_nothing(
    target: Target, project: tuple[Path, Path, bytes, TargetConfig, Settings]
) -> None:
    source, keys, _, config, settings = project
    checked = check_upload(config, source, settings)
    source.rename(source.with_name("moved"))
    source.symlink_to(keys)
    dest = target.workdir / "run"
    with pytest.raises(CommandError, match="no longer the directory that was checked"):
        target.executor.upload(checked, str(dest))
    assert not dest.exists() or list(dest.iterdir()) == []


@pytest.mark.parametrize("which", ["state", "secrets", "above"])
def test_an_upload_of_the_state_or_secrets_directory_is_refused(
    tmp_path: Path, which: str
) -> None:
    settings = Settings(state_dir=tmp_path / "home" / ".local" / "state" / "runwarden")
    settings.secrets.path.mkdir(parents=True)
    upload = {
        "state": settings.state_dir,
        "secrets": settings.secrets.path,
        "above": tmp_path / "home",  # `--upload-root ~` holding the default state
    }[which]
    config = TargetConfig(
        name="t", kind="local", workdir=str(tmp_path), upload_roots=(str(tmp_path / "home"),)
    )
    with pytest.raises(NotAllowed, match="which is never uploaded"):
        check_upload(config, upload, settings)
    project = tmp_path / "home" / "project"
    project.mkdir()
    assert check_upload(config, project, settings) == project.resolve()
