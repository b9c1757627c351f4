"""`schemas.settings`: the stop limits' defaults and bounds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas import END_TIMEOUT_S, PROOF_TIMEOUT_S, REQUEST_POLL_S, Settings


def test_stop_limits_defaults() -> None:
    assert PROOF_TIMEOUT_S == 1800
    assert END_TIMEOUT_S == 600
    assert REQUEST_POLL_S == 30
    defaults = Settings()
    assert defaults.proof_timeout_s == PROOF_TIMEOUT_S
    assert defaults.end_timeout_s == END_TIMEOUT_S
    assert Settings(proof_timeout_s=1, end_timeout_s=2).end_timeout_s == 2
    for bad in [0, -1]:
        with pytest.raises(ValidationError):
            Settings(proof_timeout_s=bad)
        with pytest.raises(ValidationError):
            Settings(end_timeout_s=bad)
