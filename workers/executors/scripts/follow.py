"""The follow tick's one script per target: every followed run's status, request and
new log and metrics bytes in one round trip, and the parser of its answer."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from schemas import JobId, JobStatus
from schemas.protocol import END_LIMIT, JOB_LOG, PROOF_LIMIT

from ..errors import InvalidArgument, ProtocolError
from ..lines import complete_lines
from .common import Script, check_job_pid, sh, start_arg
from .status import parse_status

__all__ = [
    "CUT_MARK",
    "FOLLOW_CHUNK_BYTES",
    "FOLLOW_TIMEOUT_S",
    "NOTICE_READ_BYTES",
    "NOTICE_STATE_READ_BYTES",
    "FollowEntry",
    "FollowUpdate",
    "chunk_lines",
    "follow_script",
    "parse_follow",
]

FOLLOW_TIMEOUT_S: Final = 30.0
"""Longest run of one follow script, in seconds: every read in it is bounded, so only
an unreachable or overloaded target takes this long."""
FOLLOW_CHUNK_BYTES: Final = 256 * 1024
"""Most new bytes of one file a follow tick reads for one run; the rest comes next
tick."""
NOTICE_READ_BYTES: Final = 4097
"""Most bytes of `notice.json` a tick reads: one more than a notice may hold
(`notices.NOTICE_FILE_LIMIT`), so a larger file is seen as too large."""
NOTICE_STATE_READ_BYTES: Final = 200
"""Most bytes of `.runwarden/notice.state` a tick reads (its first line counts)."""


class FollowEntry(NamedTuple):
    """One run of a follow tick: its job, how far its files were read (bytes), and
    whether its proof is read too (a run whose stop waits for its proof): with
    `proof_seen`, the signature of the proof last read ([`FollowUpdate.proof_sig`]),
    only when it changed."""

    job: JobId
    log_offset: int
    metrics_offset: int
    proof: bool = False
    proof_seen: str = ""


_FILE_RECORDS: Final = frozenset("LMNWPpFfXx")
"""The records of a file's bytes (or of its absence: `p`, `f`, `x`)."""
_PROOF_SIG: Final = re.compile(r"[0-9]{1,20}:[0-9]{1,20}(?:\.[0-9]{1,12})?")
"""A proof's signature as `find -printf '%s:%T@'` prints it: its size and its
modification time."""


