"""The benches over a real sshd on loopback: bench/ssh_ops.py, bench/retrieve.py,
bench/transfer.py, each once in its tiny form (smoke.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .smoke import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]


def test_ssh_ops_prints_fresh_channels_against_the_warm_shell(tmp_path: Path) -> None:
    run_bench("ssh_ops", tmp_path, r"^status: warm [\d.]+ ms .*fresh/warm [\d.]+")


def test_retrieve_prints_the_download_against_the_retrieval(tmp_path: Path) -> None:
    run_bench("retrieve", tmp_path, r"^ssh: download / retrieve = [\d.]+")


def test_transfer_prints_paramiko_against_openssh(tmp_path: Path) -> None:
    run_bench("transfer", tmp_path, r"^download: paramiko/openssh = [\d.]+")
