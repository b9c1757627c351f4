"""Targets: where runs go. A target is this machine (`local`) or an SSH destination,
with the directory holding its run directories. Never holds a secret: SSH keys are
referenced by path, and the agent is used when it holds them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .job import check_absolute_path

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
    """A target as stored and shown."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: TargetName
    kind: Literal["local", "ssh"]
    workdir: str
    ssh: SshOptions | None = None

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        return check_absolute_path(value).rstrip("/") or "/"

    @model_validator(mode="after")
    def _ssh(self) -> TargetConfig:
        if (self.kind == "ssh") != (self.ssh is not None):
            raise ValueError("an ssh target needs its ssh options, and only it")
        return self
