"""Median latency of the small operations on a warm SSH connection (persistent
remote shell), beside the same operation's script over a fresh exec channel per
call on the same connection (sshd session setup each time), measured in the same
run against a real OpenSSH sshd on loopback started here.

    .venv/bin/python -m workers.reaper -- .venv/bin/python bench/ssh_ops.py \
        [--repeat 200] [--fresh-repeat 50] [--connect-repeat 15]

Per operation:

- `warm`: `SshExecutor.status` / `read_from` (4 KiB at offset 1000 of a 64 KiB
  file) / `put_file` on the already-open connection;
- `fresh channel`: the same script (from `workers.executors.scripts`) run as
  `sh -c SCRIPT rw ARG...` on a new exec channel of the same transport, each call;
- `full connect`: the same, on a new TCP + SSH connection each call (reference).

The floor line is an empty script (`transport.run(":")`) on the warm shell: the framing
and round trip every warm operation pays before its own processes.

Targets (issue 3): warm median <= 3 ms and fresh channel / warm >= 30.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._timing import median_s, ms
from bench.harness.sshd import start_sshd
from schemas import JobCommand, JobId
from workers.executors import scripts
from workers.executors.scripts import Script
from workers.executors.ssh import SshConnection, SshExecutor, SshTransport
from workers.executors.ssh.transport import sh_command
from workers.reaper import become_subreaper

TARGET_WARM_S = 0.003
TARGET_RATIO = 30.0
DATA = bytes(range(256)) * 256  # 64 KiB


CALL_TIMEOUT_S = 60.0
"""The most one call on a channel may wait for its server."""


def run_on(connection: SshConnection, script: Script) -> bytes:
    """Runs `script` as `sh -c` on a new exec channel of `connection`: reads all of
    stdout and stderr, then the exit status; returns stdout."""
    channel = connection.exec_channel()
    channel.settimeout(CALL_TIMEOUT_S)  # a stalled read ends the bench, it never hangs
    try:
        channel.exec_command(sh_command(script.text, script.args))
        channel.shutdown_write()
        out = bytearray()
        while chunk := channel.recv(1 << 20):
            out += chunk
        err = bytearray()
        while chunk := channel.recv_stderr(1 << 20):
            err += chunk
        code = channel.recv_exit_status()
    finally:
        channel.close()
    if code != 0:
        raise RuntimeError(f"script failed ({code}): {bytes(err)[:200]!r}")
    return bytes(out)


def full_connect(executor: SshExecutor, script: Script) -> bytes:
    """Runs `script` on a connection of its own (TCP, key exchange, auth), closed
    after."""
    connection = SshConnection(executor.destination)
    try:
        return run_on(connection, script)
    finally:
        connection.close()


Op = tuple[Callable[[], object], Callable[[], Script]]


def operations(executor: SshExecutor, job: JobId, run_dir: str) -> dict[str, Op]:
    """Each operation: the warm executor call, and a builder of its script."""
    data = f"{run_dir}/data.bin"
    Path(data).write_bytes(DATA)  # loopback: the "remote" disk is this one
    if executor.read_from(data, 1000, 4096) != DATA[1000:5096]:
        raise SystemExit("read_from answered other bytes")
    request = f"{run_dir}/snapshot.request"
    return {
        "status": (
            lambda: executor.status(job),
            lambda: scripts.status_script([job]),
        ),
        "read_from 4 KiB": (
            lambda: executor.read_from(data, 1000, 4096),
            lambda: scripts.read_range_script(data, 1000, 4096),
        ),
        "put_file": (
            lambda: executor.put_file(request, "requested"),
            lambda: scripts.put_file_script(request, run_dir, "requested"),
        ),
    }


def measure(executor: SshExecutor, ops: dict[str, Op], args: argparse.Namespace) -> list[str]:
    """Prints the table; returns one verdict line per operation."""
    transport = executor.transport
    assert isinstance(transport, SshTransport)
    connection = transport.connection
    print(f"{'operation':34} {'median':>11} {'x warm':>8}")
    floor = median_s(lambda: transport.run(":", action="probe"), args.repeat, warmup=10)
    print(f"{'(floor: empty script, warm)':34} {ms(floor)}")
    verdicts = []
    for name, (warm_call, make_script) in ops.items():
        warm = median_s(warm_call, args.repeat, warmup=10)

        def fresh_call(make: Callable[[], Script] = make_script) -> bytes:
            return run_on(connection, make())

        def connect_call(make: Callable[[], Script] = make_script) -> bytes:
            return full_connect(executor, make())

        fresh = median_s(fresh_call, args.fresh_repeat, warmup=3)
        full = median_s(connect_call, args.connect_repeat, warmup=1)
        ratio = fresh / warm
        print(f"{name + ' warm':34} {ms(warm)} {1.0:8.2f}")
        print(f"{name + ' fresh channel':34} {ms(fresh)} {ratio:8.2f}")
        print(f"{name + ' full connect':34} {ms(full)} {full / warm:8.2f}")
        verdicts.append(
            f"{name}: warm {warm * 1000:.2f} ms <= 3 ms "
            f"{'OK' if warm <= TARGET_WARM_S else 'MISSED'}; "
            f"fresh/warm {ratio:.1f} >= 30 {'OK' if ratio >= TARGET_RATIO else 'MISSED'}"
        )
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="warm calls per op")
    parser.add_argument("--fresh-repeat", type=int, default=50, help="fresh-channel calls per op")
    parser.add_argument("--connect-repeat", type=int, default=15, help="full-connect calls per op")
    parser.add_argument("--tiny", action="store_true", help="the smoke test's run: least of all")
    args = parser.parse_args()
    if args.tiny:
        args.repeat, args.fresh_repeat, args.connect_repeat = 5, 3, 2
    become_subreaper()
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-ssh-"))
    server = start_sshd(tmp)
    executor = SshExecutor.connect(
        server.destination,
        str(server.workdir),
        identity=server.client_key,
        known_hosts=server.known_hosts,
    )
    job: JobId | None = None
    try:
        run_dir = f"{server.workdir}/bench"
        job = executor.spawn(JobCommand(dir=run_dir, script="sleep 600"))
        transport = executor.transport
        assert isinstance(transport, SshTransport)
        cipher = transport.connection.open().local_cipher
        print(f"sshd {server.destination}; cipher {cipher}")
        print(
            f"repeats: warm {args.repeat}, fresh channel {args.fresh_repeat}, "
            f"full connect {args.connect_repeat}"
        )
        verdicts = measure(executor, operations(executor, job, run_dir), args)
        print()
        print("\n".join(verdicts))
    finally:
        if job is not None:
            executor.cancel(job)
        executor.close()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
