"""What a launch may ask of its target: the secrets the target allows its runs, read
from the secrets directory, and uploads only from the target's upload roots. Checked
before anything is claimed or started: a refused launch leaves no trace on the
target."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import SecretStr

from schemas import TargetConfig
from schemas.events import LaunchSpec
from schemas.protocol import SECRET_ENV_PREFIX

from .context import Context
from .errors import NotAllowed, SecretMissing

__all__ = ["check_launch", "check_upload"]


def check_upload(target: TargetConfig, upload: Path) -> Path:
    """`upload` resolved (every link followed), when it is one of the target's upload
    roots (resolved too) or below one.

    Raises:
        NotAllowed: the target allows no upload, or the resolved path leaves every
            root (a link inside a root that points outside it included).
    """
    if not target.upload_roots:
        raise NotAllowed(
            f"target {target.name!r} allows no upload: add a root with "
            "`runwarden targets add ... --upload-root DIR`"
        )
    resolved = Path(os.path.realpath(upload))
    for root in target.upload_roots:
        base = Path(os.path.realpath(root))
        if resolved == base or base in resolved.parents:
            return resolved
    roots = ", ".join(target.upload_roots)
    raise NotAllowed(f"{upload} is outside the upload roots of target {target.name!r} ({roots})")


def check_launch(ctx: Context, spec: LaunchSpec) -> dict[str, SecretStr]:
    """The values of the secrets `spec` names, after checking that its target allows
    each of them and its upload (`check_upload`). A secret `NAME` is the file `NAME`
    of the secrets directory; with `secrets_from_env`, else the worker's environment
    variable `RUNWARDEN_SECRET_<NAME>`.

    Raises:
        UnknownTarget, Unauthenticated: no usable target.
        NotAllowed: a secret or the upload is not allowed on the target.
        SecretMissing: an allowed secret has no value here.
    """
    target = ctx.target(spec.target)
    refused = target.refused_secrets(spec.secrets)
    if refused:
        raise NotAllowed(
            f"target {target.name!r} does not allow the secret(s) {', '.join(refused)}: "
            "allow them with `runwarden targets add ... --allow-secret NAME`"
        )
    if spec.upload is not None:
        check_upload(target, spec.upload)
    found: dict[str, SecretStr] = {}
    for name in spec.secrets:
        value = ctx.settings.secrets.read(name)
        if value is None and ctx.settings.secrets_from_env:
            text = os.environ.get(SECRET_ENV_PREFIX + name)
            value = None if text is None else SecretStr(text)
        if value is None:
            raise SecretMissing(name, ctx.settings.secrets.path)
        found[name] = value
    return found
