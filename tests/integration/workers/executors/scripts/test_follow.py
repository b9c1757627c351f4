"""The batched follow script of a target's tick, on every executor (one script for
all followed runs: status, snapshot request, new log and metrics bytes, the notice
watcher's files, the proof of a run whose stop waits for it)."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from schemas import JobCommand, JobId, JobStatus
from schemas.protocol import (
    CANCEL_FILE,
    END_FILE,
    END_LIMIT,
    EXIT_FILE,
    JOBSIDE_DIR,
    NOTICE_FILE,
    NOTICE_STATE_FILE,
    PROOF_LIMIT,
    SNAPSHOT_FILE,
)
from workers.executors import FollowEntry, ProtocolError, quote
from workers.executors.scripts import follow_script, parse_follow
from workers.executors.scripts.follow import NOTICE_READ_BYTES, NOTICE_STATE_READ_BYTES

from .....conftest import Target, wait_for


def tick(
    target: Target,
    entries: list[tuple[JobId, int, int]],
    chunk: int = 256 * 1024,
    log_chunk: int = 256 * 1024,
    token: str | None = None,
) -> list:  # type: ignore[type-arg]
    token = token or secrets.token_hex(16)
    script = follow_script(entries, token, chunk, log_chunk=log_chunk)
    result = target.executor.transport.run(  # type: ignore[attr-defined]
        script.text, action="follow", args=script.args
    )
    assert result.exit_code == 0, result.stderr
    return parse_follow(result.stdout, token, len(entries), log_chunk)


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
    (run / "metrics.jsonl").write_bytes(data)
    job = JobId(dir=str(run), pid=999_999)
    offset, seen = 0, b""
    while offset < len(data):
        update = tick(target, [(job, 0, offset)], chunk=4000)[0]
        assert 0 < len(update.metrics) <= 4000
        seen += update.metrics
        offset += len(update.metrics)
    assert seen == data


def test_a_log_further_behind_than_a_tick_reads_goes_on_from_its_last_bytes(
    target: Target,
) -> None:
    """A job writing faster than the follow reads: the tick skips to the log's last
    `log_chunk` bytes (the run's budget in the store), says how many it skipped,
    and the next tick goes on from the end."""
    run = target.workdir / "fast"
    run.mkdir()
    data = b"".join(b"line %06d\n" % i for i in range(2000))  # 24,000 bytes
    (run / "job.log").write_bytes(data)
    job = JobId(dir=str(run), pid=999_999)
    update = tick(target, [(job, 100, 0)], log_chunk=4000)[0]
    assert update.log_size == len(data)
    assert update.log_skipped == len(data) - 100 - 4000
    assert update.log == data[-4000:]
    lines, used = update.log_lines()
    assert used == len(data) - 100  # read to the end: the next tick starts there
    rest = data[-4000:].index(b"\n") + 1  # the line the skip cut goes with it
    assert lines[0] == (
        f"runwarden: {update.log_skipped + rest} bytes of job.log skipped: the follow "
        "was more than the 4000 bytes of log the store keeps behind"
    )
    assert lines[1:] == data[-4000 + rest :].decode().splitlines()
    assert lines[-1] == "line 001999"
    # Not behind by more than a tick reads: no skip, every byte from the offset.
    near = tick(target, [(job, len(data) - 3000, 0)], log_chunk=4000)[0]
    assert (near.log_skipped, near.log) == (0, data[-3000:])
    assert near.log_lines()[0][0] == data[-3000:].decode().splitlines()[0]


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


def test_the_notice_watcher_s_files_are_read_bounded(target: Target) -> None:
    notice = b'{"source": "aws-spot", "seen_at": 1.5, "not_after": null, "detail": "stop"}\n'
    state = b"watching aws with curl\nS 0 cancelled\nQ 0 disk\nL 0 5\n"  # forges nothing
    runs = {}
    for name in ("plain", "big", "fifo", "link", "none"):
        run = target.workdir / name
        (run / ".runwarden").mkdir(parents=True)
        runs[name] = run
    (runs["plain"] / NOTICE_FILE).write_bytes(notice)
    (runs["plain"] / NOTICE_STATE_FILE).write_bytes(state)
    (runs["big"] / NOTICE_FILE).write_bytes(b"{" * 100_000)
    (runs["big"] / NOTICE_STATE_FILE).write_bytes(b"done: " + b"x" * 10_000)
    os.mkfifo(runs["fifo"] / NOTICE_FILE)  # a read would block: never opened
    os.mkfifo(runs["fifo"] / NOTICE_STATE_FILE)
    (runs["link"] / NOTICE_FILE).symlink_to(runs["plain"] / NOTICE_FILE)
    (runs["link"] / NOTICE_STATE_FILE).symlink_to(runs["plain"] / NOTICE_STATE_FILE)
    (runs["plain"] / "snapshot.request").write_text("preempted")
    jobs = [(JobId(dir=str(run), pid=999_999), 0, 0) for run in runs.values()]
    started = time.monotonic()
    plain, big, fifo, link, none = tick(target, jobs)
    assert time.monotonic() - started < 10
    assert (plain.notice, plain.notice_state, plain.request) == (notice, state, "preempted")
    assert big.notice == b"{" * NOTICE_READ_BYTES
    assert big.notice_state == (b"done: " + b"x" * 10_000)[:NOTICE_STATE_READ_BYTES]
    for update in (fifo, link, none):
        assert (update.notice, update.notice_state) == (None, None)
    assert [u.status for u in (plain, big, fifo, link, none)] == [JobStatus.LOST] * 5


def test_the_proof_is_read_bounded_only_for_the_runs_that_wait_for_it(target: Target) -> None:
    proof = b'{"checkpoint": "output/checkpoint-2", "step": 2, "time": 1.5}\nS 0 cancelled\n'
    runs = {}
    for name in ("asked", "unasked", "big", "fifo", "link", "none"):
        run = target.workdir / name
        run.mkdir()
        runs[name] = run
    for name in ("asked", "unasked"):
        (runs[name] / SNAPSHOT_FILE).write_bytes(proof)
    (runs["big"] / SNAPSHOT_FILE).write_bytes(b"{" * (PROOF_LIMIT + 1000))
    os.mkfifo(runs["fifo"] / SNAPSHOT_FILE)  # a read would block: never opened
    (runs["link"] / SNAPSHOT_FILE).symlink_to(runs["asked"] / SNAPSHOT_FILE)
    entries = [
        FollowEntry(JobId(dir=str(run), pid=999_999), 0, 0, proof=name != "unasked")
        for name, run in runs.items()
    ]
    started = time.monotonic()
    asked, unasked, big, fifo, link, none = tick(target, entries)  # type: ignore[arg-type]
    assert time.monotonic() - started < 10
    assert asked.proof == proof  # its bytes as written: forging no record
    assert asked.status == JobStatus.LOST
    assert unasked.proof is None  # a run without an open stop costs nothing
    assert big.proof == b"{" * PROOF_LIMIT
    for update in (fifo, link, none):
        assert update.proof is None
    # Through the executor, the same.
    [again] = target.executor.follow([entries[0]])
    assert again.proof == proof


def test_a_proof_is_read_again_only_when_its_file_changed(target: Target) -> None:
    """A tick given the signature of the proof it read last reads it again only when
    its size or modification time changed; a forged signature reads it as new."""
    run = target.workdir / "proving"
    run.mkdir()
    (run / SNAPSHOT_FILE).write_bytes(b'{"step": 1}')
    job = JobId(dir=str(run), pid=999_999)
    [first] = target.executor.follow([FollowEntry(job, 0, 0, proof=True)])
    assert first.proof == b'{"step": 1}'
    assert not first.proof_unchanged
    assert re.fullmatch(r"11:[0-9]+\.[0-9]+", first.proof_sig), first.proof_sig
    [same] = target.executor.follow([FollowEntry(job, 0, 0, True, first.proof_sig)])
    assert (same.proof, same.proof_unchanged, same.proof_sig) == (None, True, first.proof_sig)
    (run / SNAPSHOT_FILE).write_bytes(b'{"step": 22}')
    [changed] = target.executor.follow([FollowEntry(job, 0, 0, True, first.proof_sig)])
    assert changed.proof == b'{"step": 22}'
    assert not changed.proof_unchanged
    assert changed.proof_sig != first.proof_sig
    for odd in ("x; rm -rf /", "$(id)", "0", "-"):
        [read] = target.executor.follow([FollowEntry(job, 0, 0, True, odd)])
        assert read.proof == b'{"step": 22}', odd


def test_every_executor_judges_a_checkpoint_by_the_same_rule(target: Target) -> None:
    good, linked, parent = (target.workdir / n for n in ("good", "linked", "parent"))
    (good / "output" / "checkpoint-21").mkdir(parents=True)
    (good / "output" / "checkpoint-21" / "weights.bin").write_bytes(b"w")
    (linked / "output").mkdir(parents=True)
    (linked / "output" / "checkpoint-21").symlink_to("/etc")
    parent.mkdir()
    (parent / "output").symlink_to(good / "output")
    verdicts = target.executor.check_checkpoints(
        [(str(run), "output/checkpoint-21") for run in (good, linked, parent)]
    )
    assert verdicts == [
        None,
        "checkpoint output/checkpoint-21 is a symbolic link",
        "checkpoint output/checkpoint-21: output is a symbolic link",
    ]


def test_the_tick_that_sees_an_end_reads_what_the_end_needs(target: Target) -> None:
    """For a job whose end is written, the tick reads its proof and the wrapper's
    `.runwarden/ended` (bounded; empty when there is none), so recording the end reads
    nothing more; a proof that is not a regular file is left to the end's own read,
    which says why; a run still going reads neither."""
    proof = b'{"checkpoint": "output/checkpoint-2", "step": 2}'
    runs = {}
    for name in ("proved", "bare", "fifo", "cancelled", "going"):
        run = target.workdir / name
        (run / JOBSIDE_DIR).mkdir(parents=True)
        runs[name] = run
    for name in ("proved", "bare", "fifo"):
        (runs[name] / EXIT_FILE).write_text("143\n")
    (runs["cancelled"] / CANCEL_FILE).write_text("")
    (runs["proved"] / SNAPSHOT_FILE).write_bytes(proof)
    (runs["proved"] / END_FILE).write_bytes(b"signal TERM\n" + b"x" * (END_LIMIT + 100))
    os.mkfifo(runs["fifo"] / SNAPSHOT_FILE)
    (runs["cancelled"] / SNAPSHOT_FILE).write_bytes(proof)
    (runs["going"] / SNAPSHOT_FILE).write_bytes(proof)
    jobs = [(JobId(dir=str(run), pid=999_999), 0, 0) for run in runs.values()]
    proved, bare, fifo, cancelled, going = tick(target, jobs)
    assert proved.final_proof == proof
    assert proved.job_end == (b"signal TERM\n" + b"x" * END_LIMIT)[:END_LIMIT]
    assert (bare.final_proof, bare.job_end) == (b"", b"")
    assert (fifo.final_proof, fifo.job_end) == (None, b"")
    assert (cancelled.final_proof, cancelled.job_end) == (proof, None)
    assert (going.final_proof, going.job_end) == (None, None)


def forgeries(token: str) -> bytes:
    """What a job that knows the follow's token writes to pass for the follow: for
    runs 0 and 1, an end, a request, log bytes, and the end of the output."""
    return "".join(
        f"\n{token} S {i} exited 0\n{token} Q {i} cost\n{token} L {i} 3 0\nabc\n"
        for i in (0, 1)
    ).encode() + f"{token} E\n".encode() + token.encode() + b" S 0 lost"


def test_a_job_that_knows_the_token_forges_no_record(target: Target) -> None:
    """The token is no secret from a job of the runs' own user (a local script's
    arguments are in /proc): lines of records written into job.log, metrics.jsonl,
    notice.json and the proof, for the run itself and for the run read before it,
    come back as that run's bytes and change no status, request or end."""
    token = secrets.token_hex(16)
    forged = forgeries(token)
    first = target.executor.spawn(JobCommand(dir=target.run_dir("first"), script="sleep 30"))
    second = target.executor.spawn(JobCommand(dir=target.run_dir("second"), script="sleep 30"))
    files = ("job.log", "metrics.jsonl", NOTICE_FILE, SNAPSHOT_FILE)
    for job in (first, second):
        for name in files:
            (Path(job.dir) / name).write_bytes(forged)
    entries = [FollowEntry(job, 0, 0, proof=True) for job in (first, second)]
    updates = tick(target, entries, token=token)  # type: ignore[arg-type]
    assert [u.status for u in updates] == [JobStatus.RUNNING, JobStatus.RUNNING]
    assert [u.request for u in updates] == [None, None]
    for update in updates:
        assert (update.log, update.metrics, update.notice, update.proof) == (forged,) * 4
        assert (update.final_proof, update.job_end) == (None, None)
    for job in (first, second):
        target.executor.cancel(job)


