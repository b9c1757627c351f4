"""A hostile target never writes outside a download's destination, and links come
the same from every executor (`workers/executors/safetree.py`, `untar.py`,
`localtree.py`).

Hostile tar streams, built here with `tarfile`, reach the extraction through three
transports: an in-memory one, a real local `sh` running `cat` of the archive, and
a real sshd on loopback running the same `cat` (the stream crosses a real SSH
channel). For each: the whole directory tree around the destination is compared
before and after, the download fails with `UnsafeArchive` or skips the link as
specified, and the executor still answers afterwards. Then a run directory holding
an absolute link, links inside and outside, a hard link and a FIFO is retrieved by
the local, shell and SSH executors: the same files, kept links and skipped links,
verified."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

import pytest

from bench.harness.sshd import SshServer
from workers.errors import RetrievalError
from workers.executors import (
    Completed,
    Downloaded,
    Link,
    LocalExecutor,
    LocalTransport,
    ScriptExecutor,
    Transport,
    UnsafeArchive,
    quote,
)
from workers.executors.base import Executor
from workers.retrieval import MANIFEST_FILE, retrieve

from ....conftest import ssh_executor
from .test_shell import HOSTILE_ARCHIVES

Member = tuple[str, str, bytes | str | None]
"""(kind, name, content or link target) of an archive member."""


def archive(members: list[Member]) -> bytes:
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
            if isinstance(payload, str):
                info.linkname = payload
            tar.addfile(info)
    return out.getvalue()


def cve_2025_4517(dest: Path, up: int) -> list[Member]:
    """The symlink chain of CVE-2025-4517: nested directories whose names are long
    enough that the chain's expansion passes PATH_MAX (so `os.path.realpath` stops
    resolving and tarfile's data filter sees a harmless path), a link climbing back
    to the top through it, one more `up` levels above the destination, and a file
    written through that. tarfile's data filter (Python 3.11.7) writes the file
    `up` levels above `dest`."""
    steps = "abcdefghijklmnop"
    max_path = os.pathconf(dest.parent, "PC_PATH_MAX")
    component = "d" * ((max_path - len(str(dest)) - 1) // (len(steps) + 1))
    members: list[Member] = []
    path = ""
    for step in steps:
        members.append(("dir", os.path.join(path, component), None))
        members.append(("symlink", os.path.join(path, step), component))
        path = os.path.join(path, component)
    linkpath = os.path.join(*steps, "l" * 254)
    members.append(("symlink", linkpath, os.path.join(*[".."] * len(steps))))
    members.append(("symlink", "escape", os.path.join(linkpath, *[".."] * up)))
    members.append(("file", "escape/rw-evil-cve", b"written through the chain"))
    return members


# --- transports that send a prepared archive instead of the archive script's -----------


class ReplayTransport(LocalTransport):
    """In memory: a download receives `data`, whatever the script."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data = data

    def receive(
        self,
        script: str,
        *,
        action: str,
        sink: Callable[[IO[bytes]], None],
        args: Sequence[str] = (),
    ) -> Completed:
        sink(io.BytesIO(self.data))
        return Completed(0, b"", b"")


class CatTransport:
    """A real transport (a local `sh`, or SSH) whose downloads run `cat` of the archive
    `path` on the target instead of the archive script: a hostile target, the stream
    crossing the real channel. Every other call goes to `inner` unchanged."""

    def __init__(self, inner: Transport, path: Path) -> None:
        self.inner = inner
        self.path = path

    def receive(
        self,
        script: str,
        *,
        action: str,
        sink: Callable[[IO[bytes]], None],
        args: Sequence[str] = (),
    ) -> Completed:
        return self.inner.receive(f"cat -- {quote(str(self.path))}", action=action, sink=sink)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


HostileFactory = Callable[[list[Member]], ScriptExecutor]


