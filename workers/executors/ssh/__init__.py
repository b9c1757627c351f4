"""`SshExecutor`: the executor contract over SSH (paramiko), with the same shared
scripts as the local executor.

- One connection per destination and process, from a pool that a forked child
  never inherits (a Celery prefork child opens its own), with keepalives; a dead
  connection is detected and re-opened, and idempotent operations are retried once.
- Small operations run on persistent remote `sh` processes (one round trip, no
  session setup); `spawn` and transfers use their own exec channels.
- Host keys are checked strictly against known_hosts (hashed entries and the
  `[host]:port` form too); an unknown and a changed key are distinct errors; a key
  is never added. Keys come from files and the agent; nothing ever prompts.
- Every failure is an `ExecError`; paramiko and socket errors are translated.
"""


from __future__ import annotations

from pathlib import Path

from ..shell import ScriptExecutor
from .config import SshDestination, resolve_destination
from .connection import CLIENT_REKEY_BYTES, MAX_SHELLS, WINDOW_SIZE, SshConnection, connection_pool
from .transport import SshTransport

__all__ = [
    "CLIENT_REKEY_BYTES",
    "MAX_SHELLS",
    "WINDOW_SIZE",
    "SshConnection",
    "SshDestination",
    "SshExecutor",
    "SshTransport",
    "connection_pool",
    "resolve_destination",
]


class SshExecutor(ScriptExecutor):
    """Runs jobs in run directories under `workdir` on the SSH target `destination`.

    A remote job gets the SSH server's non-interactive environment (no login shell,
    no startup file), then its `env`, then its secrets, which travel on the
    launcher's standard input only."""

    def __init__(self, destination: SshDestination, workdir: str) -> None:
        self.destination = destination
        super().__init__(SshTransport(destination), workdir)

    @classmethod
    def connect(
        cls,
        text: str,
        workdir: str,
        *,
        port: int | None = None,
        identity: Path | None = None,
        known_hosts: Path | None = None,
        ssh_config: Path | None = None,
    ) -> SshExecutor:
        """An executor for the destination `text` (see `resolve_destination`); opens
        nothing yet.

        Raises:
            InvalidArgument: for a malformed destination or config.
        """
        destination = resolve_destination(
            text, port=port, identity=identity, known_hosts=known_hosts, ssh_config=ssh_config
        )
        return cls(destination, workdir)