def follow_script(
    entries: Sequence[FollowEntry | tuple[JobId, int, int]],
    token: str,
    chunk: int = FOLLOW_CHUNK_BYTES,
    log_chunk: int = FOLLOW_CHUNK_BYTES,
) -> Script:
    """One script for a whole target's follow tick (`sh/follow.sh`, the runs its
    arguments): for each `(job, log_offset,
    metrics_offset[, proof])` it prints, each record a line beginning with `token`,
    after a first record `B b64` (or `B hex`: no `base64` on the target) that says
    how the bytes read from files are encoded. Those bytes follow their record as
    encoded lines, which hold no blank: nothing a job writes can make a line that
    reads as a record, even a job that knows `token` (see `parse_follow`).

    - `S <i> <status>`: the job's status, as `status_script` decides it;
    - `Q <i> <reason>` when `snapshot.request` is a regular file that is not empty
      (the first line of its first 64 bytes, at most 32 bytes of it; `requested`
      when that line is empty), `Q <i>` with nothing when there is no request;
    - `N <i>` then the first [`NOTICE_READ_BYTES`] of `notice.json`, and `W <i>`
      then the first [`NOTICE_STATE_READ_BYTES`] of `.runwarden/notice.state` (the
      preemption-notice watcher's files), each only when it is a regular file; the
      notice is read after the request, and the watcher writes it before the
      request, so a request it wrote always comes with its notice;
    - `P <i> <sig>` then the first `PROOF_LIMIT` bytes of `snapshot.json`, only for
      an entry whose `proof` is set and only when it is a regular file (a run
      without an open stop costs nothing); `sig` is its size and modification time
      (`SIZE:MTIME`, empty without GNU find), and when it is the entry's
      `proof_seen`, only `p <i> <sig>` comes: the proof was not read again;
    - for a job whose end is written (`exit_code` or `cancelled` there): `F <i>` then
      the first `PROOF_LIMIT` bytes of `snapshot.json` (`f <i>` when there is none;
      neither when it is not a regular file), and with `exit_code`, `X <i>` then the
      first `END_LIMIT` bytes of `.runwarden/ended` (`x <i>` when it is not a regular
      file): what the run's end reads, so it reads nothing more;
    - `L <i> <n> <k>` then at most `log_chunk` bytes of `job.log` from its offset
      plus `k`, and `M <i> <n>` then at most `chunk` bytes of `metrics.jsonl` from
      its offset, only for files that grew past their offset (`n` is the file's
      size). `k` is 0 unless the log is more than `log_chunk` bytes behind: then the
      tick skips ahead to its last `log_chunk` bytes (`log_chunk` is the run's log
      budget in the store, which would drop the older ones anyway), so a job that
      writes fast is never followed further and further behind.

    Every file the job can write is read only when it is a regular file and not a
    symbolic link, bounded in bytes, and never blocking (`rw_read`): a directory, a
    FIFO, a link or a huge file in its place costs this run nothing but its own
    record, and never stalls the others. Sizes come from one `find -printf` (GNU)
    for the whole batch, else one `ls -lnd` per file (which opens nothing);
    statuses are read with shell builtins: a tick over idle runs starts one process,
    whatever their number.
    """
    if not token.isalnum():
        raise InvalidArgument("the follow token is alphanumeric")
    args = [
        token,
        str(chunk),
        str(log_chunk),
        str(NOTICE_READ_BYTES),
        str(NOTICE_STATE_READ_BYTES),
        str(PROOF_LIMIT),
        str(END_LIMIT),
    ]
    for entry in entries:
        job, log_offset, metrics_offset = entry[0], entry[1], entry[2]
        proof = "0"
        if isinstance(entry, FollowEntry) and entry.proof:
            proof = entry.proof_seen if _PROOF_SIG.fullmatch(entry.proof_seen) else "-"
        if log_offset < 0 or metrics_offset < 0:
            raise InvalidArgument("offsets are non-negative")
        args += [
            job.dir,
            str(check_job_pid(job)),
            start_arg(job),
            str(int(log_offset)),
            str(int(metrics_offset)),
            proof,
        ]
    return Script(sh("group", "read", "status_fn", "follow"), tuple(args))


