"""The error tree of `schemas`: every refusal of input that does not fit a shape.

Pydantic's own `ValidationError` is raised by model validation, as pydantic
documents; the functions of this package that validate plain strings raise
[`SchemaError`] subclasses instead, so a caller catches one root.
"""

from __future__ import annotations

__all__ = ["InvalidPath", "InvalidRunId", "SchemaError"]


class SchemaError(ValueError):
    """Root of every error raised by `schemas` functions (not pydantic models)."""


class InvalidRunId(SchemaError):
    """A run id breaks the run-id rules of [`schemas.ids.validate_run_id`]."""


class InvalidPath(SchemaError):
    """A path is not acceptable where it is used: not absolute, not relative, holds a NUL
    byte, or would leave the directory it is relative to."""
