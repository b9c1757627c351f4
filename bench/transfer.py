"""Throughput of `SshExecutor.download` / `upload` of a 1 GiB tree (one 768 MiB
file + 2,000 files of 128 KiB, random content), beside OpenSSH's
`ssh HOST tar -cf - ... | tar -xf -` against the same sshd on loopback, in the
same run (rounds interleaved, medians).

    .venv/bin/python -m workers.reaper -- .venv/bin/python bench/transfer.py \
        [--scale 1.0] [--rounds 3] [--dir DIR] [--cipher-ref CIPHER]

MB/s = tree bytes (10^6) / wall-clock seconds of one transfer. Destinations are
removed between transfers (outside the timing, then `sync`); the page cache stays
warm for every contender alike. Before the timed rounds, one transfer each way is
checked (same files and sizes, sha256 of the big file and a few small ones).

`openssh` uses OpenSSH's default cipher (chacha20-poly1305 here); `openssh -c` is
an extra reference forced to paramiko's cipher (`--cipher-ref ''` skips it).

Target (issue 3): paramiko >= 0.8x `openssh` both ways.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.sshd import SshServer, start_sshd
from workers.executors.ssh import SshExecutor, SshTransport
from workers.reaper import become_subreaper

TARGET_RATIO = 0.8
BIG_BYTES = 768 * 1024 * 1024
SMALL_COUNT = 2000
SMALL_BYTES = 128 * 1024
TREE = "tree"


def build_tree(root: Path, scale: float) -> tuple[int, int]:
    """Writes the tree under `root` (random content); returns (files, bytes)."""
    root.mkdir(parents=True)
    chunk = 8 * 1024 * 1024
    big = int(BIG_BYTES * scale)
    with open(root / "big.bin", "wb") as out:
        left = big
        while left:
            n = min(chunk, left)
            out.write(os.urandom(n))
            left -= n
    count = max(1, int(SMALL_COUNT * scale))
    for i in range(count):
        sub = root / "small" / f"d{i // 100:02d}"
        if i % 100 == 0:
            sub.mkdir(parents=True)
        (sub / f"f{i:04d}.bin").write_bytes(os.urandom(SMALL_BYTES))
    return count + 1, big + count * SMALL_BYTES


def tree_listing(root: Path) -> dict[str, int]:
    """Relative path -> size of every regular file under `root`."""
    found = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            found[str(path.relative_to(root))] = path.stat().st_size
    return found


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(4 * 1024 * 1024):
            digest.update(block)
    return digest.hexdigest()


def verify(source: Path, copy: Path, what: str) -> None:
    """Same files, same sizes, same sha256 for the big file and a few small ones."""
    want, got = tree_listing(source), tree_listing(copy)
    if want != got:
        missing = sorted(set(want) - set(got))[:3]
        extra = sorted(set(got) - set(want))[:3]
        raise SystemExit(f"{what}: tree differs (missing {missing}, extra {extra})")
    names = sorted(want)
    sample = ["big.bin", *names[:: max(1, len(names) // 5)][:5]]
    for name in sample:
        if sha256(source / name) != sha256(copy / name):
            raise SystemExit(f"{what}: {name} differs")
    total = sum(want.values())
    print(f"{what}: verified {len(want)} files, {total} bytes, {len(sample)} sha256")


def shell(command: str) -> None:
    done = subprocess.run(["sh", "-c", "set -e; " + command], capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"`{command}` failed: {done.stderr.decode(errors='replace')}")


class Bench:
    """The contenders of one run: paramiko (the executor) and OpenSSH, both ways."""

    def __init__(self, tmp: Path, server: SshServer, executor: SshExecutor) -> None:
        self.server = server
        self.executor = executor
        self.src_root = tmp / "src"  # the "remote" root of downloads
        self.tree = self.src_root / TREE  # the local tree of uploads
        self.down = tmp / "down"
        self.up = tmp / "up"

    def reset(self) -> None:
        shutil.rmtree(self.down, ignore_errors=True)
        shutil.rmtree(self.up, ignore_errors=True)
        self.down.mkdir()
        os.sync()  # the previous transfer's writeback is not charged to the next

    def _ssh(self, options: tuple[str, ...]) -> str:
        return " ".join(shlex.quote(w) for w in self.server.ssh_argv(options=options))

    def download(self) -> None:
        self.executor.download(str(self.src_root), self.down, [TREE])

    def upload(self) -> None:
        self.executor.upload(self.tree, str(self.up))

    def openssh_download(self, *options: str) -> Callable[[], None]:
        remote = f"tar -cf - -C {shlex.quote(str(self.src_root))} {TREE}"
        local = f"tar -xf - -C {shlex.quote(str(self.down))}"
        return lambda: shell(f"{self._ssh(options)} {shlex.quote(remote)} | {local}")

    def openssh_upload(self, *options: str) -> Callable[[], None]:
        dest = shlex.quote(str(self.up))
        remote = f"mkdir -p {dest} && tar -xf - -o -C {dest}"
        local = f"tar -cf - -C {shlex.quote(str(self.tree))} ."
        return lambda: shell(f"{local} | {self._ssh(options)} {shlex.quote(remote)}")

    def openssh_ciphers(self) -> str:
        done = subprocess.run(
            self.server.ssh_argv("true", options=("-v",)),
            capture_output=True,
            text=True,
            check=False,
        )
        return ", ".join(sorted(set(re.findall(r"kex: \S+ cipher: (\S+)", done.stderr)))) or "?"


def run_rounds(
    bench: Bench, contenders: dict[str, Callable[[], None]], size: int, rounds: int
) -> dict[str, list[float]]:
    """MB/s of every contender, `rounds` times, the order alternating each round."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(rounds):
        order = list(contenders) if round_ % 2 == 0 else list(reversed(contenders))
        for name in order:
            bench.reset()
            started = time.perf_counter()
            contenders[name]()
            samples[name].append(size / 1e6 / (time.perf_counter() - started))
    bench.reset()
    return samples