@pytest.fixture(params=["memory", "sh", "ssh"])
def hostile(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HostileFactory]:
    """Builds a script executor on `tmp_path/target` whose downloads receive the given
    members, through the transport named by the parameter."""
    target = tmp_path / "target"
    (target / "run").mkdir(parents=True)
    (target / "run" / "job.log").write_text("log\n")
    closers: list[Callable[[], None]] = []

    def make(members: list[Member]) -> ScriptExecutor:
        data = archive(members)
        path = target / "hostile.tar"
        path.write_bytes(data)
        transport: Transport
        if request.param == "memory":
            transport = ReplayTransport(data)
        elif request.param == "sh":
            transport = CatTransport(LocalTransport(), path)
        else:
            server: SshServer = request.getfixturevalue("sshd")
            ssh = ssh_executor(server, target)
            closers.append(ssh.close)
            transport = CatTransport(ssh.transport, path)
        return ScriptExecutor(transport, str(target))

    yield make
    for close in closers:
        close()


def tree_state(root: Path, leave_out: Path) -> dict[str, str]:
    """Every path under `root` (links not followed) but `leave_out` and what it is: a
    directory, a link and its target, a file and its SHA-256."""
    state: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        dirnames[:] = [d for d in dirnames if base / d != leave_out]
        for name in [*dirnames, *filenames]:
            path = base / name
            if path == leave_out:
                continue
            key = path.relative_to(root).as_posix()
            if path.is_symlink():
                state[key] = f"link {os.readlink(path)}"
            elif path.is_dir():
                state[key] = "dir"
            elif path.is_file():
                state[key] = "file " + hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                state[key] = "other"
    return state


def evil_in_tmp() -> list[str]:
    return sorted(p.name for p in Path("/tmp").glob("rw-evil*"))


# --- hostile streams that must be refused ---------------------------------------------

REFUSED: dict[str, list[Member]] = {
    # `a` climbs above the root: skipped; a member below a skipped link is refused.
    "parent-link-up": [("symlink", "a", ".."), ("file", "a/a/a/rw-evil-x", b"x")],
    # `output/a` points at the root: kept; a member below a link is refused.
    "parent-link-inside": [
        ("dir", "output", None),
        ("symlink", "output/a", ".."),
        ("file", "output/a/a/a/rw-evil-x", b"x"),
    ],
    # A directory replaced by a link between members, the link leaving or not.
    "dir-then-link-out": [
        ("dir", "output/d", None),
        ("file", "output/d/x", b"x"),
        ("symlink", "output/d", "../../../.."),
        ("file", "output/d/rw-evil-y", b"y"),
    ],
    "dir-then-link-in": [
        ("dir", "output/d", None),
        ("file", "output/d/x", b"x"),
        ("symlink", "output/d", ".."),
        ("file", "output/d/rw-evil-y", b"y"),
    ],
    # A file written below a file of the same archive.
    "below-a-file": [("file", "output/f", b"f"), ("file", "output/f/rw-evil-z", b"z")],
    "absolute-link-then-below": [
        ("symlink", "output/tmp", "/tmp"),
        ("file", "output/tmp/rw-evil-abs", b"x"),
    ],
    **{f"retrieval-{name}": list(members) for name, members in HOSTILE_ARCHIVES.items()},
}


def check_refused(
    make: HostileFactory, tmp_path: Path, members: list[Member], dest: Path
) -> None:
    executor = make(members)
    remote = str(tmp_path / "target" / "run")
    store_run = dest.parent / "store" / "run"
    store_run.parent.mkdir()
    before, tmp_before = tree_state(tmp_path, dest), evil_in_tmp()

    with pytest.raises(UnsafeArchive):
        executor.download(remote, dest, ["job.log", "output"])
    assert tree_state(tmp_path, dest) == before
    assert evil_in_tmp() == tmp_before

    with pytest.raises(RetrievalError) as raised:
        retrieve(executor, remote, store_run, ["job.log", "output"], run_id="run")
    assert isinstance(raised.value.__cause__, UnsafeArchive)
    assert not raised.value.retryable
    assert not store_run.exists()
    assert os.listdir(store_run.parent) == []  # no leftover incoming directory
    assert tree_state(tmp_path, dest) == before
    assert evil_in_tmp() == tmp_before
    # The worker goes on: the same executor (the same SSH connection) still answers.
    assert [d.path for d in executor.manifest(remote, ["job.log"])] == ["job.log"]


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_hostile_stream_is_refused_and_writes_nothing_outside(
    hostile: HostileFactory, tmp_path: Path, case: str
) -> None:
    dest = tmp_path / "a" / "b" / "c" / "dl"
    dest.parent.mkdir(parents=True)
    check_refused(hostile, tmp_path, REFUSED[case], dest)


