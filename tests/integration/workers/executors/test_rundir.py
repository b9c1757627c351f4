"""The worker's own reading of a run directory (`workers.executors.rundir`) against the
follow script it stands in for: run directories in every state a job can leave them
in, hostile ones included, read both ways; and what only the native reading refuses
(a link on the way to a file, a file of another user)."""

from __future__ import annotations

import dataclasses
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas import JobId, JobStatus
from workers.executors import FollowEntry
from workers.executors.rundir import Reader, follow_here, status_here
from workers.executors.scripts import follow_script, parse_follow
from workers.executors.scripts.follow import FollowUpdate
from workers.executors.transport import LocalTransport

LOG_CHUNK = 64
ME = Reader(os.getuid(), frozenset(os.getgroups()))


def _start(pid: int) -> int:
    line = Path(f"/proc/{pid}/stat").read_bytes()
    return int(line.rpartition(b") ")[2].split()[19])


@pytest.fixture(scope="module")
def groups() -> Iterator[tuple[int, int, int]]:
    """A live job group (pid, start) and a pid whose group is gone."""
    live = subprocess.Popen(["sleep", "600"], start_new_session=True)
    dead = subprocess.Popen(["true"], start_new_session=True)
    dead.wait()
    try:
        yield live.pid, _start(live.pid), dead.pid
    finally:
        live.kill()
        live.wait()


def _script(entries: list[FollowEntry]) -> list[FollowUpdate]:
    token = secrets.token_hex(16)
    script = follow_script(entries, token, 256, log_chunk=LOG_CHUNK)
    result = LocalTransport().run(script.text, action="follow", args=script.args)
    assert result.exit_code == 0, result.stderr
    return parse_follow(result.stdout, token, len(entries), LOG_CHUNK)


def _comparable(update: FollowUpdate) -> FollowUpdate:
    status = update.status
    return dataclasses.replace(
        update,
        status=status if isinstance(status, JobStatus) else repr(str(status)),  # type: ignore[arg-type]
    )


def _write(run: Path, files: dict[str, bytes | str]) -> None:
    """Files of a run directory: bytes (or a `fifo`, `dir`, `link:TARGET` word)."""
    for name, content in files.items():
        path = run / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "fifo":
            os.mkfifo(path)
        elif content == "dir":
            path.mkdir()
        elif isinstance(content, str) and content.startswith("link:"):
            path.symlink_to(content[5:])
        else:
            assert isinstance(content, bytes)
            path.write_bytes(content)


