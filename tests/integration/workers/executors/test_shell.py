"""`workers.executors.shell`: a download from a hostile target (one that sends the
archive it likes) is refused, or skips what cannot be stored, and nothing lands
outside its destination."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import pytest

from workers.errors import RetrievalError
from workers.executors import LocalTransport, ScriptExecutor
from workers.executors.errors import UnsafeArchive
from workers.executors.transport import Completed
from workers.retrieval import retrieve

from ..retrieval.conftest import leftovers, listing


class ReplayTransport(LocalTransport):
    """A local transport whose downloads receive `archive` whatever the script: a
    hostile target."""

    def __init__(self, archive: bytes) -> None:
        super().__init__()
        self.archive = archive

    def receive(
        self,
        script: str,
        *,
        action: str,
        sink: Callable[[IO[bytes]], None],
        args: Sequence[str] = (),
    ) -> Completed:
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
                 run_id="run-1")  # fmt: skip
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
