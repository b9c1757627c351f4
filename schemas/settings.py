"""The one settings object: every knob of the service, read from `RUNWARDEN_*`
environment variables (pydantic-settings), shared by producers and workers.

Times are in seconds. Shortening the stop clocks (`RUNWARDEN_PROOF_TIMEOUT_S`,
`RUNWARDEN_END_TIMEOUT_S`, `RUNWARDEN_REQUEST_POLL_S`, `RUNWARDEN_FOLLOW_POLL_S`,
`RUNWARDEN_RECONCILE_S`) is how the tests run a whole stop in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from .snapshot import END_TIMEOUT_S, PROOF_TIMEOUT_S, REQUEST_POLL_S, StopLimits

__all__ = ["Settings"]

_Positive = Annotated[float, Field(gt=0)]


class Settings(BaseSettings):
    """Configuration of a runwarden process. Never holds a secret of a job: those are
    resolved on the worker from `RUNWARDEN_SECRET_<NAME>` at spawn time."""

    model_config = SettingsConfigDict(env_prefix="RUNWARDEN_", extra="ignore", frozen=True)

    redis_url: SecretStr | None = None
    """Broker, result backend and run store. None: the embedded server under
    `state_dir` (unix socket `redis.sock`). A secret: it may hold a password."""
    state_dir: Path = Path("~/.local/state/runwarden").expanduser()
    proof_timeout_s: _Positive = PROOF_TIMEOUT_S
    end_timeout_s: _Positive = END_TIMEOUT_S
    request_poll_s: _Positive = REQUEST_POLL_S
    follow_poll_s: _Positive = 5.0
    reconcile_s: _Positive = 10.0
    """How often beat fires overdue deadlines whose countdown did not run."""
    deadline_lease_s: _Positive = 60.0
    """How long a worker holds a deadline it is acting on before another may."""
    task_max_runtime_s: _Positive = 300.0
    """Longest run of one task (a cancel takes at most ~20 s; a launch uploads)."""

    @property
    def stop_limits(self) -> StopLimits:
        return StopLimits(proof_timeout_s=self.proof_timeout_s, end_timeout_s=self.end_timeout_s)

    @property
    def embedded_socket(self) -> Path:
        """The unix socket of the embedded Redis server."""
        return self.state_dir / "redis.sock"

    def broker_url(self) -> str:
        """The Redis URL for Celery (kombu): the embedded server's socket when none is
        configured; a `unix://` URL becomes `redis+socket://`. Contains the password
        when there is one: never log it."""
        url = self.store_url()
        if url.startswith("unix://"):
            return "redis+socket://" + url.removeprefix("unix://")
        return url

    def store_url(self) -> str:
        """The Redis URL for redis-py (the run store): the embedded server's socket as
        `unix://`. Contains the password when there is one: never log it."""
        if self.redis_url is not None:
            url = self.redis_url.get_secret_value()
            if url.startswith("redis+socket://"):
                return "unix://" + url.removeprefix("redis+socket://")
            return url
        return f"unix://{self.embedded_socket}"

    @property
    def visibility_timeout_s(self) -> float:
        """The broker's redelivery delay for unacknowledged messages, in seconds: longer
        than the longest countdown plus a task's run time, so a countdown task that is
        waiting for its ETA is never delivered twice (DESIGN.md §4)."""
        return max(self.proof_timeout_s, self.end_timeout_s) + self.task_max_runtime_s + 60.0
