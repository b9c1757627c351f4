"""The read-only disk probe against every executor (`target`: local, shell, ssh), and on
a real small filesystem (an 8 MiB tmpfs, mounted when this machine allows it) filled
until the disk policy's verdict flips: at 92 % used, and at free space below 1.5x
the newest checkpoint."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas.policy import DiskSample, disk_verdict
from workers.executors import ProtocolError

from ....conftest import Target

KIB = 1024
MIB = 1024 * KIB
HOSTILE_DIR = "r $(touch PWNED) 'q' \"d\" `touch PWNED` ;&|<>* x"


def probe(target: Target, dirs: list[str]) -> list[DiskSample | ProtocolError]:
    return target.executor.disk_usage(dirs)


def test_the_probe_on_every_target(target: Target) -> None:
    run = target.workdir / HOSTILE_DIR
    (run / "output" / "checkpoint-12").mkdir(parents=True)
    (run / "output" / "checkpoint-12" / "w.bin").write_bytes(os.urandom(200 * KIB))
    (run / "output" / "checkpoint-3").mkdir()
    (run / "output" / "checkpoint-3" / "w.bin").write_bytes(os.urandom(900 * KIB))
    before = sorted((str(p), p.lstat().st_mtime_ns) for p in target.workdir.rglob("*"))
    sample, gone = probe(target, [str(run), str(target.workdir / "gone")])
    assert sorted((str(p), p.lstat().st_mtime_ns) for p in target.workdir.rglob("*")) == before
    assert isinstance(sample, DiskSample)
    assert sample.checkpoint_bytes is not None
    assert 200 * KIB <= sample.checkpoint_bytes < 300 * KIB  # checkpoint-12, not -3
    stat = os.statvfs(run)
    assert sample.size_bytes == stat.f_blocks * stat.f_frsize
    assert isinstance(gone, ProtocolError)
    assert not list(target.workdir.rglob("PWNED"))


# --- a real small filesystem -------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs mounted at a fresh folder. The suite runs as root (`make test`
    installs its packages with apt): a machine where it cannot mount
    fails here, it does not skip."""
    mount_point = tmp_path / "fs"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
        capture_output=True,
        check=False,
    )
    assert mounted.returncode == 0, f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}"
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


def exact(run: Path) -> tuple[int, int, int]:
    """Size, used and available bytes of `run`'s filesystem, as df computes them."""
    stat = os.statvfs(run)
    used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
    return stat.f_blocks * stat.f_frsize, used, stat.f_bavail * stat.f_frsize


def grow(path: Path, n_bytes: int) -> None:
    with path.open("ab") as handle:
        handle.write(b"\xa5" * n_bytes)


def test_the_verdict_flips_on_a_filling_filesystem(target: Target, small_fs: Path) -> None:
    run = small_fs / HOSTILE_DIR
    checkpoint = run / "output" / "checkpoint-7"
    checkpoint.mkdir(parents=True)
    (checkpoint / "w.bin").write_bytes(os.urandom(2 * MIB))
    filler = run / "filler"

    def sample() -> DiskSample:
        (result,) = probe(target, [str(run)])
        assert isinstance(result, DiskSample)
        # The probe reads what the kernel says (df -Pk, in KiB).
        assert (result.size_bytes, result.used_bytes, result.avail_bytes) == exact(run)
        return result

    first = sample()
    assert first.size_bytes == 8 * MIB
    assert first.checkpoint_bytes == 2 * MIB
    assert disk_verdict(first) is None

    # The checkpoint rule: free space below 1.5x 2 MiB = 3 MiB, first reached in
    # 64 KiB steps from 3.25 MiB free.
    grow(filler, first.avail_bytes - 3 * MIB - 256 * KIB)
    previous = sample()
    assert disk_verdict(previous) is None
    while True:
        grow(filler, 64 * KIB)
        current = sample()
        why = disk_verdict(current)
        if why is not None:
            break
        previous = current
    assert previous.avail_bytes >= 3 * MIB > current.avail_bytes
    assert current.used_fraction < 0.92
    assert why.endswith("free, below 1.5x the newest checkpoint (2.0 MiB)"), why

    # The used rule: without the checkpoint, 92 % used, first reached in 16 KiB steps
    # from 88 %.
    (checkpoint / "w.bin").unlink()
    base = sample()
    assert base.checkpoint_bytes is not None
    assert base.checkpoint_bytes < 64 * KIB
    assert disk_verdict(base) is None
    total = base.used_bytes + base.avail_bytes
    grow(filler, int(total * 0.88) - base.used_bytes)
    previous = sample()
    assert disk_verdict(previous) is None
    while True:
        grow(filler, 16 * KIB)
        current = sample()
        why = disk_verdict(current)
        if why is not None:
            break
        previous = current
    assert previous.used_fraction < 0.92 <= current.used_fraction
    # The percent shown is df's own Use% (rounded up): 92 or 93 right past the line.
    df = subprocess.run(["df", "-Pk", str(run)], capture_output=True, check=True).stdout
    percent = df.splitlines()[1].split()[4].decode()
    assert percent in ("92%", "93%")
    assert why == f"the run directory's filesystem is {percent[:-1]} % used", why