CASES: dict[str, dict[str, bytes | str]] = {
    "running, records forged in its log": {
        "job.log": b"S 0 cancelled\nQ 0 disk\nL 0 5\n" * 3,
        "metrics.jsonl": b'{"step": 1}\r\n',
    },
    "exited, all the end reads": {
        "exit_code": b"3\n",
        "snapshot.request": b"deadline\nrest",
        "snapshot.json": b'{"step": 4}',
        ".runwarden/ended": b"end 3\n",
        "job.log": b"x" * 500,
        "notice.json": b"{" + b"n" * 5000,
        ".runwarden/notice.state": b"watching aws\n" * 30,
    },
    "garbage exit code": {"exit_code": b"3 and more\n"},
    "exit code of 11 digits": {"exit_code": b"99999999999\n"},
    "negative exit code": {"exit_code": b"-1\n\n"},
    "negative exit code of 11 digits": {"exit_code": b"-00000000003\n"},
    "negative exit code of 10 digits": {"exit_code": b"-1234567890\n"},
    "exit code a link": {"exit_code": "link:/etc/hostname", "snapshot.json": "link:/etc/passwd"},
    "cancelled as a directory": {"cancelled": "dir", "snapshot.request": b"\nsecond"},
    "cancelling, group gone": {"cancelling": b"", "snapshot.request": "fifo"},
    "hostile file types": {
        "job.log": "fifo",
        "metrics.jsonl": "link:/etc/passwd",
        "notice.json": "dir",
        ".runwarden/notice.state": "fifo",
        "exit_code": b"0\n",
        ".runwarden/ended": "link:/etc/passwd",
    },
    "a long request in UTF-8": {"snapshot.request": "é".encode() * 40 + b"\n"},
    "nothing at all": {},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("alive", [True, False], ids=["group-alive", "group-gone"])
def test_the_worker_reads_a_run_as_the_follow_script_does(
    tmp_path: Path, groups: tuple[int, int, int], case: str, alive: bool
) -> None:
    pid, start, dead = groups
    run = tmp_path / "run $(x)"
    run.mkdir()
    _write(run, CASES[case])
    job = JobId(dir=str(run), pid=pid if alive else dead, start=start)
    entries = [
        FollowEntry(job, 0, 0),
        FollowEntry(job, 10, 3, proof=True),
        FollowEntry(JobId(dir=str(tmp_path / "gone"), pid=dead, start=1), 0, 0),
    ]
    script = _script(entries)
    here = follow_here(entries, ME, 256, LOG_CHUNK)
    assert [_comparable(u) for u in here] == [_comparable(u) for u in script]
    # The proof's signature: unchanged is not read again, either way.
    if here[1].proof_sig:
        again = [FollowEntry(job, 0, 0, proof=True, proof_seen=here[1].proof_sig)]
        assert _comparable(follow_here(again, None, 256, LOG_CHUNK)[0]) == _comparable(
            _script(again)[0]
        )
        assert follow_here(again, None, 256, LOG_CHUNK)[0].proof_unchanged
    assert status_here(job, ME) == (here[0].status if not alive else JobStatus.RUNNING)


def test_an_adopted_job_s_status_is_decided_as_the_script_decides_it(
    tmp_path: Path, groups: tuple[int, int, int]
) -> None:
    pid, _, dead = groups
    for files in ({"cancelling": b""}, {"exit_code": b"0\n"}, {}):
        run = tmp_path / secrets.token_hex(4)
        run.mkdir()
        _write(run, files)
        entries = [FollowEntry(JobId(dir=str(run), pid=p), 0, 0) for p in (pid, dead)]
        assert [u.status for u in follow_here(entries, None)] == [
            u.status for u in _script(entries)
        ]


def test_a_link_on_the_way_is_never_followed(tmp_path: Path, groups: tuple[int, int, int]) -> None:
    _, _, dead = groups
    elsewhere = tmp_path / "elsewhere"
    _write(elsewhere, {"ended": b"forged end", "notice.state": b"forged state"})
    run = tmp_path / "run"
    _write(run, {"exit_code": b"0\n", ".runwarden": f"link:{elsewhere}"})
    update = follow_here([FollowEntry(JobId(dir=str(run), pid=dead, start=1), 0, 0)], None)[0]
    assert (update.job_end, update.notice_state) == (b"", None)
    # The run directory itself a link: not there.
    (tmp_path / "linked").symlink_to(run)
    linked = JobId(dir=str(tmp_path / "linked"), pid=dead, start=1)
    assert follow_here([FollowEntry(linked, 0, 0)], None)[0].status == JobStatus.LOST


def test_only_what_the_job_s_user_may_read_is_read(
    tmp_path: Path, groups: tuple[int, int, int]
) -> None:
    """Files read for user 4242 (group 4242, and 4343), by their modes as the kernel
    decides: a hard link to a file of root's the user may not read is not there."""
    assert os.geteuid() == 0, "this test gives files to another user: it needs root"
    _, _, dead = groups
    run = tmp_path / "run"
    _write(run, {"exit_code": b"7\n", "job.log": b"mine\n", "snapshot.request": b"disk\n"})
    entry = FollowEntry(JobId(dir=str(run), pid=dead, start=1), 0, 0)
    user = Reader(4242, frozenset({4242, 4343}))

    def read() -> tuple[object, bytes, str | None]:
        update = follow_here([entry], user)[0]
        return update.status, update.log, update.request

    os.chmod(run / "exit_code", 0o600)  # root's, for root only
    os.chown(run / "job.log", 4242, 0)
    os.chmod(run / "job.log", 0o044)  # the user's: its owner bits say no, the others yes
    os.chown(run / "snapshot.request", 0, 4343)
    os.chmod(run / "snapshot.request", 0o040)  # one of its groups may read it
    assert read() == (JobStatus.LOST, b"", "disk")
    os.chmod(run / "exit_code", 0o604)
    os.chmod(run / "job.log", 0o400)
    os.chown(run / "snapshot.request", 0, 5000)
    assert read() == (JobStatus.exited(7), b"mine\n", None)
    assert follow_here([entry], Reader(0, frozenset()))[0].request == "disk"
