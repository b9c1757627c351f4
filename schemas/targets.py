"""Targets: where runs go. A target is this machine (`local`) or an SSH destination,
with the directory holding its run directories. Never holds a secret: SSH keys are
referenced by path, and the agent is used when it holds them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .job import check_absolute_path, check_env_name

__all__ = ["SshOptions", "TargetConfig", "TargetName"]

TargetName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class SshOptions(BaseModel):
    """How to reach an SSH target: `user@host[:port]` or an ssh config alias, and
    optional paths (on the worker) of the identity, known_hosts and ssh config."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    destination: str = Field(min_length=1, max_length=300)
    port: Annotated[int, Field(gt=0, lt=65536)] | None = None
    identity: str | None = None
    known_hosts: str | None = None
    ssh_config: str | None = None


class TargetConfig(BaseModel):
    """A target as stored and shown: configuration the operator writes (signed, see
    `schemas.auth`), never something a message can create or change."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: TargetName
    kind: Literal["local", "ssh"]
    workdir: str
    ssh: SshOptions | None = None
    allow_secrets: tuple[str, ...] = ()
    """The names of the secrets a run on this target may receive; a launch naming any
    other is refused, and nothing is started."""
    upload_roots: tuple[str, ...] = ()
    """Directories of the worker a launch may upload from (the upload path, resolved,
    must be one of them or below one); none: no upload is allowed."""

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        return check_absolute_path(value).rstrip("/") or "/"

    @field_validator("allow_secrets")
    @classmethod
    def _secret_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            check_env_name(name)
        return tuple(sorted(set(names)))

    @field_validator("upload_roots")
    @classmethod
    def _roots(cls, roots: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted({check_absolute_path(root).rstrip("/") or "/" for root in roots}))

    def refused_secrets(self, names: tuple[str, ...]) -> list[str]:
        """The names of `names` this target does not allow, sorted."""
        return sorted(set(names) - set(self.allow_secrets))

    @model_validator(mode="after")
    def _ssh(self) -> TargetConfig:
        if (self.kind == "ssh") != (self.ssh is not None):
            raise ValueError("an ssh target needs its ssh options, and only it")
        return self
