"""`workers.executors.scripts.files`: the target's manifest of big files (hashed with
OpenSSL above a size, with sha256sum alone when OpenSSL answers garbage), under dash
and `busybox sh`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from workers.executors import LocalTransport, ScriptExecutor, local_manifest
from workers.executors.scripts import MANIFEST_OPENSSL_ABOVE


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
