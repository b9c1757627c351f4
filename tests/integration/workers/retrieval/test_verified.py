"""`workers.retrieval.verified`: a run's artifacts retrieved over the real executors
(`target`: local, shell, ssh against a real sshd): the stopped and succeeded layouts,
verification against the target's manifest (a file changed, added or removed on the
target between the manifest and the download), failures that leave nothing visible
with the right retry flag, and an interrupted download over real SSH (retried, then
verified)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import cast

import pytest

from bench.harness.sshd import SshServer, _descendants, _is_sshd, _sigkill, running_sshd
from schemas import RunState
from workers.errors import ArtifactMismatch, RetrievalError, StoredArtifactsInvalid, WorkerError
from workers.executors import Charge, local_manifest
from workers.executors.base import Executor
from workers.executors.digest import FileDigest
from workers.executors.ssh import CLIENT_REKEY_BYTES, SshTransport
from workers.retrieval import (
    MANIFEST_FILE,
    check_stored,
    retrieval_plan,
    retrieve,
    stored_files,
    stored_manifest,
)

from ....conftest import Target, ssh_executor
from ..executors.test_contract import HOSTILE_NAMES
from .conftest import RUN, SNAPSHOT, leftovers, listing

# --- layouts ----------------------------------------------------------------------


def test_a_stopped_run_brings_its_checkpoint_home(
    target: Target, run: Path, tmp_path: Path
) -> None:
    entries, exclude = retrieval_plan(RunState.STOPPED, SNAPSHOT)
    dest = tmp_path / "store" / "run-1"
    got = retrieve(target.executor, str(run), dest, entries, exclude, run_id=RUN)

    expected = target.executor.manifest(str(run), entries, exclude)
    assert got.path == dest
    assert got.files == len(expected)
    assert got.bytes == sum((run / d.path).stat().st_size for d in expected)
    assert got.absent == ()
    assert not got.reused
    assert stored_manifest(dest) == expected
    assert local_manifest(dest, entries, exclude) == expected
    names = listing(dest)
    assert MANIFEST_FILE in names
    assert "output/checkpoint-6/link" in names  # links come as links, unverified
    assert (dest / "output/checkpoint-6/link").is_symlink()
    assert "output/checkpoint-6/optimizer.hardlink" in names
    assert not any(n.startswith("output/checkpoint-3") for n in names)
    assert "metrics.jsonl" not in names
    for name in HOSTILE_NAMES:
        assert f"output/checkpoint-6/{name}" in names
    assert not list(tmp_path.rglob("PWNED"))
    assert leftovers(dest.parent) == []

    sizes = {f.path: f.size for f in stored_files(dest) or []}
    assert sizes["output/checkpoint-6/empty"] == 0
    checkpoint = check_stored(dest, "output/checkpoint-6", RUN)
    assert checkpoint == [d for d in expected if d.path.startswith("output/checkpoint-6/")]
    assert check_stored(dest, "job.log", RUN) == [d for d in expected if d.path == "job.log"]

    # Idempotent: a complete destination is returned unchanged, the target untouched.
    before = (dest / MANIFEST_FILE).stat().st_mtime_ns
    again = retrieve(target.executor, str(run) + "-gone", dest, entries, exclude, run_id=RUN)
    assert again.reused
    assert (again.files, again.bytes) == (got.files, got.bytes)
    assert (dest / MANIFEST_FILE).stat().st_mtime_ns == before


def test_a_succeeded_run_brings_output_without_checkpoints(
    target: Target, run: Path, tmp_path: Path
) -> None:
    entries, exclude = retrieval_plan(RunState.SUCCEEDED, None)
    dest = tmp_path / "store" / "run-2"
    got = retrieve(target.executor, str(run), dest, entries, exclude, run_id=RUN)
    names = listing(dest)
    assert not any("checkpoint-" in n for n in names), names
    assert "output/model.safetensors" in names
    assert "output/sub $(touch PWNED)/kept 'q'\n" in names
    assert stored_manifest(dest) == target.executor.manifest(str(run), entries, exclude)
    assert got.files == len(names) - 1  # all but manifest.json
    assert not list(tmp_path.rglob("PWNED"))


def test_a_failed_run_without_a_log(target: Target, tmp_path: Path) -> None:
    remote = target.workdir / "empty-run"
    remote.mkdir()
    dest = tmp_path / "store" / "run-3"
    plan = retrieval_plan(RunState.FAILED, None)
    got = retrieve(target.executor, str(remote), dest, *plan, run_id=RUN)
    assert (got.files, got.bytes, got.absent) == (0, 0, ("job.log",))
    assert listing(dest) == [MANIFEST_FILE]
    assert stored_manifest(dest) == []
    with pytest.raises(StoredArtifactsInvalid, match=r"no file under 'job\.log'"):
        check_stored(dest, "job.log", RUN)


# --- verification: the target changes between its manifest and the download -------


class ChangesAfterManifest:
    """An executor whose target changes right after the manifest is computed and
    before the download starts (`change` does it): the thin seam that makes the
    manifest and the download disagree, deterministically, on a real executor."""

    def __init__(self, inner: Executor, change: Callable[[], None]) -> None:
        self.inner = inner
        self.change = change
        self.manifested = threading.Event()

    def manifest(
        self, remote: str, entries: Sequence[str], exclude: Sequence[str] = ()
    ) -> list[FileDigest]:
        try:
            return self.inner.manifest(remote, entries, exclude)
        finally:
            self.change()
            self.manifested.set()

    def download(
        self,
        remote: str,
        local: Path,
        entries: Sequence[str],
        exclude: Sequence[str] = (),
        charge: Charge | None = None,
    ) -> list[FileDigest]:
        assert self.manifested.wait(60)
        return self.inner.download(remote, local, entries, exclude, charge)


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("change", ["differing", "extra", "missing"])
def test_a_mismatch_is_reported_and_leaves_nothing(
    target: Target, run: Path, tmp_path: Path, change: str
) -> None:
    weights = "output/checkpoint-6/nested dir/deeper/weights.bin"
    added = "output/checkpoint-6/new\nfile $(x)"
    removed = f"output/checkpoint-6/{HOSTILE_NAMES[3]}"
    actions = {
        "differing": lambda: flip_a_byte(run / weights),
        "extra": lambda: (run / added).write_text("late"),
        "missing": (run / removed).unlink,
    }
    path = {"differing": weights, "extra": added, "missing": removed}[change]
    entries, exclude = retrieval_plan(RunState.STOPPED, SNAPSHOT)
    dest = tmp_path / "store" / "run-4"
    seam = ChangesAfterManifest(target.executor, actions[change])

    with pytest.raises(ArtifactMismatch) as raised:
        retrieve(cast(Executor, seam), str(run), dest, entries, exclude, run_id=RUN)
    error = raised.value
    assert getattr(error, change) == [path]
    assert [k for k in ("missing", "differing", "extra") if getattr(error, k)] == [change]
    assert repr(path) in str(error)
    assert error.retryable
    assert isinstance(error, RetrievalError)
    assert isinstance(error, WorkerError)
    assert not dest.exists()
    assert leftovers(dest.parent) == []

    # The target holds still now: retrieved again, verified against what it holds.
    got = retrieve(target.executor, str(run), dest, entries, exclude, run_id=RUN)
    assert stored_manifest(dest) == local_manifest(run, entries, exclude)
    assert got.files == len(local_manifest(run, entries, exclude))
    assert (dest / path).exists() == (change != "missing")


def test_a_mismatch_message_is_bounded(target: Target, tmp_path: Path) -> None:
    remote = target.workdir / "many"
    (remote / "output").mkdir(parents=True)

    def add_many() -> None:
        for i in range(100):
            (remote / "output" / f"late-{i:03}").write_text(str(i))

    seam = ChangesAfterManifest(target.executor, add_many)
    with pytest.raises(ArtifactMismatch) as raised:
        retrieve(cast(Executor, seam), str(remote), tmp_path / "d", ["output"], run_id=RUN)
    assert len(raised.value.extra) == 100
    assert "100 extra" in str(raised.value)
    assert "and 70 more" in str(raised.value)
    assert len(str(raised.value)) < 2000


# --- failures: nothing visible, the right retry flag ------------------------------


def test_a_missing_run_directory_is_not_retryable(target: Target, tmp_path: Path) -> None:
    dest = tmp_path / "store" / "gone"
    with pytest.raises(RetrievalError, match="does not exist") as raised:
        retrieve(target.executor, str(target.workdir / "gone"), dest, ["job.log"], run_id=RUN)
    assert not raised.value.retryable
    assert raised.value.__cause__ is not None
    assert not dest.exists()
    assert leftovers(dest.parent) == []


@pytest.mark.parametrize("entry", ["manifest.json", "manifest.json/x", "../x", "/etc"])
def test_entries_that_cannot_be_stored_are_refused(
    target: Target, run: Path, tmp_path: Path, entry: str
) -> None:
    with pytest.raises(RetrievalError) as raised:
        retrieve(target.executor, str(run), tmp_path / "d", ["job.log", entry], run_id=RUN)
    assert not raised.value.retryable
    assert not (tmp_path / "d").exists()


def test_a_foreign_destination_is_never_replaced(target: Target, run: Path, tmp_path: Path) -> None:
    dest = tmp_path / "store" / "taken"
    dest.mkdir(parents=True)
    (dest / "mine").write_text("not a retrieval")
    with pytest.raises(RetrievalError, match="not a complete retrieval") as raised:
        retrieve(target.executor, str(run), dest, ["job.log"], run_id=RUN)
    assert not raised.value.retryable
    assert listing(dest) == ["mine"]
    # An empty directory is no one's: it is replaced.
    (dest / "mine").unlink()
    assert retrieve(target.executor, str(run), dest, ["job.log"], run_id=RUN).files == 1


def test_leftovers_of_dead_attempts_go_live_ones_stay(
    target: Target, run: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    dead = store / f".incoming-run-5-{'0' * 12}"
    (dead / "output").mkdir(parents=True)
    (dead / "output" / "partial").write_bytes(b"x" * 1000)
    live = store / f".incoming-run-5-{'1' * 12}"
    live.mkdir()
    other = store / f".incoming-run-5-5-{'2' * 12}"  # run-5-5's: not judged here
    other.mkdir()
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a retrieval in progress holds it
        retrieve(target.executor, str(run), store / "run-5", ["job.log"], run_id=RUN)
        assert leftovers(store) == [live.name, other.name]
    finally:
        os.close(fd)
    assert (store / "run-5" / "job.log").read_text() == "step 1\nstep 2\n"


def test_concurrent_retrievals_of_one_destination(
    target: Target, run: Path, tmp_path: Path
) -> None:
    entries, exclude = retrieval_plan(RunState.STOPPED, SNAPSHOT)
    dest = tmp_path / "store" / "run-6"
    results: list[object] = []

    def one() -> None:
        try:
            results.append(retrieve(target.make(), str(run), dest, entries, exclude, run_id=RUN))
        except Exception as error:  # noqa: BLE001 # reported by the assertion below
            results.append(error)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(not isinstance(r, Exception) for r in results), results
    assert stored_manifest(dest) == local_manifest(run, entries, exclude)
    assert leftovers(dest.parent) == []


# --- an interrupted download over real SSH ----------------------------------------


@pytest.fixture
def own_sshd(tmp_path: Path) -> Iterator[SshServer]:
    """A server of this test alone: it is killed and restarted."""
    with running_sshd(tmp_path / "srv") as server:
        yield server


def big_run(root: Path) -> Path:
    """A stopped run with a 96 MiB checkpoint (4 files of 24 MiB)."""
    run = root / "big-run"
    checkpoint = run / "output" / "checkpoint-6"
    checkpoint.mkdir(parents=True)
    for i in range(4):
        (checkpoint / f"shard {i}.bin").write_bytes(os.urandom(24 * 1024 * 1024))
    (checkpoint / "trainer_state.json").write_text('{"step": 6}')
    (run / "job.log").write_text("log\n")
    (run / "snapshot.json").write_text("{}")
    return run


def interrupt_when_incoming(store: Path, name: str, act: Callable[[], None]) -> threading.Thread:
    """Runs `act` once the incoming directory of `store/name` holds 4 MiB: mid-stream."""

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            size = 0
            for path in store.glob(f".incoming-{name}-*/**/*"):
                with contextlib.suppress(OSError):
                    size += path.stat().st_size
            if size >= 4 * 1024 * 1024:
                act()
                return
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_an_interrupted_download_fails_then_a_retry_verifies(
    own_sshd: SshServer, tmp_path: Path
) -> None:
    run = big_run(own_sshd.workdir)
    executor = ssh_executor(own_sshd, own_sshd.workdir)
    entries, exclude = retrieval_plan(RunState.STOPPED, SNAPSHOT)
    store = tmp_path / "store"
    store.mkdir()
    dest = store / "big"
    try:
        # sshd dies mid-stream: the connection drops, reconnecting is refused.
        watcher = interrupt_when_incoming(store, "big", own_sshd.kill)
        with pytest.raises(RetrievalError) as raised:
            retrieve(executor, str(run), dest, entries, exclude, run_id=RUN)
        watcher.join()
        assert raised.value.retryable, raised.value
        assert not dest.exists()
        assert leftovers(store) == []

        own_sshd.start()
        got = retrieve(executor, str(run), dest, entries, exclude, run_id=RUN)
        assert got.files == 7
        assert got.bytes >= 96 * 1024 * 1024
        assert stored_manifest(dest) == local_manifest(run, entries, exclude)
        assert len(check_stored(dest, SNAPSHOT.checkpoint, RUN)) == 5
    finally:
        executor.close()


@pytest.mark.slow
def test_a_dropped_connection_is_retried_within_one_retrieval(
    own_sshd: SshServer, tmp_path: Path
) -> None:
    run = big_run(own_sshd.workdir)
    executor = ssh_executor(own_sshd, own_sshd.workdir)
    entries, exclude = retrieval_plan(RunState.STOPPED, SNAPSHOT)
    store = tmp_path / "store"
    store.mkdir()
    killed: list[int] = []

    def kill_sessions() -> None:
        # The per-connection sshd processes only: the listener stays, so the SSH
        # transport reconnects and runs the download (idempotent) again.
        assert own_sshd.process is not None
        sessions = [
            pid
            for pid in _descendants(own_sshd.process.pid)
            if _is_sshd(pid) and pid != own_sshd.sshd_pid
        ]
        killed.extend(sessions)
        _sigkill(sessions)

    try:
        watcher = interrupt_when_incoming(store, "big", kill_sessions)
        got = retrieve(executor, str(run), store / "big", entries, exclude, run_id=RUN)
        watcher.join()
        assert killed
        assert not got.reused
        assert stored_manifest(store / "big") == local_manifest(run, entries, exclude)
        assert leftovers(store) == []
    finally:
        executor.close()


@pytest.mark.slow
def test_server_rekeys_during_retrievals_never_stall(tmp_path: Path) -> None:
    # paramiko stalls 30 s, then drops the connection, when the server closes a
    # channel during a key re-exchange the client started (paramiko#822): the client
    # leaves re-keying to the server, which re-keys here every 16 MiB (6 times a
    # retrieval), while channels (the downloads', the manifests' shells) open and close.
    with running_sshd(tmp_path / "srv", extra_config="RekeyLimit 16M") as server:
        run = big_run(server.workdir)
        executor = ssh_executor(server, server.workdir)
        try:
            transport = executor.transport
            assert isinstance(transport, SshTransport)
            packetizer = transport.connection.open().packetizer
            assert packetizer.REKEY_BYTES == CLIENT_REKEY_BYTES
            entries, exclude = retrieval_plan(RunState.STOPPED, SNAPSHOT)
            for round_ in range(3):
                started = time.monotonic()
                dest = tmp_path / "store" / str(round_)
                got = retrieve(executor, str(run), dest, entries, exclude, run_id=RUN)
                assert time.monotonic() - started < 15  # a stall lasts 30 s
                assert got.files == 7
        finally:
            executor.close()
