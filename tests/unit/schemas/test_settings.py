"""`schemas.settings`: the stop limits' defaults and bounds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas import END_TIMEOUT_S, PROOF_TIMEOUT_S, Settings
from schemas.bounds import parse_size


def test_stop_limits_defaults() -> None:
    assert PROOF_TIMEOUT_S == 1800
    assert END_TIMEOUT_S == 600
    defaults = Settings()
    assert defaults.proof_timeout_s == PROOF_TIMEOUT_S
    assert defaults.end_timeout_s == END_TIMEOUT_S
    assert Settings(proof_timeout_s=1, end_timeout_s=2).end_timeout_s == 2
    for bad in [0, -1]:
        with pytest.raises(ValidationError):
            Settings(proof_timeout_s=bad)
        with pytest.raises(ValidationError):
            Settings(end_timeout_s=bad)


def test_the_configuration_guide_names_every_setting_with_its_default() -> None:
    """docs/configuration.md's table has one row per setting, with the default the
    settings object really has, and no row for a setting that is gone."""
    section = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    rows = {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^\| `RUNWARDEN_([A-Z0-9_]+)` \| ([^|]*) \|", section, re.M)
    }
    assert set(rows) == {name.upper() for name in Settings.model_fields}
    for name, field in Settings.model_fields.items():
        default = field.default
        if isinstance(default, bool):
            assert rows[name.upper()] == f"`{int(default)}`", name
        elif isinstance(default, int | float):
            cell = rows[name.upper()]
            shown = parse_size(cell.strip("`")) if cell.startswith("`") else cell.split()[0]
            assert float(shown) == float(default), name
