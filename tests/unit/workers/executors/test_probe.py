"""`workers.executors.probe`: the disk probe's parser on crafted output, and its script
under dash, `busybox sh`, and busybox's own `df` and `du`, on real directories. (The
disk policy's verdict on a sample is `schemas.policy`'s: tests/unit/schemas/test_policy.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from schemas.policy import DiskSample
from workers.executors import InvalidArgument, ProtocolError
from workers.executors.probe import disk_probe_script, parse_disk_probe

KIB = 1024
MIB = 1024 * KIB
TOKEN = "T0k3n"
HOSTILE_DIR = "r $(touch PWNED) 'q' \"d\" `touch PWNED` ;&|<>*?\n\tend"
HEADER = b"Filesystem     1024-blocks     Used Available Capacity Mounted on\n"


def record(index: int, checkpoint: str, df_line: bytes) -> bytes:
    return f"{TOKEN} D {index} {checkpoint}\n".encode() + HEADER + df_line + b"\n"


END = f"{TOKEN} E\n".encode()


# --- parse ------------------------------------------------------------------------


def test_parse_samples_in_order() -> None:
    output = (
        record(0, "300", b"/dev/vda 1000 900 100 90% /")
        + f"{TOKEN} M 1\n".encode()
        + record(2, "-", b"tmpfs 8192 0 8192 0% /mnt/a dir with spaces")
        + END
    )
    first, missing, third = parse_disk_probe(output, TOKEN, 3)
    assert first == DiskSample(1000 * KIB, 900 * KIB, 100 * KIB, 300 * KIB)
    assert first.used_fraction == 0.9
    assert isinstance(missing, ProtocolError)
    assert "does not exist" in str(missing)
    assert third == DiskSample(8192 * KIB, 0, 8192 * KIB, None)
    assert third.used_fraction == 0.0


def test_parse_long_and_odd_device_names() -> None:
    # -P keeps a long device name on one line; names and mount points may hold spaces
    # and digits.
    long_name = b"//fileserver.example.internal/a-very-long-share-name-" + b"x" * 80
    output = (
        record(0, "1", long_name + b" 2048 1024 1024 50% /mnt/x")
        + record(1, "2", b"my disk 2 3 4 100 60 40 60% /mnt/1 2 3 4% y")
        + record(2, "-", b"proc 0 0 0 - /proc")
        + END
    )
    samples = parse_disk_probe(output, TOKEN, 3)
    assert samples[0] == DiskSample(2048 * KIB, 1024 * KIB, 1024 * KIB, KIB)
    assert samples[1] == DiskSample(100 * KIB, 60 * KIB, 40 * KIB, 2 * KIB)
    assert samples[2] == DiskSample(0, 0, 0, None)


def test_df_failure_is_that_directory_s_error() -> None:
    output = (
        f"{TOKEN} D 0 -\n".encode()
        + b"df: /w/r: Permission denied\n\n"
        + f"{TOKEN} F 0\n".encode()
        + record(1, "4", b"/dev/vda 10 5 5 50% /")
        + END
    )
    failed, sample = parse_disk_probe(output, TOKEN, 2)
    assert isinstance(failed, ProtocolError)
    assert "df failed: df: /w/r: Permission denied" in str(failed)
    assert sample == DiskSample(10 * KIB, 5 * KIB, 5 * KIB, 4 * KIB)


@pytest.mark.parametrize(
    "bad",
    [
        f"{TOKEN} D 0 -\n".encode() + HEADER + b"garbage line\n",  # no df numbers
        f"{TOKEN} D 0 -\n".encode(),  # no df output at all
        f"{TOKEN} D 0 12x\n".encode() + HEADER + b"/dev/vda 10 5 5 50% /\n",
        f"{TOKEN} D 0\n".encode() + HEADER + b"/dev/vda 10 5 5 50% /\n",
        f"{TOKEN} Z 0\n".encode(),
        f"{TOKEN} M 0 extra\n".encode(),
        f"{TOKEN} F 0\n".encode(),  # a failure without its record
        b"",  # no record at all for it
    ],
)
def test_a_garbled_record_is_that_directory_s_error(bad: bytes) -> None:
    output = bad + record(1, "-", b"/dev/vda 10 5 5 50% /") + END
    failed, sample = parse_disk_probe(output, TOKEN, 2)
    assert isinstance(failed, ProtocolError)
    assert isinstance(sample, DiskSample)


@pytest.mark.parametrize(
    "output",
    [
        record(0, "-", b"/dev/vda 10 5 5 50% /"),  # no end record: cut short
        b"noise\n" + record(0, "-", b"/dev/vda 10 5 5 50% /") + END,
        record(5, "-", b"/dev/vda 10 5 5 50% /") + END,  # out of range
        f"{TOKEN} D x -\n".encode() + END,
        f"{TOKEN}\n".encode() + END,
        b"\xff\xfe garbage \x00" * 10,
        b"",
    ],
)
def test_garbage_output_is_a_protocol_error(output: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_disk_probe(output, TOKEN, 1)


# --- the script -------------------------------------------------------------------


def busybox_bin(tmp_path: Path) -> Path:
    """A folder whose `df` and `du` are busybox's applets."""
    busybox = shutil.which("busybox")
    assert busybox is not None
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("df", "du"):
        (folder / name).symlink_to(busybox)
    return folder