def report(samples: dict[str, list[float]], rounds: int, cipher_ref: str) -> None:
    print(f"rounds: {rounds}; MB/s (10^6 bytes/s), median [each round]")
    for name, values in samples.items():
        shown = " ".join(f"{v:.0f}" for v in values)
        print(f"{name:22} {statistics.median(values):8.1f}   [{shown}]")
    print()
    for way in ("download", "upload"):
        ours = statistics.median(samples[f"{way} paramiko"])
        theirs = statistics.median(samples[f"{way} openssh"])
        ratio = ours / theirs
        verdict = "OK" if ratio >= TARGET_RATIO else "MISSED"
        print(f"{way}: paramiko/openssh = {ratio:.2f} (target >= {TARGET_RATIO}) {verdict}")
        if cipher_ref:
            same = statistics.median(samples[f"{way} openssh -c"])
            print(f"{way}: paramiko/openssh -c {cipher_ref} = {ours / same:.2f} (reference)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="tree size factor")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where the temp dir goes")
    parser.add_argument(
        "--cipher-ref",
        default="aes128-gcm@openssh.com",
        help="also time OpenSSH forced to this cipher (paramiko's); '' skips it",
    )
    parser.add_argument("--tiny", action="store_true", help="the smoke test's run: least of all")
    args = parser.parse_args()
    if args.tiny:
        args.scale, args.rounds = 0.002, 1
    become_subreaper()
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-xfer-", dir=args.dir))
    server: SshServer | None = None
    executor: SshExecutor | None = None
    try:
        files, size = build_tree(tmp / "src" / TREE, args.scale)
        took = time.perf_counter() - started
        print(f"tree: {files} files, {size / 1e6:.1f} MB, built in {took:.1f} s in {tmp}")
        server = start_sshd(tmp)
        executor = SshExecutor.connect(
            server.destination,
            str(server.workdir),
            identity=server.client_key,
            known_hosts=server.known_hosts,
        )
        bench = Bench(tmp, server, executor)
        transport = executor.transport
        assert isinstance(transport, SshTransport)
        paramiko_cipher = transport.connection.open().local_cipher
        print(f"cipher: paramiko {paramiko_cipher}, openssh {bench.openssh_ciphers()}")

        bench.reset()  # one transfer each way, checked; also warms everything up
        bench.download()
        verify(bench.tree, bench.down / TREE, "download")
        bench.upload()
        verify(bench.tree, bench.up, "upload")

        contenders = {
            "download paramiko": bench.download,
            "download openssh": bench.openssh_download(),
            "upload paramiko": bench.upload,
            "upload openssh": bench.openssh_upload(),
        }
        if args.cipher_ref:
            contenders["download openssh -c"] = bench.openssh_download("-c", args.cipher_ref)
            contenders["upload openssh -c"] = bench.openssh_upload("-c", args.cipher_ref)
        samples = run_rounds(bench, contenders, size, args.rounds)
        report(samples, args.rounds, args.cipher_ref)
        print(f"total {time.perf_counter() - started:.0f} s")
    finally:
        if executor is not None:
            executor.close()
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
