"""`workers.executors.transport`: a local transport runs its scripts under the shell
asked for."""

from __future__ import annotations

from pathlib import Path

from ....shells import EXPECTED_BINARY, Shell, run_script


def test_scripts_run_under_the_shell_asked_for(sh: Shell) -> None:
    # Not the script's last command: a shell may exec that one in its own place.
    script = 'rw_exe=$(readlink "/proc/$$/exe"); echo "$rw_exe"'
    exe = run_script(sh.executor, script).decode().strip()
    assert Path(exe).name == EXPECTED_BINARY[sh.shell]
