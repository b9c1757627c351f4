"""Retrieval of a run's artifacts (the `workers.retrieval` package) over the real executors
(`target`: local, shell, ssh against a real sshd): the stopped and succeeded
layouts, verification against the target's manifest (a file changed, added or
removed on the target between the manifest and the download), an interrupted
download over real SSH (retried, then verified), a hostile archive, and the
stored retrieval's checks."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, cast

import pytest

from schemas import RunState, Snapshot, SnapshotReason
from workers.errors import ArtifactMismatch, RetrievalError, StoredArtifactsInvalid, WorkerError
from workers.executors import LocalTransport, ScriptExecutor, local_manifest
from workers.executors.base import Executor
from workers.executors.digest import FileDigest
from workers.executors.errors import UnsafeArchive
from workers.executors.scripts import MANIFEST_OPENSSL_ABOVE
from workers.executors.ssh import CLIENT_REKEY_BYTES, SshTransport
from workers.executors.transport import Completed
from workers.retrieval import (
    MANIFEST_FILE,
    check_stored,
    retrieval_plan,
    retrieve,
    stored_files,
    stored_manifest,
)

from ..conftest import Target, ssh_executor
from ..sshd import SshServer, _descendants, _is_sshd, _sigkill, running_sshd
from .test_executor_contract import HOSTILE_NAMES

RUN = "run-1"
"""The run id every retrieval here is made for."""
SNAPSHOT = Snapshot(checkpoint="output/checkpoint-6", step=6, reason=SnapshotReason.REQUESTED)


def make_run(run: Path) -> None:
    """A run directory: log, proof, metrics, two checkpoints (hostile names, a hard
    link, a symlink, nested dirs), final outputs."""
    for step in (3, 6):
        ckpt = run / "output" / f"checkpoint-{step}"
        (ckpt / "nested dir" / "deeper").mkdir(parents=True)
        for i, name in enumerate(HOSTILE_NAMES):
            (ckpt / name).write_bytes(f"{step} {i} {name}".encode())
        (ckpt / "nested dir" / "deeper" / "weights.bin").write_bytes(os.urandom(300_000))
        (ckpt / "optimizer.pt").write_bytes(os.urandom(50_000))
        os.link(ckpt / "optimizer.pt", ckpt / "optimizer.hardlink")
        (ckpt / "link").symlink_to("optimizer.pt")
        (ckpt / "empty").write_bytes(b"")
    (run / "output" / "model.safetensors").write_bytes(os.urandom(100_000))
    (run / "output" / "sub $(touch PWNED)" / "checkpoint-9").mkdir(parents=True)
    (run / "output" / "sub $(touch PWNED)" / "checkpoint-9" / "x").write_text("excluded")
    (run / "output" / "sub $(touch PWNED)" / "kept 'q'\n").write_text("kept")
    (run / "job.log").write_text("step 1\nstep 2\n")
    (run / "snapshot.json").write_text(
        json.dumps({"checkpoint": "output/checkpoint-6", "step": 6, "reason": "requested"})
    )
    (run / "metrics.jsonl").write_text('{"event": "begin"}\n')


def listing(root: Path) -> list[str]:
    """Relative paths of every regular file and link under `root`, sorted."""
    found = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            found.append((Path(dirpath) / name).relative_to(root).as_posix())
    return sorted(found)


def leftovers(store: Path) -> list[str]:
    return sorted(n for n in os.listdir(store) if n.startswith(".incoming-"))


@pytest.fixture
def run(target: Target) -> Path:
    path = target.workdir / "run $(x) 'q'"
    make_run(path)
    return path


# --- plans ---------------------------------------------------------------------------


def test_plans() -> None:
    assert retrieval_plan(RunState.STOPPED, SNAPSHOT) == (
        ["job.log", "snapshot.json", "output/checkpoint-6"],
        [],
    )
    assert retrieval_plan(RunState.SUCCEEDED, None) == (["job.log", "output"], ["checkpoint-*"])
    assert retrieval_plan(RunState.FAILED, None) == (["job.log"], [])
    assert retrieval_plan(RunState.CANCELLED, SNAPSHOT) == (["job.log"], [])
    for state in (RunState.PREPARING, RunState.RUNNING):
        with pytest.raises(ValueError, match="not ended"):
            retrieval_plan(state, None)
    with pytest.raises(ValueError, match="snapshot"):
        retrieval_plan(RunState.STOPPED, None)


# --- layouts -------------------------------------------------------------------------


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
    gone = str(run) + "-gone"
    again = retrieve(target.executor, gone, dest, entries, exclude, run_id=RUN)
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


# --- verification: the target changes between its manifest and the download ----------


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
        self, remote: str, local: Path, entries: Sequence[str], exclude: Sequence[str] = ()
    ) -> list[FileDigest]:
        assert self.manifested.wait(60)
        return self.inner.download(remote, local, entries, exclude)


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


# --- failures: nothing visible, the right retry flag ---------------------------------


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
            got = retrieve(target.make(), str(run), dest, entries, exclude, run_id=RUN)
            results.append(got)
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


# --- the stored retrieval ------------------------------------------------------------


def test_check_stored_names_what_is_wrong(target: Target, run: Path, tmp_path: Path) -> None:
    entries, exclude = retrieval_plan(RunState.STOPPED, SNAPSHOT)
    dest = tmp_path / "store" / "run-7"
    with pytest.raises(StoredArtifactsInvalid, match=r"no manifest\.json"):
        check_stored(dest, "output/checkpoint-6", RUN)
    assert stored_manifest(dest) is None
    retrieve(target.executor, str(run), dest, entries, exclude, run_id=RUN)
    assert len(check_stored(dest, "", RUN)) == len(local_manifest(run, entries))
    with pytest.raises(StoredArtifactsInvalid, match="no file under"):
        check_stored(dest, "output/checkpoint-3", RUN)
    with pytest.raises(StoredArtifactsInvalid, match="no file under"):
        check_stored(dest, "output/checkpoint-", RUN)  # a prefix of names is not a path

    (dest / "output/checkpoint-6/optimizer.pt").unlink()
    with (dest / "output/checkpoint-6/empty").open("ab") as handle:
        handle.write(b"!")
    with pytest.raises(StoredArtifactsInvalid) as raised:
        check_stored(dest, "output/checkpoint-6", RUN)
    message = str(raised.value)
    assert "1 missing ('output/checkpoint-6/optimizer.pt')" in message
    assert "1 of another size ('output/checkpoint-6/empty')" in message
    assert not raised.value.retryable
    assert check_stored(dest, "job.log", RUN)  # the rest is still fine

    (dest / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(StoredArtifactsInvalid, match="malformed"):
        stored_manifest(dest)


# --- the target's manifest of big files ----------------------------------------------


@pytest.mark.parametrize("shell", [("sh",), ("busybox", "sh")], ids=["dash", "busybox"])
@pytest.mark.parametrize("openssl", ["works", "broken"])
def test_the_manifest_of_big_files(tmp_path: Path, shell: tuple[str, ...], openssl: str) -> None:
    root = tmp_path / "run"
    output = root / "output"
    output.mkdir(parents=True)
    (output / "big $(touch PWNED)\nname 'q'").write_bytes(os.urandom(MANIFEST_OPENSSL_ABOVE + 1))
    (output / "at the limit").write_bytes(os.urandom(MANIFEST_OPENSSL_ABOVE))
    (output / "small").write_bytes(b"small")
    (output / "big.tmp").write_bytes(os.urandom(MANIFEST_OPENSSL_ABOVE + 1))
    shims = tmp_path / "shims"
    shims.mkdir()
    calls = tmp_path / "openssl-calls"
    real = shutil.which("openssl")
    assert real is not None
    shim = shims / "openssl"
    if openssl == "works":  # counts its calls
        shim.write_text(f'#!/bin/sh\necho >> {calls}\nexec {real} "$@"\n')
    else:  # answers garbage: the script must notice and hash with sha256sum alone
        shim.write_text(f"#!/bin/sh\necho >> {calls}\necho nonsense\n")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}
    executor = ScriptExecutor(LocalTransport(env=env, shell=shell), str(tmp_path))
    manifest = executor.manifest(str(root), ["output"], ["*.tmp"])
    assert manifest == local_manifest(root, ["output"], ["*.tmp"])
    assert len(manifest) == 3
    # The check, then one call per file above the limit (or the check alone).
    assert len(calls.read_text().splitlines()) == (2 if openssl == "works" else 1)
    assert not list(tmp_path.rglob("PWNED"))


# --- a hostile archive (shell executor: a target that sends what it likes) ----------


class ReplayTransport(LocalTransport):
    """A local transport whose downloads receive `archive` whatever the script: a
    hostile target."""

    def __init__(self, archive: bytes) -> None:
        super().__init__()
        self.archive = archive

    def receive(self, script: str, *, action: str, sink: Callable[[IO[bytes]], None]) -> Completed:
        sink(io.BytesIO(self.archive))
        return Completed(0, b"", b"")


def archive(*members: tuple[str, str, bytes | str]) -> bytes:
    """A tar of (kind, name, content or link target) members."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                assert isinstance(payload, bytes)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "chr": tarfile.CHRTYPE,
                "fifo": tarfile.FIFOTYPE,
            }[kind]
            if kind in ("symlink", "hardlink"):
                assert isinstance(payload, str)
                info.linkname = payload
            tar.addfile(info)
    return out.getvalue()