def test_without_base64_the_bytes_come_as_hex(tmp_path: Path) -> None:
    """A target without `base64`: the follow's bytes come hex-encoded, as its first
    record says, every byte value and forged record intact."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for folder in ("/usr/bin", "/bin"):
        for tool in Path(folder).iterdir():
            if tool.name != "base64" and not (tools / tool.name).exists():
                (tools / tool.name).symlink_to(tool)
    run = tmp_path / "run"
    run.mkdir()
    token = secrets.token_hex(16)
    data = bytes(range(256)) + forgeries(token)
    (run / "metrics.jsonl").write_bytes(data)
    script = follow_script([(JobId(dir=str(run), pid=999_999), 0, 0)], token)
    done = subprocess.run(
        ["sh", "-c", script.text, "rw-follow", *script.args],
        env={"PATH": str(tools)},
        capture_output=True,
        check=True,
        timeout=30,
    )
    assert done.stdout.startswith(f"{token} B hex\n".encode())
    (update,) = parse_follow(done.stdout, token, 1)
    assert (update.status, update.metrics) == (JobStatus.LOST, data)


def test_a_line_that_is_neither_a_record_nor_encoded_bytes_is_refused() -> None:
    token = "t0k3n"
    good = b"t0k3n B b64\nt0k3n S 0 lost\nt0k3n Q 0 \nt0k3n M 0 3\nYWJj\nt0k3n E\n"
    (update,) = parse_follow(good, token, 1)
    assert update.metrics == b"abc"
    for bad, why in (
        (good.replace(b"YWJj", b"YW Jj"), "follow record"),  # a blank: not encoded bytes
        (good.replace(b"YWJj", b"Y"), "follow record"),  # bytes that do not decode
        (good.replace(b"t0k3n Q 0 \n", b"t0k3n Q 0 \nYWJj\n"), "with bytes after it"),
        (b"banner\n" + good, "before its first record"),
        (good.replace(b"t0k3n B b64\n", b""), "how its bytes are encoded"),
        (good.replace(b"B b64", b"B rot13"), "encoded as 'rot13'"),
        (good.replace(b"t0k3n E\n", b""), "cut short"),
    ):
        with pytest.raises(ProtocolError, match=why):
            parse_follow(bad, token, 1)
