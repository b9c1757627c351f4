"""`python -m workers.start`: a usage error exits 2, saying what is wrong, before the
app is imported (the worker and beat it starts are run by every service test)."""

from __future__ import annotations

import sys

import pytest

from workers.start import main


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "required: command"),
        (["worker"], "required: -n/--hostname"),
        (["worker", "-n", "w@%h", "-c", "0"], "-c must be at least 1"),
        (["worker", "-n", "w@%h", "-c", "two"], "invalid int value"),
        (["beat"], "required: -s/--schedule"),
        (["flower"], "invalid choice"),
    ],
)
def test_a_usage_error_exits_2_before_importing_the_app(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "workers.app", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err
    assert "workers.app" not in sys.modules
