"""What a launch may ask of its target: the secrets the target allows its runs, read
from the secrets directory, and uploads only from the target's upload roots. Checked
before anything is claimed or started: a refused launch leaves no trace on the
target."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from schemas import Settings, TargetConfig
from schemas.events import LaunchSpec
from schemas.job import check_secret_value
from schemas.protocol import SECRET_ENV_PREFIX

from .context import Context
from .errors import NotAllowed, SecretMissing, SecretUnusable

__all__ = ["Permit", "check_launch", "check_upload", "root_unsaid"]


@dataclass(frozen=True)
class Permit:
    """What a launch was allowed."""

    secrets: dict[str, SecretStr]
    """The values of the secrets it names."""
    upload: Path | None
    """Its upload as checked (absolute, every link resolved): the upload opens
    exactly this path without following a link, so what is copied is what was
    checked (`executors.uploadtree`)."""
    target: TargetConfig
    """Its target's configuration as checked (signed by the operator)."""


def check_upload(target: TargetConfig, upload: Path, settings: Settings) -> Path:
    """`upload` resolved (every link followed), when it is one of the target's upload
    roots (resolved too) or below one, and neither holds nor is inside the state or
    secrets directory (`Settings.guarded_by`).

    Raises:
        NotAllowed: the target allows no upload, the resolved path leaves every
            root (a link inside a root that points outside it included), it holds
            or is inside a guarded directory, or it cannot be resolved.
    """
    if not target.upload_roots:
        raise NotAllowed(
            f"target {target.name!r} allows no upload: add a root with "
            "`runwarden targets add ... --upload-root DIR`"
        )
    try:
        resolved = Path(os.path.realpath(upload))
        kept = settings.guarded_by(resolved)
    except OSError as error:  # a link on its way changing while it is resolved
        raise NotAllowed(f"{upload} cannot be checked: {error.strerror}") from error
    if kept is not None:
        raise NotAllowed(f"{upload} holds or is inside {kept}, which is never uploaded")
    for root in target.upload_roots:
        base = Path(os.path.realpath(root))
        if resolved == base or base in resolved.parents:
            return resolved
    roots = ", ".join(target.upload_roots)
    raise NotAllowed(f"{upload} is outside the upload roots of target {target.name!r} ({roots})")


def root_unsaid(target: TargetConfig) -> bool:
    """Whether this worker, being root, would run the local `target`'s jobs as root
    without the target saying so (`run_as: root`): refused at launch, `missing` in
    `doctor`."""
    return target.kind == "local" and target.run_as is None and os.geteuid() == 0


def check_launch(ctx: Context, spec: LaunchSpec) -> Permit:
    """The values of the secrets `spec` names and its upload as checked, after
    checking that its target allows each of them and its upload (`check_upload`, the
    state and secrets directories guarded). A secret `NAME` is the file `NAME`
    of the secrets directory; with `secrets_from_env`, else the worker's environment
    variable `RUNWARDEN_SECRET_<NAME>`.

    Raises:
        UnknownTarget, Unauthenticated: no usable target.
        NotAllowed: a secret or the upload is not allowed on the target; a cloud's
            preemption notices asked on a Slurm target; a local
            target without `run_as` on a worker that is root (its jobs would run as
            root without the operator having said so: `run_as: root` says it).
        SecretMissing: an allowed secret has no value here.
        SecretUnusable: a secret's value holds a line break or a NUL byte.
    """
    target = ctx.target(spec.target)
    if root_unsaid(target):
        raise NotAllowed(
            f"target {target.name!r} would run its jobs as root (this worker is root, and "
            "the target names no other user): give it `--run-as USER`, a user of their "
            "own, or `--run-as root` to accept that (docs/security.md)"
        )
    if target.slurm is not None and spec.preemption not in (None, "off"):
        raise NotAllowed(
            f"target {target.name!r} is a Slurm cluster: Slurm's own notices (its time limit,"
            " its preemptions) reach the job there, not a cloud's; launch without --preemption"
        )
    refused = target.refused_secrets(spec.secrets)
    if refused:
        raise NotAllowed(
            f"target {target.name!r} does not allow the secret(s) {', '.join(refused)}: "
            "allow them with `runwarden targets add ... --allow-secret NAME`"
        )
    upload = None
    if spec.upload is not None:
        upload = check_upload(target, spec.upload, ctx.settings)
    found: dict[str, SecretStr] = {}
    for name in spec.secrets:
        value = ctx.settings.secrets.read(name)
        if value is None and ctx.settings.secrets_from_env:
            text = os.environ.get(SECRET_ENV_PREFIX + name)
            value = None if text is None else SecretStr(text)
        if value is None:
            raise SecretMissing(name, ctx.settings.secrets.path)
        try:
            check_secret_value(name, value.get_secret_value())
        except ValueError:
            raise SecretUnusable(name) from None
        found[name] = value
    return Permit(found, upload, target)