@dataclass(frozen=True)
class FollowUpdate:
    """What one follow tick found for one run."""

    status: JobStatus | ProtocolError
    request: str | None
    """The reason in `snapshot.request`, or None when there is none."""
    log: bytes = b""
    log_size: int = 0
    metrics: bytes = b""
    metrics_size: int = 0
    notice: bytes | None = None
    """The first bytes of `notice.json` (at most [`NOTICE_READ_BYTES`]), None when
    it is not there (parse with `notices.parse_notice`)."""
    notice_state: bytes | None = None
    """The first bytes of `.runwarden/notice.state` (at most
    [`NOTICE_STATE_READ_BYTES`]), None when it is not there (parse with
    `notices.parse_notice_state`)."""
    proof: bytes | None = None
    """The first `PROOF_LIMIT` bytes of `snapshot.json` when the entry asked for its
    proof, it is a regular file and it changed since `proof_seen`, else None (parse
    with `schemas.parse_proof`)."""
    scheduler: str | None = None
    """What the target's scheduler says of the job (a Slurm target's `Slurm job <id>:
    <STATE> (<reason>)`), None without a scheduler or when it no longer knows the job."""
    proof_sig: str = ""
    """The signature of `snapshot.json` read or found unchanged (`SIZE:MTIME`; empty
    when unknown): the next tick's `FollowEntry.proof_seen`."""
    proof_unchanged: bool = False
    """The proof is the one of `proof_seen` still: not read again."""
    final_proof: bytes | None = None
    """For a job whose end is written: the first `PROOF_LIMIT` bytes of
    `snapshot.json` (empty when there is none); None when not read (no end written,
    or not a regular file: the end reads it itself and says why)."""
    job_end: bytes | None = None
    """For a job whose `exit_code` is written: the first `END_LIMIT` bytes of
    `.runwarden/ended` (empty when it is not a regular file); None when not read."""
    log_skipped: int = 0
    """Bytes of `job.log` past the offset that this tick skipped, [`log`] starting
    after them (the log was more than a tick reads behind)."""
    log_chunk: int = FOLLOW_CHUNK_BYTES
    """Most bytes of `job.log` the tick read (the script's `log_chunk`)."""

    def log_lines(self) -> tuple[list[str], int]:
        """The complete lines of [`log`] and how many bytes past the offset they used
        (the next tick reads on from there); see [`chunk_lines`]. After a skip, the
        first line is a note saying how many bytes were skipped (the skipped bytes,
        and the rest of the line they cut, count as used)."""
        if not self.log_skipped:
            return chunk_lines(self.log, self.log_chunk)
        # The read begins inside a line: its rest goes with the skipped bytes.
        rest = self.log.find(b"\n") + 1
        lines, used = chunk_lines(self.log[rest:], self.log_chunk - rest)
        skipped = self.log_skipped + rest
        note = (
            f"runwarden: {skipped} bytes of {JOB_LOG} skipped: the follow was more than "
            f"the {self.log_chunk} bytes of log the store keeps behind"
        )
        return [note, *lines], skipped + used

    def metrics_lines(self) -> tuple[list[str], int]:
        """The complete lines of [`metrics`], as [`log_lines`]."""
        return chunk_lines(self.metrics)


CUT_MARK: Final = " [runwarden: line cut]"
"""Appended to a line emitted cut (longer than a tick reads); its rest follows as the
next line."""


def chunk_lines(chunk: bytes, chunk_bytes: int = FOLLOW_CHUNK_BYTES) -> tuple[list[str], int]:
    """The complete lines of `chunk`, a read of at most `chunk_bytes` bytes, and how
    many bytes they used. A full chunk with no line end (a line at least as long as a
    tick reads) is cut, marked with [`CUT_MARK`] and emitted, so a long line never
    stalls the follow."""
    cap = chunk_bytes - 1 if len(chunk) >= chunk_bytes else None
    lines, used, skip = complete_lines(chunk, cap=cap)
    if skip == "eol" and lines:
        lines[-1] += CUT_MARK
    return lines, used