HOSTILE_ARCHIVES = {
    "absolute": [("file", "/tmp/rw-evil-abs", b"evil")],
    "dotdot": [("file", "./output/../../rw-evil-up", b"evil")],
    "dotdot-inside": [("file", "./output/../job.log", b"not normalized")],
    "link-out": [("symlink", "./output/out", "../../.."), ("file", "./output/out/evil", b"x")],
    "below-absolute-link": [("symlink", "./output/etc", "/etc"), ("file", "./output/etc/x", b"x")],
    "hardlink-out": [("hardlink", "./output/passwd", "/etc/passwd")],
    "hardlink-in": [("file", "./output/a", b"a"), ("hardlink", "./output/b", "./output/a")],
    "dot": [("dir", ".", b"")],
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_ARCHIVES))
def test_a_hostile_archive_is_refused(tmp_path: Path, kind: str) -> None:
    members = [("file", "./job.log", b"log\n"), *HOSTILE_ARCHIVES[kind]]
    remote = tmp_path / "target" / "run"
    remote.mkdir(parents=True)
    (remote / "job.log").write_text("log\n")
    executor = ScriptExecutor(ReplayTransport(archive(*members)), str(tmp_path / "target"))
    local = tmp_path / "store" / "dl"
    before = sorted(p.name for p in Path("/tmp").glob("rw-evil*"))
    with pytest.raises(UnsafeArchive):
        executor.download(str(remote), local, ["job.log", "output"])
    with pytest.raises(RetrievalError) as raised:
        retrieve(executor, str(remote), tmp_path / "store" / "run", ["job.log", "output"],
                 run_id=RUN)  # fmt: skip
    assert not raised.value.retryable
    assert isinstance(raised.value.__cause__, UnsafeArchive)
    assert not (tmp_path / "store" / "run").exists()
    assert leftovers(tmp_path / "store") == []
    assert not list(tmp_path.rglob("rw-evil*"))
    assert sorted(p.name for p in Path("/tmp").glob("rw-evil*")) == before
    assert not (tmp_path / "store" / "output").exists()


def test_device_files_and_fifos_are_skipped(tmp_path: Path) -> None:
    members = [
        ("file", "./output/a", b"a"),
        ("chr", "./output/null", b""),
        ("fifo", "./output/pipe", b""),
        ("file", "./output/b", b"b"),
        ("fifo", "./output/b", b""),  # a later member replaces an earlier one
    ]
    executor = ScriptExecutor(ReplayTransport(archive(*members)), str(tmp_path))
    local = tmp_path / "dl"
    digests = executor.download(str(tmp_path), local, ["output"]).files
    assert [d.path for d in digests] == ["output/a"]
    assert listing(local) == ["output/a"]


# --- an interrupted download over real SSH -------------------------------------------


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