@pytest.mark.parametrize("up", [1, 3])
def test_the_cve_2025_4517_chain_is_refused(
    hostile: HostileFactory, tmp_path: Path, up: int
) -> None:
    dest = tmp_path / "a" / "b" / "c" / "dl"
    dest.parent.mkdir(parents=True)
    members = cve_2025_4517(dest, up)
    check_refused(hostile, tmp_path, members, dest)
    # Not a harmless archive: tarfile's own extraction, data filter and all, writes
    # through the chain (here, into a sandbox of this test; a fixed Python refuses).
    sandbox = tmp_path / "sandbox" / "a" / "b" / "c" / "dl"
    sandbox.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(archive(cve_2025_4517(sandbox, up)))) as tar:
            tar.extractall(sandbox, filter="data")
    except tarfile.TarError:
        return
    escaped = sandbox
    for _ in range(up):
        escaped = escaped.parent
    assert (escaped / "rw-evil-cve").exists()


# --- hostile streams whose links are skipped or replaced -------------------------------


def test_links_leaving_the_tree_are_skipped_and_a_member_replaces_a_link(
    hostile: HostileFactory, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("victim")
    dest = tmp_path / "a" / "dl"
    # Left by an earlier attempt: a link to the victim where the archive has a file.
    (dest / "output").mkdir(parents=True)
    (dest / "output" / "pre").symlink_to(victim)
    members: list[Member] = [
        ("file", "inside", b"inside"),
        ("dir", "output", None),
        ("symlink", "output/abs", "/etc/passwd"),
        ("symlink", "output/up", "../../outside/victim"),
        ("symlink", "output/after-name", "sub/../../x"),
        ("symlink", "output/out", str(victim)),
        ("file", "output/out", b"replaces the skipped link"),
        ("symlink", "output/in", "../inside"),
        ("file", "output/in", b"replaces the kept link, never writes through it"),
        ("file", "output/pre", b"replaces the link left before"),
        ("symlink", "output/top", ".."),
        ("symlink", "output/self", "."),
    ]
    executor = hostile(members)
    before = tree_state(tmp_path, dest)
    got = executor.download(str(tmp_path / "target" / "run"), dest, ["job.log", "output"])

    assert got.skipped_links == [
        Link("output/abs", "/etc/passwd"),
        Link("output/after-name", "sub/../../x"),
        Link("output/up", "../../outside/victim"),
    ]
    assert got.links == [Link("output/self", "."), Link("output/top", "..")]
    assert [f.path for f in got.files] == ["inside", "output/in", "output/out", "output/pre"]
    assert tree_state(tmp_path, dest) == before
    assert victim.read_text() == "victim"
    assert (dest / "inside").read_bytes() == b"inside"
    for name in ("in", "out", "pre"):
        path = dest / "output" / name
        assert path.is_file()
        assert not path.is_symlink()
    for name in ("abs", "up", "after-name"):
        assert not os.path.lexists(dest / "output" / name)
    assert os.readlink(dest / "output" / "top") == ".."


# --- one run directory, every executor: the same retrieval ------------------------------


def make_linked_run(run: Path, outside: Path) -> None:
    """A stopped run whose checkpoint holds a file, a hard link to it, a link out of
    the run (absolute and climbing), links inside, a FIFO; and an entry reached
    through a link."""
    ck = run / "ck"
    (ck / "sub").mkdir(parents=True)
    (run / "job.log").write_text("step 1\n")
    (run / "snapshot.json").write_text('{"checkpoint": "ck"}')
    (ck / "file").write_bytes(os.urandom(300_000))
    os.link(ck / "file", ck / "hard")
    (ck / "pw").symlink_to("/etc/passwd")
    (ck / "rel").symlink_to("../ck/file")
    (ck / "up").symlink_to("../../" + outside.name)
    (ck / "sub" / "x").write_text("x")
    (ck / "sub" / "deep").symlink_to("../../job.log")
    (ck / "sub" / "dirlink").symlink_to("..")
    os.mkfifo(ck / "fifo")
    (run / "via").symlink_to("ck")


def test_every_executor_retrieves_the_same_links(sshd: SshServer, tmp_path: Path) -> None:
    work = tmp_path / "work"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("never retrieved")
    run = work / "run"
    make_linked_run(run, outside)
    entries = ["job.log", "snapshot.json", "ck", "via/file"]
    executors: dict[str, Executor] = {
        "local": LocalExecutor(work),
        "shell": ScriptExecutor(LocalTransport(), str(work)),
        "ssh": ssh_executor(sshd, work),
    }
    documents = {}
    try:
        for kind, executor in executors.items():
            dest = tmp_path / "store" / kind
            got = retrieve(executor, str(run), dest, entries, run_id="linked")
            skipped = (Link("ck/pw", "/etc/passwd"), Link("ck/up", "../../outside"))
            assert got.skipped_links == skipped
            assert got.absent == ("via/file",)
            documents[kind] = json.loads((dest / MANIFEST_FILE).read_text())

            assert not os.path.lexists(dest / "ck" / "pw")
            assert not os.path.lexists(dest / "ck" / "up")
            assert not os.path.lexists(dest / "ck" / "fifo")
            assert not os.path.lexists(dest / "via")
            assert (dest / "ck" / "hard").is_file()
            assert not (dest / "ck" / "hard").is_symlink()
            assert (dest / "ck" / "hard").read_bytes() == (run / "ck" / "file").read_bytes()
            assert (dest / "ck" / "rel").read_bytes() == (run / "ck" / "file").read_bytes()
            assert (dest / "ck" / "sub" / "deep").read_text() == "step 1\n"
            assert os.readlink(dest / "ck" / "sub" / "dirlink") == ".."
    finally:
        for executor in executors.values():
            executor.close()

    assert documents["local"] == documents["shell"] == documents["ssh"]
    document = documents["ssh"]
    assert document["run_id"] == "linked"
    assert [f["path"] for f in document["files"]] == [
        "ck/file",
        "ck/hard",
        "ck/sub/x",
        "job.log",
        "snapshot.json",
    ]
    assert document["links"] == [
        {"path": "ck/rel", "target": "../ck/file"},
        {"path": "ck/sub/deep", "target": "../../job.log"},
        {"path": "ck/sub/dirlink", "target": ".."},
    ]
    assert document["skipped_links"] == [
        {"path": "ck/pw", "target": "/etc/passwd"},
        {"path": "ck/up", "target": "../../outside"},
    ]
    assert document["absent"] == ["via/file"]


def test_a_download_through_a_linked_entry_finds_nothing(sshd: SshServer, tmp_path: Path) -> None:
    # An entry whose way holds a link (a job's `output -> /`, its checkpoint `output/etc`)
    # counts as missing on every executor: nothing outside the run is read.
    work = tmp_path / "work"
    run = work / "run"
    run.mkdir(parents=True)
    (run / "output").symlink_to(tmp_path / "outside")
    (tmp_path / "outside" / "etc").mkdir(parents=True)
    (tmp_path / "outside" / "etc" / "shadow").write_text("secret")
    executors: list[Executor] = [
        LocalExecutor(work),
        ScriptExecutor(LocalTransport(), str(work)),
        ssh_executor(sshd, work),
    ]
    try:
        for i, executor in enumerate(executors):
            dest = tmp_path / f"dl-{i}"
            assert executor.download(str(run), dest, ["output/etc"]) == Downloaded()
            assert executor.manifest(str(run), ["output/etc"]) == []
            assert not dest.exists()
    finally:
        for executor in executors:
            executor.close()