def parse_follow(
    output: bytes, token: str, count: int, log_chunk: int = FOLLOW_CHUNK_BYTES
) -> list[FollowUpdate]:
    """The updates of a [`follow_script`] run over `count` runs, in order
    (`log_chunk` as given to the script).

    The output is lines: a record is a line beginning with `token` and a blank; the
    bytes read from a file follow their record as lines of base64 (or hex, as the
    first record, `B`, says), which hold no blank, so no byte a job wrote can be
    taken for a record, even by a job that knows the token.

    Raises:
        ProtocolError: when the output is cut short (no end record) or malformed: a
        line that is neither a record nor encoded bytes, bytes after a record that
        has none, or bytes that do not decode.
    """
    decode, records = _records(output, token)
    status: dict[int, JobStatus | ProtocolError] = {}
    request: dict[int, str | None] = {}
    files: dict[tuple[str, int], tuple[bytes, int]] = {}
    skipped: dict[tuple[str, int], int] = {}
    signature: dict[int, str] = {}
    ended = False
    for words, lines in records:
        kind = words[0]
        if lines and kind not in _FILE_RECORDS:
            raise ProtocolError(f"follow record {kind[:20]!r} with bytes after it")
        try:
            if kind == "E":
                ended = True
                continue
            index = int(words[1])
            if not 0 <= index < count:
                raise ProtocolError(f"follow record for run {index} of {count}")
            if kind == "S":
                try:
                    status[index] = parse_status(" ".join(words[2:]))
                except ProtocolError as error:
                    status[index] = error
            elif kind == "Q":
                reason = " ".join(words[2:]).strip()
                request[index] = reason or None
            elif kind in _FILE_RECORDS:
                payload = decode(b"".join(lines))
                if kind in ("P", "p"):
                    signature[index] = words[2] if len(words) > 2 else ""
                size = int(words[2]) if kind in ("L", "M") else len(payload)
                # `f` and `x` say the file is not there: empty, as it reads.
                key = kind.upper() if kind in ("f", "x") else kind
                files[(key, index)] = (b"" if key != kind else payload, size)
                skipped[(kind, index)] = int(words[3]) if kind == "L" and len(words) > 3 else 0
            else:
                raise ProtocolError(f"follow record {kind[:20]!r}")
        except (IndexError, ValueError) as error:
            raise ProtocolError(f"follow record {' '.join(words)[:80]!r}") from error
    if not ended or len(status) != count:
        raise ProtocolError("the follow output was cut short")
    return [
        _update(
            index,
            status[index],
            request=request,
            files=files,
            skipped=skipped,
            signature=signature,
            log_chunk=log_chunk,
        )
        for index in range(count)
    ]


def _records(
    output: bytes, token: str
) -> tuple[Callable[[bytes], bytes], list[tuple[list[str], list[bytes]]]]:
    """The decoder the `B` record names and the records after it: each one's words
    (after the token) and its lines of encoded bytes."""
    lead = token.encode() + b" "
    records: list[tuple[list[str], list[bytes]]] = []
    for line in output.split(b"\n"):
        if line.startswith(lead):
            records.append((line[len(lead) :].decode("utf-8", "replace").split(" "), []))
        elif line:
            if not records:
                raise ProtocolError("follow output before its first record")
            records[-1][1].append(line)
    if not records or records[0][0][:1] != ["B"] or len(records[0][0]) != 2:
        raise ProtocolError("the follow output does not say how its bytes are encoded")
    decode = _DECODERS.get(records[0][0][1])
    if decode is None:
        raise ProtocolError(f"follow bytes encoded as {records[0][0][1][:20]!r}")
    return decode, records[1:]


def _base64(text: bytes) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as error:
        raise ValueError(f"follow bytes are not base64: {error}") from error


_DECODERS: Final[dict[str, Callable[[bytes], bytes]]] = {
    "b64": _base64,
    "hex": lambda text: bytes.fromhex(text.decode("ascii")),
}
"""How the bytes after a record are encoded (the `B` record), and their decoder
(`ValueError` for bytes that do not decode)."""


def _update(
    index: int,
    status: JobStatus | ProtocolError,
    *,
    request: dict[int, str | None],
    files: dict[tuple[str, int], tuple[bytes, int]],
    skipped: dict[tuple[str, int], int],
    signature: dict[int, str],
    log_chunk: int,
) -> FollowUpdate:
    """The update of run `index` from the records `parse_follow` gathered."""
    log, log_size = files.get(("L", index), (b"", 0))
    metrics, metrics_size = files.get(("M", index), (b"", 0))
    notice = files.get(("N", index))
    state = files.get(("W", index))
    proof = files.get(("P", index))
    final_proof = files.get(("F", index))
    job_end = files.get(("X", index))
    return FollowUpdate(
        status,
        request.get(index),
        log,
        log_size,
        metrics,
        metrics_size,
        notice=None if notice is None else notice[0],
        notice_state=None if state is None else state[0],
        proof=None if proof is None else proof[0],
        proof_sig=signature.get(index, ""),
        proof_unchanged=("p", index) in files,
        final_proof=None if final_proof is None else final_proof[0],
        job_end=None if job_end is None else job_end[0],
        log_skipped=skipped.get(("L", index), 0),
        log_chunk=log_chunk,
    )
