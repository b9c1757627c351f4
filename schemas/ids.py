"""Run ids and process ids: the identifiers that end up in paths and in `kill`.

A run id names the run directory `<workdir>/<run_id>` on its target, a key in
Redis and a folder of the artifact store, so it must be one safe path component.
"""

from __future__ import annotations

import re
import secrets as _secrets
import string
from datetime import UTC, datetime
from typing import Annotated, Final

from pydantic import AfterValidator, Field

from .errors import InvalidRunId

__all__ = [
    "MAX_PID",
    "RUN_ID_MAX_LEN",
    "RUN_ID_NONCE_LEN",
    "Pid",
    "RunId",
    "check_pid",
    "new_run_id",
    "next_run_id",
    "slugify",
    "validate_run_id",
]

RUN_ID_MAX_LEN: Final = 64
RUN_ID_NONCE_LEN: Final = 5
"""Random letters in a fresh run id ([`new_run_id`])."""
_RUN_ID = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_SUFFIX = re.compile(r"^(?P<base>.*?)-(?P<n>[0-9]{1,6})$")
MAX_PID: Final = 2**31 - 1
"""Largest pid accepted: `kill` takes `-pid` as a signed int."""


def validate_run_id(text: str) -> str:
    """Returns `text` when it is a valid run id, else raises.

    A run id is 1 to 64 characters of lowercase ASCII letters, digits, `_`, `.`
    and `-`, starting with a letter or a digit. So it is always exactly one path
    component: never empty, `.`, `..`, absolute, or holding `/`, NUL, a newline
    or a shell metacharacter, and it never starts with `-` (an option to a tool).

    Raises:
        InvalidRunId: naming the offending text (repr, cut to 80 characters).
    """
    if not isinstance(text, str):
        raise InvalidRunId(f"a run id is a string, not {type(text).__name__}")
    if len(text) > RUN_ID_MAX_LEN or _RUN_ID.fullmatch(text) is None:
        shown = repr(text[:80])
        raise InvalidRunId(
            f"invalid run id {shown}: use 1-{RUN_ID_MAX_LEN} lowercase letters, digits, "
            "'_', '.' or '-', starting with a letter or digit"
        )
    return text


RunId = Annotated[str, AfterValidator(validate_run_id)]
"""A string validated by [`validate_run_id`] wherever a model holds a run id."""


def slugify(name: str, max_len: int = 40) -> str:
    """A run-id-safe slug of the free text `name`: lowercased, every run of other
    characters turned into one `-`, trimmed to `max_len`. Empty when nothing of
    `name` is usable."""
    slug = re.sub(r"[^a-z0-9_.]+", "-", name.lower()).strip("-._")
    return slug[:max_len].rstrip("-._")


def new_run_id(name: str = "", now: datetime | None = None) -> str:
    """A fresh run id: `YYYYMMDD-HHMMSS` in UTC, `-` and [`RUN_ID_NONCE_LEN`] random
    lowercase letters, then `-<slug of name>` when the slug is not empty
    (`20261201-163000-kqzmx-gpt`). The letters keep the ids of two services apart
    even when both start a run of the same name in the same second (a run's id is
    also its processes' mark, which a cancel sweeps by), about one chance in 12
    million a pair; [`next_run_id`] gives the one to try when a claim still finds it
    taken."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%d-%H%M%S")
    nonce = "".join(_secrets.choice(string.ascii_lowercase) for _ in range(RUN_ID_NONCE_LEN))
    head = f"{stamp}-{nonce}"
    slug = slugify(name, RUN_ID_MAX_LEN - len(head) - 8)
    return validate_run_id(f"{head}-{slug}" if slug else head)


def next_run_id(run_id: str) -> str:
    """The id to try after `run_id` was found taken: `<id>-2`, then `-3`, and so on.

    The numeric suffix counts only when `run_id` already ends in `-<n>` with n >= 2,
    so a time stamp such as `20261130-022518` gets `-2` appended, never incremented.

    Raises:
        InvalidRunId: when `run_id` is not valid, or no longer id fits.
    """
    validate_run_id(run_id)
    match = _SUFFIX.match(run_id)
    if match and int(match["n"]) >= 2 and len(match["n"]) < 6 and "-" in match["base"]:
        base, n = match["base"], int(match["n"]) + 1
    else:
        base, n = run_id, 2
    suffix = f"-{n}"
    candidate = validate_run_id(base[: RUN_ID_MAX_LEN - len(suffix)].rstrip("-._") + suffix)
    if candidate == run_id:
        # Only when cutting `base` to fit dropped the very suffix that was counted:
        # count on from the id itself.
        return next_run_id(run_id[: RUN_ID_MAX_LEN - 4].rstrip("-._") + "-2")
    return candidate


def check_pid(pid: int) -> int:
    """Returns `pid` when it can name one job's process group, else raises.

    Pid 0 is a wildcard for `kill` (the caller's own group) and 1 is `init` (or a
    container's own pid 1): signalling either would never target a single job.

    Raises:
        ValueError: for 0, 1, negative pids, and pids above [`MAX_PID`].
    """
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise ValueError(f"a process id is an integer, not {type(pid).__name__}")
    if pid <= 1 or pid > MAX_PID:
        raise ValueError(f"invalid process id {pid}")
    return pid


Pid = Annotated[int, Field(strict=True), AfterValidator(check_pid)]
"""A process id that is neither 0 nor 1 (also when deserialised)."""
