"""`workers.executors.scripts.files`: the claim, put_file, read_from and manifest
scripts under dash (`sh`) and `busybox sh` (the `sh` fixture), with hostile names."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from schemas.protocol import CLAIM_FILE
from workers.executors import CommandError, InvalidArgument, ProtocolError, local_manifest

from .....shells import HOSTILE_DIR, HOSTILE_NAMES, Shell, no_pwned

# --- claim ------------------------------------------------------------------------


def test_claim_is_exclusive(sh: Shell) -> None:
    run = sh.run_dir("deep/er/run")
    owner = "owner 'a' $(touch PWNED) `x` \\ é"
    assert sh.executor.claim(run, owner)
    assert sh.executor.claim(run, owner)
    assert not sh.fresh().claim(run, "owner b")
    assert not sh.executor.claim(run, owner + " ")
    assert (Path(run) / CLAIM_FILE).read_text() == owner + "\n"
    assert sorted(os.listdir(run)) == [CLAIM_FILE]
    assert no_pwned(sh.workdir)


def test_concurrent_claims_have_one_winner(sh: Shell) -> None:
    run = sh.run_dir(HOSTILE_DIR)
    results: dict[str, bool] = {}
    start = threading.Barrier(6)

    def claim(owner: str) -> None:
        executor = sh.fresh()
        start.wait()
        results[owner] = executor.claim(run, owner)

    threads = [threading.Thread(target=claim, args=(f"owner {i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [owner for owner, won in results.items() if won]
    assert len(results) == 6
    assert len(winners) == 1
    assert (Path(run) / CLAIM_FILE).read_text() == winners[0] + "\n"
    assert sorted(os.listdir(run)) == [CLAIM_FILE]


@pytest.mark.parametrize("owner", ["", "two\nlines", "cr\r", "nul\0"])
def test_claim_refuses_a_bad_owner(sh: Shell, owner: str) -> None:
    with pytest.raises(InvalidArgument):
        sh.executor.claim(sh.run_dir(), owner)
    assert not (sh.workdir / "run").exists()


# --- put_file and read_from -------------------------------------------------------


def test_put_file_content_is_exact(sh: Shell) -> None:
    path = f"{sh.run_dir(HOSTILE_DIR)}/snapshot.request"
    contents = [
        "",
        "deadline",
        "a\nb\r\n\n",
        "$(touch PWNED) 'q' `touch PWNED` \\ é",
        "%s%d\\0\\n",
        "-n",
        "-e \\c",
        " lead and trail \n\n",
    ]
    for content in contents:
        sh.executor.put_file(path, content)
        assert Path(path).read_bytes() == content.encode()
        assert sh.executor.read_from(path, 0, 1000) == content.encode()
    assert sorted(os.listdir(Path(path).parent)) == ["snapshot.request"]
    with pytest.raises(InvalidArgument):
        sh.executor.put_file(path, "nul\0")
    with pytest.raises(InvalidArgument):
        sh.executor.put_file("relative/path", "x")
    assert no_pwned(sh.workdir)


def test_read_from_ranges(sh: Shell) -> None:
    path = sh.workdir / "name $(touch PWNED) 'q'"
    data = bytes(range(256)) * 40
    path.write_bytes(data)
    read = sh.executor.read_from
    assert read(str(path), 0, 10) == data[:10]
    assert read(str(path), 100, 5000) == data[100:5100]
    assert read(str(path), len(data) - 3, 100) == data[-3:]
    assert read(str(path), len(data), 5) == b""
    assert read(str(path), len(data) + 50, 5) == b""
    assert read(str(path), 5, 0) == b""
    assert read(str(sh.workdir / "missing"), 0, 10) == b""
    with pytest.raises(ProtocolError, match="not a regular file"):
        read(str(sh.workdir), 0, 10)
    with pytest.raises(InvalidArgument):
        read(str(path), -1, 10)
    assert no_pwned(sh.workdir)


# --- manifest ---------------------------------------------------------------------


def make_tree(root: Path) -> None:
    checkpoint = root / "output" / "checkpoint-3"
    (checkpoint / "nested dir $(touch PWNED)").mkdir(parents=True)
    for i, name in enumerate(HOSTILE_NAMES):
        (checkpoint / name).write_bytes(f"{i} {name}".encode())
        (checkpoint / "nested dir $(touch PWNED)" / name).write_bytes(os.urandom(i * 100))
    (checkpoint / "scratch.tmp").write_text("excluded")
    (checkpoint / "cache.tmp").mkdir()
    (checkpoint / "cache.tmp" / "inside").write_text("excluded")
    (checkpoint / "link").symlink_to("quo'te")
    (checkpoint / "empty").write_bytes(b"")
    (root / "snapshot.json").write_text("{}")
    (root / "-dash-entry").write_text("dash")
    (root / "job.log").write_text("log\n")


def test_manifest_equals_the_local_manifest(sh: Shell) -> None:
    remote = sh.workdir / HOSTILE_DIR
    make_tree(remote)
    entries = ["output/checkpoint-3", "snapshot.json", "-dash-entry", "missing $(x)"]
    exclude = ["*.tmp"]
    manifest = sh.executor.manifest(str(remote), entries, exclude)
    assert manifest == local_manifest(remote, entries, exclude)
    paths = [digest.path for digest in manifest]
    assert len(paths) == 2 * len(HOSTILE_NAMES) + 3
    for name in HOSTILE_NAMES:
        assert f"output/checkpoint-3/{name}" in paths
        assert f"output/checkpoint-3/nested dir $(touch PWNED)/{name}" in paths
    assert "output/checkpoint-3/link" not in paths
    assert not any(".tmp" in path for path in paths)
    assert "job.log" not in paths
    assert sh.executor.manifest(str(remote), ["output"]) == local_manifest(remote, ["output"])
    assert no_pwned(sh.workdir)


def test_manifest_of_nothing_and_of_a_missing_root(sh: Shell) -> None:
    remote = sh.workdir / "run"
    remote.mkdir()
    assert sh.executor.manifest(str(remote), ["missing"]) == []
    assert sh.executor.manifest(str(remote), []) == []
    with pytest.raises(CommandError, match="does not exist"):
        sh.executor.manifest(str(sh.workdir / "gone"), ["a"])
    with pytest.raises(InvalidArgument):
        sh.executor.manifest(str(remote), ["../escape"])
    with pytest.raises(InvalidArgument):
        sh.executor.manifest(str(remote), ["a"], ["[ab]"])