SHELLS = {
    "dash": ("sh",),
    "busybox": ("busybox", "sh"),
    "busybox-applets": ("busybox", "sh"),
}
Probe = Callable[[list[str]], list[DiskSample | ProtocolError]]


@pytest.fixture(params=list(SHELLS))
def run_probe(request: pytest.FixtureRequest, tmp_path: Path) -> Probe:
    env = dict(os.environ)
    if request.param == "busybox-applets":
        env["PATH"] = f"{busybox_bin(tmp_path)}:{env['PATH']}"

    def run(dirs: list[str]) -> list[DiskSample | ProtocolError]:
        script = disk_probe_script(dirs, TOKEN)
        result = subprocess.run(
            [*SHELLS[request.param], "-c", script.text, "rw", *script.args],
            capture_output=True,
            env=env,
            check=True,
            timeout=60,
        )
        return parse_disk_probe(result.stdout, TOKEN, len(dirs))

    return run


def make_run(root: Path) -> Path:
    run = root / HOSTILE_DIR
    output = run / "output"
    sizes = {"9": 900, "10": 300, "010": 2000, "2": 100, "x": 1000, "10x": 1000}
    for name, kib in sizes.items():
        (output / f"checkpoint-{name}").mkdir(parents=True)
        (output / f"checkpoint-{name}" / "weights.bin").write_bytes(os.urandom(kib * KIB))
    (output / "checkpoint-99").write_text("a file, not a checkpoint")
    (output / "checkpoint-100").symlink_to("checkpoint-9")  # links are not followed
    (output / "checkpoint-1000").symlink_to("/nonexistent")
    return run


def snapshot_tree(root: Path) -> dict[str, tuple[int, int, int]]:
    return {
        str(path): (path.lstat().st_mode, path.lstat().st_size, path.lstat().st_mtime_ns)
        for path in [root, *root.rglob("*")]
    }


def test_the_script_on_real_directories(run_probe: Probe, tmp_path: Path) -> None:
    run = make_run(tmp_path / "work")
    bare = tmp_path / "work" / "bare"
    bare.mkdir()
    missing = tmp_path / "work" / "missing $(touch PWNED)"
    before = snapshot_tree(tmp_path / "work")
    newest, plain, gone = run_probe([str(run), str(bare), str(missing)])
    assert snapshot_tree(tmp_path / "work") == before  # read-only
    assert not list(tmp_path.rglob("PWNED"))
    assert isinstance(newest, DiskSample)
    # checkpoint-10 (not 9, not 010, not a link or a file): 300 KiB of data, as du
    # counts it.
    du = subprocess.run(
        ["du", "-sk", str(run / "output" / "checkpoint-10")],
        capture_output=True,
        check=True,
    )
    assert newest.checkpoint_bytes == int(du.stdout.split()[0]) * KIB
    assert 300 * KIB <= newest.checkpoint_bytes < 400 * KIB
    stat = os.statvfs(run)
    assert newest.size_bytes == stat.f_blocks * stat.f_frsize
    assert abs(newest.avail_bytes - stat.f_bavail * stat.f_frsize) < 512 * MIB
    assert 0 < newest.used_fraction < 1
    assert isinstance(plain, DiskSample)
    assert plain.checkpoint_bytes is None
    assert isinstance(gone, ProtocolError)
    assert "does not exist" in str(gone)


def test_the_script_with_nothing_to_probe(run_probe: Probe) -> None:
    assert run_probe([]) == []


@pytest.mark.parametrize("token", ["", "a b", "a-b", "ä", "x$(y)"])
def test_a_bad_token_is_refused(token: str) -> None:
    with pytest.raises(InvalidArgument):
        disk_probe_script(["/w/r"], token)


@pytest.mark.parametrize("path", ["relative", "", "/w/nul\0"])
def test_a_bad_directory_is_refused(path: str) -> None:
    with pytest.raises(InvalidArgument):
        disk_probe_script([path], TOKEN)
