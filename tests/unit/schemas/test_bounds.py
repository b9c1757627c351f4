"""`schemas.bounds` and their settings: sizes read as Redis reads them (so compose can
pass `RUNWARDEN_REDIS_MAXMEMORY` to Redis as is), the defaults, and what is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas import Settings
from schemas.bounds import parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("0", 0),
        ("1000", 1000),
        ("1k", 1000),
        ("1kb", 1024),
        ("1KiB", 1024),
        ("64mb", 64 * 1024**2),
        ("64m", 64 * 1000**2),
        ("2gb", 2 * 1024**3),
        ("2GB", 2 * 1024**3),
        ("2g", 2 * 1000**3),
        (" 3 gib ", 3 * 1024**3),
        ("1tb", 1024**4),
        ("1t", 1000**4),
        (123, 123),
    ],
)
def test_sizes_are_read_as_redis_reads_them(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "-1", "1.5gb", "1 lots", "gb", "1e9", -5, True, 1.5, None])
def test_anything_else_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


def test_the_defaults() -> None:
    settings = Settings()
    assert settings.log_line_bytes == 8000
    assert settings.log_bytes_per_run == 4 * 1024**2
    assert settings.metrics_bytes_per_run == 1024**2
    assert settings.retention_days == 30
    assert settings.retention_s == 30 * 86400
    assert settings.redis_maxmemory == 2 * 1024**3
    assert settings.artifact_quota_run_bytes == 512 * 1024**3
    assert settings.artifact_quota_total_bytes == 4 * 1024**4
    assert settings.artifact_reserve_bytes == 10 * 1024**3


def test_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNWARDEN_REDIS_MAXMEMORY", "512mb")
    monkeypatch.setenv("RUNWARDEN_LOG_BYTES_PER_RUN", "1mib")
    monkeypatch.setenv("RUNWARDEN_ARTIFACT_RESERVE_BYTES", "20gb")
    monkeypatch.setenv("RUNWARDEN_RETENTION_DAYS", "0.00001")
    settings = Settings()
    assert settings.redis_maxmemory == 512 * 1024**2
    assert settings.log_bytes_per_run == 1024**2
    assert settings.artifact_reserve_bytes == 20 * 1024**3
    assert settings.retention_s == pytest.approx(0.864)


@pytest.mark.parametrize(
    "bad",
    [
        {"log_bytes_per_run": "1kb"},  # below a few longest lines
        {"metrics_bytes_per_run": 1000},
        {"log_line_bytes": 100},
        {"log_line_bytes": 40_000},  # more than half the smallest budget
        {"retention_days": 0},
        {"retention_days": float("inf")},
        {"redis_maxmemory": "1kb"},
        {"artifact_quota_run_bytes": 0},
        {"artifact_reserve_bytes": "-1"},
        {"redis_maxmemory": "lots"},
    ],
)
def test_bounds_that_cannot_work_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings(**bad)  # type: ignore[arg-type]
