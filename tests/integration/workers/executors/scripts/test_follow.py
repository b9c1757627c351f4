"""The batched follow script of a target's tick, on every executor (one script for
all followed runs: status, snapshot request, new log and metrics bytes)."""

from __future__ import annotations

import secrets
from pathlib import Path

from schemas import JobCommand, JobId, JobStatus
from workers.executors import quote
from workers.executors.scripts import follow_script, parse_follow

from .....conftest import Target, wait_for


def tick(target: Target, entries: list[tuple[JobId, int, int]], chunk: int = 256 * 1024) -> list:  # type: ignore[type-arg]
    token = secrets.token_hex(16)
    result = target.executor.transport.run(  # type: ignore[attr-defined]
        follow_script(entries, token, chunk), action="follow"
    )
    assert result.exit_code == 0, result.stderr
    return parse_follow(result.stdout, token, len(entries))


def test_one_script_reports_every_run(target: Target) -> None:
    forged = "S 0 cancelled\nQ 0 disk\nL 0 5\n"  # file content cannot forge records
    running = target.executor.spawn(
        JobCommand(
            dir=target.run_dir("a $(x) 'q'"),
            script=f"printf '%s' {quote(forged)} ; printf 'x\\r' >> metrics.jsonl; sleep 30",
        )
    )
    exited = target.executor.spawn(JobCommand(dir=target.run_dir("b"), script="exit 3"))
    wait_for(lambda: target.executor.status(exited).is_finished)
    wait_for((Path(running.dir) / "metrics.jsonl").exists)
    target.executor.put_file(f"{exited.dir}/snapshot.request", "deadline\nrest")
    (Path(running.dir) / "garbage").mkdir()
    gone = JobId(dir=str(target.workdir / "gone"), pid=999_999)
    updates = tick(target, [(running, 0, 0), (exited, 0, 0), (gone, 0, 0)])
    assert [u.status for u in updates] == [JobStatus.RUNNING, JobStatus.exited(3), JobStatus.LOST]
    assert [u.request for u in updates] == [None, "deadline", None]
    assert updates[0].log == forged.encode()
    assert updates[0].log_size == len(forged)
    assert updates[0].metrics == b"x\r"
    assert updates[2].log == b""
    # From the offsets on: only what is new; nothing for files that did not grow.
    again = tick(target, [(running, len(forged) - 4, 2)])
    assert again[0].log == forged.encode()[-4:]
    assert again[0].metrics == b""
    target.executor.cancel(running)


def test_a_file_larger_than_the_chunk_comes_in_pieces(target: Target) -> None:
    run = target.workdir / "big"
    run.mkdir()
    data = bytes(range(256)) * 100
    (run / "job.log").write_bytes(data)
    job = JobId(dir=str(run), pid=999_999)
    offset, seen = 0, b""
    while offset < len(data):
        update = tick(target, [(job, offset, 0)], chunk=4000)[0]
        assert 0 < len(update.log) <= 4000
        seen += update.log
        offset += len(update.log)
    assert seen == data


def test_a_garbage_exit_code_is_that_runs_alone(target: Target) -> None:
    good, bad = target.workdir / "good", target.workdir / "bad"
    for run, code in ((good, "0\n"), (bad, "zz\n")):
        run.mkdir()
        (run / "exit_code").write_text(code)
    updates = tick(
        target,
        [(JobId(dir=str(good), pid=999_999), 0, 0), (JobId(dir=str(bad), pid=999_998), 0, 0)],
    )
    assert updates[0].status == JobStatus.exited(0)
    assert updates[1].status == JobStatus.LOST  # garbage is no exit code


def test_many_runs_in_one_script(target: Target) -> None:
    jobs = []
    for i in range(150):
        run = target.workdir / f"r{i}"
        run.mkdir()
        (run / "exit_code").write_text(f"{i % 7}\n")
        (run / "job.log").write_text(f"run {i}\n")
        jobs.append((JobId(dir=str(run), pid=999_999), 0, 0))
    updates = tick(target, jobs)
    assert [u.status for u in updates] == [JobStatus.exited(i % 7) for i in range(150)]
    assert [u.log for u in updates] == [f"run {i}\n".encode() for i in range(150)]
