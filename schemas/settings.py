"""The one settings object: every knob of the service, read from `RUNWARDEN_*`
environment variables (pydantic-settings), shared by producers and workers.

Times are in seconds. Shortening the stop clocks (`RUNWARDEN_PROOF_TIMEOUT_S`,
`RUNWARDEN_END_TIMEOUT_S`, `RUNWARDEN_FOLLOW_POLL_S`,
`RUNWARDEN_RECONCILE_S`) is how the tests run a whole stop in seconds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .bounds import (
    ARTIFACT_QUOTA_RUN_BYTES,
    ARTIFACT_QUOTA_TOTAL_BYTES,
    ARTIFACT_RESERVE_BYTES,
    LOG_BYTES_PER_RUN,
    LOG_LINE_BYTES,
    METRICS_BYTES_PER_RUN,
    MIN_STREAM_BYTES,
    REDIS_MAXMEMORY,
    RETENTION_DAYS,
    ByteSize,
)
from .budget import (
    PROOF_TIMEOUT_CEILING_S,
    PROOF_TIMEOUT_FACTOR,
    PROOF_TIMEOUT_FLOOR_S,
    PROOF_TIMEOUT_MARGIN_S,
    BudgetRule,
)
from .policy import COST_FRACTION, DEADLINE_LEAD_S, DISK_CHECKPOINT_FACTOR, DISK_USED_LIMIT
from .preemption import DEFAULT_METADATA_URLS, check_metadata_url
from .secrets import (
    PRODUCER_NAME,
    REDIS_PASSWORD,
    SecretsDir,
    SecretsError,
    service_redis_password_file,
)
from .sentinel import (
    SENTINEL_PASSWORD,
    SentinelAddress,
    is_sentinel,
    parse_sentinel,
    with_sentinel_password,
)
from .snapshot import END_TIMEOUT_S, PROOF_TIMEOUT_S

__all__ = ["Settings"]

_Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class Settings(BaseSettings):
    """Configuration of a runwarden process. Holds no secret: every credential (a job's
    secrets, producers' keys, the Redis password) is read from the secrets directory
    (`schemas.secrets`) when it is needed."""

    model_config = SettingsConfigDict(env_prefix="RUNWARDEN_", extra="ignore", frozen=True)

    redis_url: SecretStr | None = None
    """Broker, result backend and run store. None: the embedded server under
    `state_dir` (unix socket `redis.sock`). Give it without a password: the password
    comes from the secrets directory (`redis-password`) and is added when connecting,
    so it is in no environment. (A password in the URL still works, but then it is in
    the environment of every process that has the URL.)"""
    redis_user: str | None = None
    """The Redis user this process connects as, when the URL names none: `worker` (the
    workers and beat, as `runwarden serve` starts them: no ACL, CONFIG, SHUTDOWN,
    FLUSHALL or other dangerous command) or `web` (the web view: reads the store, sends
    stops and cancels; store/acl.py), its password the secrets directory's
    `redis-password.<user>`. None: the default user, with `redis-password`."""
    redis_min_replicas: Annotated[int, Field(ge=0, le=16)] | None = None
    """How many replicas must have acknowledged a write a deadline depends on (a stop
    opened with its proof deadline, a stop's move with its deadlines, its close, a
    deadline's claim or removal, a run's end) before it counts as done: Redis's
    `WAIT`, after the write. A write no replica acknowledged within
    `redis_wait_s` fails (`NotReplicated`), and is retried by its caller. None: 1
    with a `sentinel://` URL, else 0 (no `WAIT`). docs/architecture.md, "Durability"."""
    redis_wait_s: Annotated[float, Field(gt=0, le=60, allow_inf_nan=False)] = 1.0
    """How long such a write waits for its replicas (`WAIT`'s timeout)."""
    state_dir: Path = Path("~/.local/state/runwarden").expanduser()
    secrets_dir: Path | None = None
    """The secrets directory (`schemas.secrets`). None: `$CREDENTIALS_DIRECTORY` when
    set (systemd), else `<state_dir>/secrets`."""
    producer: str = "operator"
    """The producer this process signs its messages as (`schemas.auth`); its key is
    `producer.<name>.key` in the secrets directory."""
    cgroups: bool = True
    """Contain each run in a cgroup v2 directory of its own wherever the worker can make
    one (`workers.cgroups`); 0: never (a run is then tracked by its process group and
    its mark alone)."""
    secrets_from_env: bool = False
    """Also take a job's secret `NAME` from the worker's environment variable
    `RUNWARDEN_SECRET_<NAME>` when the secrets directory has none: compatibility only,
    since a job running as the worker's user can read the worker's environment."""
    proof_timeout_s: _Positive = PROOF_TIMEOUT_S
    end_timeout_s: _Positive = END_TIMEOUT_S
    follow_poll_s: _Positive = 5.0
    """How often beat fans out the follow tick, in seconds: each target's tick reads
    its runs' statuses, output, requests someone else wrote (a person, a watchdog,
    another tool), notices and proofs."""
    reconcile_s: _Positive = 10.0
    """How often beat fires overdue deadlines whose countdown did not run."""
    deadline_lease_s: _Positive = 60.0
    """How long a worker holds a deadline it is acting on before another may."""
    countdown_horizon_s: _Positive = 120.0
    """How far ahead a deadline's countdown task is sent, in seconds: a worker holds
    every countdown it has received in memory until its time (tens of KiB each), so
    a deadline further away waits in the deadline table and `reconcile` sends its
    countdown once it comes this close (`workers.reconcile.arm_deadlines`; never
    less than three reconcile periods ahead)."""
    task_max_runtime_s: _Positive = 300.0
    """Longest run of one task (a cancel takes at most ~20 s; a launch uploads)."""
    launch_max_runtime_s: _Positive = 3600.0
    """Longest run of a launch (it uploads the project, and a resume its checkpoint);
    past it the run is recorded failed."""
    launch_grace_s: _Positive = 300.0
    """How much longer than `launch_max_runtime_s` a run may stay `preparing` before
    `reconcile` settles it (its launch's worker died): it is then followed when its job
    started, else recorded failed. A launch still at work holds its key's lock, which
    `reconcile` respects whatever the run's age; the grace only spares the store and
    the target a look at young runs (the hard time limit of a launch is 30 s past
    `launch_max_runtime_s`)."""
    retrieve_max_runtime_s: _Positive = 6 * 3600.0
    """Longest run of one retrieval task (it downloads a whole checkpoint)."""

    # --- policies (defaults: schemas.policy) ------------------------------------------
    policy_s: _Positive = 30.0
    """How often beat evaluates the policies of running runs."""
    deadline_lead_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = DEADLINE_LEAD_S
    """How long before a run's `max_hours` its `deadline` snapshot is asked."""
    cost_fraction: Annotated[float, Field(gt=0, le=1)] = COST_FRACTION
    """Share of `max_cost_usd` at which the `cost` snapshot is asked."""
    disk_used_fraction: Annotated[float, Field(gt=0, le=1)] = DISK_USED_LIMIT
    """Used share of the run directory's filesystem at which `disk` is asked."""
    disk_checkpoint_factor: Annotated[float, Field(ge=0, allow_inf_nan=False)] = (
        DISK_CHECKPOINT_FACTOR
    )
    """`disk` is asked when free space is below this many times the newest
    checkpoint's size."""
    disk_probe_s: _Positive = 60.0
    """Least time between two disk probes of one target."""
    watchdog_poll_s: _Positive = 5.0
    """How often the on-target watchdog checks whether its job ended."""

    # --- preemption notices (schemas.preemption) --------------------------------------
    metadata_aws_url: str = DEFAULT_METADATA_URLS["aws"]
    """AWS's instance metadata service (IMDSv2), as the notice watcher on a target
    reaches it: `http://host[:port]`."""
    metadata_gcp_url: str = DEFAULT_METADATA_URLS["gcp"]
    """GCP's metadata server, `http://host[:port]`."""
    metadata_azure_url: str = DEFAULT_METADATA_URLS["azure"]
    """Azure's instance metadata service (Scheduled Events), `http://host[:port]`."""
    notice_poll_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] = 1.0
    """How often the notice watcher asks AWS and Azure (GCP answers a long poll as
    soon as its value changes), and checks whether its job ended."""

    # --- artifacts ------------------------------------------------------------------
    artifact_dir: Path | None = None
    """The artifact store; None: `<state_dir>/runs`."""
    retrieve_backoff_s: _Positive = 30.0
    """Wait after a run's first failed retrieval; doubled after each further one."""
    retrieve_backoff_max_s: _Positive = 3600.0
    retrieve_attempts: Annotated[int, Field(ge=1)] = 50
    """Attempts before a retrieval is marked failed (shown; `runwarden retrieve`
    tries again)."""

    webhooks: str | None = None
    """The webhooks told of ledger events: a JSON list, or the path of a JSON or TOML
    file (`schemas.webhooks.load_webhooks`). Never holds a secret: a webhook's secret
    is read from the secrets directory (`webhook.<name>.secret`) when it is sent."""

    # --- bounds: Redis memory and the artifact store's disk (defaults: schemas.bounds)
    log_line_bytes: Annotated[int, Field(ge=256, le=MIN_STREAM_BYTES // 2)] = LOG_LINE_BYTES
    """Longest log line kept in the run store, in UTF-8 bytes; a longer one is cut at
    a character boundary and marked. At most half the smallest stream budget, so a
    budget always holds two longest lines. A metrics record longer than this is left out
    of the metrics stream (its progress still counts)."""
    log_bytes_per_run: Annotated[ByteSize, Field(ge=MIN_STREAM_BYTES)] = LOG_BYTES_PER_RUN
    """Bytes of log lines kept per run in the run store, the oldest dropped first
    (the whole `job.log` comes home with the artifacts)."""
    metrics_bytes_per_run: Annotated[ByteSize, Field(ge=MIN_STREAM_BYTES)] = METRICS_BYTES_PER_RUN
    """Bytes of metrics records kept per run in the run store, the oldest first out."""
    retention_days: _Positive = RETENTION_DAYS
    """How long an ended run's log, metrics, offsets and progress stay in Redis (its
    record, stop history and artifacts stay). A fraction is fine (1e-5 is 0.864 s)."""
    redis_maxmemory: Annotated[ByteSize, Field(ge=1024 * 1024)] = REDIS_MAXMEMORY
    """`maxmemory` of the embedded Redis (compose passes the same variable to its
    Redis), with `noeviction`: at the limit Redis refuses writes rather than lose
    state; the workers warn above 80 %."""
    artifact_quota_run_bytes: Annotated[ByteSize, Field(ge=1)] = ARTIFACT_QUOTA_RUN_BYTES
    """Most bytes one run's retrieval may write into the artifact store."""
    artifact_quota_total_bytes: Annotated[ByteSize, Field(ge=1)] = ARTIFACT_QUOTA_TOTAL_BYTES
    """Most bytes the artifact store may hold, every run together."""
    artifact_reserve_bytes: ByteSize = ARTIFACT_RESERVE_BYTES
    """Free space a retrieval always leaves on the artifact store's filesystem."""

    @property
    def retention_s(self) -> float:
        """[`retention_days`] in seconds."""
        return self.retention_days * 86400.0

    # --- stop budgets (defaults: schemas.budget) ---------------------------------------
    proof_timeout_factor: Annotated[float, Field(ge=1, allow_inf_nan=False)] = PROOF_TIMEOUT_FACTOR
    """A proof timeout learned from a run's saves is this many times the longest one
    (plus the margin); the policies also ask at least this many times the longest
    save before a run's deadline or the end of its cost budget."""
    proof_timeout_margin_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = (
        PROOF_TIMEOUT_MARGIN_S
    )
    """Seconds added to the multiple of the longest save."""
    proof_timeout_floor_s: _Positive = PROOF_TIMEOUT_FLOOR_S
    """A learned proof timeout is never shorter."""
    proof_timeout_ceiling_s: _Positive = PROOF_TIMEOUT_CEILING_S
    """A learned proof timeout is never longer."""

    @model_validator(mode="after")
    def _budget(self) -> Settings:
        if self.proof_timeout_floor_s > self.proof_timeout_ceiling_s:
            raise ValueError(
                f"RUNWARDEN_PROOF_TIMEOUT_FLOOR_S ({self.proof_timeout_floor_s:g}) is above "
                f"RUNWARDEN_PROOF_TIMEOUT_CEILING_S ({self.proof_timeout_ceiling_s:g})"
            )
        return self

    @property
    def budget_rule(self) -> BudgetRule:
        """The knobs of a stop's timeouts (`schemas.budget.stop_budget`)."""
        return BudgetRule(
            default_proof_s=self.proof_timeout_s,
            default_end_s=self.end_timeout_s,
            factor=self.proof_timeout_factor,
            margin_s=self.proof_timeout_margin_s,
            floor_s=self.proof_timeout_floor_s,
            ceiling_s=self.proof_timeout_ceiling_s,
        )

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and is_sentinel(value.get_secret_value()):
            parse_sentinel(value.get_secret_value())  # a bad one is refused at start
        return value

    @property
    def sentinel(self) -> bool:
        """Whether Redis is reached through its sentinels (`schemas.sentinel`)."""
        return self.redis_url is not None and is_sentinel(self.redis_url.get_secret_value())

    @property
    def min_replicas(self) -> int:
        """[`redis_min_replicas`], its default applied."""
        if self.redis_min_replicas is not None:
            return self.redis_min_replicas
        return 1 if self.sentinel else 0

    def sentinel_address(self) -> SentinelAddress | None:
        """The sentinels, master and credentials (from the secrets directory) of a
        `sentinel://` URL; None for any other. Holds passwords: never log it.

        Raises:
            SecretsError: when a password file cannot be read.
        """
        if not self.sentinel:
            return None
        return parse_sentinel(self.store_url())

    @field_validator("metadata_aws_url", "metadata_gcp_url", "metadata_azure_url")
    @classmethod
    def _metadata_url(cls, value: str) -> str:
        return check_metadata_url(value)

    @property
    def metadata_urls(self) -> dict[str, str]:
        """The metadata base URLs by cloud (`aws`, `gcp`, `azure`)."""
        return {
            "aws": self.metadata_aws_url,
            "gcp": self.metadata_gcp_url,
            "azure": self.metadata_azure_url,
        }

    @field_validator("producer")
    @classmethod
    def _producer(cls, value: str) -> str:
        if PRODUCER_NAME.fullmatch(value) is None:
            raise ValueError("a producer's name is 1-32 lowercase letters, digits or '-'")
        return value

    @property
    def secrets(self) -> SecretsDir:
        """The secrets directory (see `secrets_dir`)."""
        if self.secrets_dir is not None:
            return SecretsDir(self.secrets_dir.expanduser().absolute())
        credentials = os.environ.get("CREDENTIALS_DIRECTORY")
        if credentials:
            return SecretsDir(Path(credentials))
        return SecretsDir(self.state_dir.expanduser().absolute() / "secrets")

    def guarded_by(self, path: Path | str) -> Path | None:
        """The state or secrets directory that `path` holds or is inside (both
        with their links resolved), else None: such a path is never an upload nor an
        upload root, for an upload of it would copy the keys of every producer into a
        run directory."""
        resolved = Path(os.path.realpath(path))
        for guard in (self.state_dir, self.secrets.path):
            kept = Path(os.path.realpath(guard.expanduser()))
            if resolved == kept or kept in resolved.parents or resolved in kept.parents:
                return kept
        return None

    @property
    def artifacts_root(self) -> Path:
        """The artifact store's root: each run's artifacts in `<root>/<run_id>/`."""
        if self.artifact_dir is not None:
            return self.artifact_dir.expanduser().absolute()
        return self.state_dir.expanduser().absolute() / "runs"

    @property
    def follow_timeout_s(self) -> float:
        """Longest run of one follow tick's script, in seconds: four follow periods,
        at least 2 s. Every read in it is bounded, so only an unreachable or
        overloaded target takes this long; a tick of a target never overlaps the
        next, so a tick that ends this way delays that target's next one, no other."""
        return max(2.0, 4 * self.follow_poll_s)

    @property
    def embedded_socket(self) -> Path:
        """The unix socket of the embedded Redis server."""
        return self.state_dir / "redis.sock"

    def broker_url(self) -> str:
        """The Redis URL for Celery (kombu): the embedded server's socket when none is
        configured; a `unix://` URL becomes `redis+socket://`; a `sentinel://` one
        becomes one `sentinel://` URL per sentinel, joined with `;` (the master's name
        and the sentinels' password go in the transport options:
        `schemas.events.wire_config`). Holds the password (from the secrets directory)
        when there is one: never log it."""
        url = self.store_url()
        if is_sentinel(url):
            return parse_sentinel(url).kombu_url()
        if url.startswith("unix://"):
            return "redis+socket://" + url.removeprefix("unix://")
        return url

    def store_url(self) -> str:
        """The Redis URL for redis-py (the run store): the embedded server's socket as
        `unix://`. Holds the password (from the secrets directory, when the URL has
        none) when there is one: never log it. A `sentinel://` URL gets the
        sentinels' password too (`redis-sentinel-password`, in its query: see
        `schemas.sentinel`).

        Raises:
            SecretsError: when the password file cannot be read.
        """
        if self.redis_url is not None:
            url = self.redis_url.get_secret_value()
            if url.startswith("redis+socket://"):
                url = "unix://" + url.removeprefix("redis+socket://")
        else:
            url = f"unix://{self.embedded_socket}"
        if is_sentinel(url) and "sentinel_password=" not in url:
            sentinel_secret = self.secrets.read(SENTINEL_PASSWORD)
            if sentinel_secret is not None:
                url = with_sentinel_password(url, sentinel_secret.get_secret_value())
        parts = urlsplit(url)
        if self.redis_user is not None and parts.username is None and parts.password is None:
            name = service_redis_password_file(self.redis_user)
            password = self.secrets.read(name)
            if password is None:
                raise SecretsError(f"no {name} in the secrets directory {self.secrets.path}")
            user = quote(self.redis_user, safe="")
            secret = quote(password.get_secret_value(), safe="")
            host = parts.netloc.rsplit("@", 1)[-1]
            return urlunsplit(parts._replace(netloc=f"{user}:{secret}@{host}"))
        password = self.secrets.read(REDIS_PASSWORD)
        if password is None or parts.password is not None:
            return url
        user = quote(parts.username or "", safe="")
        secret = quote(password.get_secret_value(), safe="")
        host = parts.netloc.rsplit("@", 1)[-1]
        return urlunsplit(parts._replace(netloc=f"{user}:{secret}@{host}"))

    @property
    def visibility_timeout_s(self) -> float:
        """The broker's redelivery delay for unacknowledged messages, in seconds: longer
        than the longest countdown plus a task's run time, so a countdown task that is
        waiting for its ETA is never delivered twice (docs/architecture.md, "Durability")."""
        longest_task_s = max(self.task_max_runtime_s, self.launch_max_runtime_s)
        return max(self.proof_timeout_s, self.end_timeout_s) + longest_task_s + 60.0
