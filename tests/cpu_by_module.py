"""`pytest -p tests.cpu_by_module --cpu-by-module`: the CPU time each test module costs,
with everything it starts (services, workers, jobs, shells), from cgroup v2.

The suite is CPU-bound on a 2-core machine (docs/development.md), so a module's wall
time says little about what it costs the others: this says what it burns. Each test
process moves itself, at the first test of each module, into a cgroup of its own
(`<hierarchy>/runwarden-suite/<worker>/<module>`); every process it starts from then
on is born there, whatever session it makes. Processes started earlier (a session's
redis-server, sshd) stay in the module that started them, and jobs launched on a
contained local target run in their run's cgroup (`workers.cgroups`): their total is
shown apart. At the end the controlling process prints the modules, costliest first,
and removes the cgroups it can.

Needs root and a writable cgroup v2 hierarchy (`workers.cgroups.hierarchy`); without
them the option is refused with the reason, before any test runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import pytest

from workers.cgroups import CGROUP_PARENT, hierarchy

SUITE_CGROUP = "runwarden-suite"
_current: dict[str, str] = {}
"""The module this test process runs now (`module`): it moves at the next one."""
_JOBS_AT = pytest.StashKey[float]()
"""The run cgroups' CPU seconds when the session began."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-by-module",
        action="store_true",
        help="print the CPU seconds each test module cost, with what it started (cgroup v2)",
    )


def _usage_s(cgroup: Path) -> float:
    """The CPU seconds of `cgroup` and its descendants, the removed ones included."""
    for line in (cgroup / "cpu.stat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == "usage_usec":
            return int(value) / 1e6
    return 0.0


def _root(config: pytest.Config) -> Path | None:
    if not config.getoption("--cpu-by-module"):
        return None
    found = hierarchy()
    if found is None or os.geteuid() != 0:
        raise pytest.UsageError("--cpu-by-module needs root and a writable cgroup v2 hierarchy")
    return found


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def pytest_configure(config: pytest.Config) -> None:
    root = _root(config)
    if root is None or _worker() != "main":
        return
    suite = root / SUITE_CGROUP
    with contextlib.suppress(FileNotFoundError):
        _remove(suite)
    suite.mkdir()
    jobs = root / CGROUP_PARENT
    config.stash[_JOBS_AT] = _usage_s(jobs) if jobs.is_dir() else 0.0


def pytest_runtest_setup(item: pytest.Item) -> None:
    root = _root(item.config)
    if root is None:
        return
    module = item.nodeid.split("::", 1)[0]
    if _current.get("module") == module:
        return
    _current["module"] = module
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", module.removesuffix(".py").replace("/", "."))
    cgroup = root / SUITE_CGROUP / _worker() / name
    cgroup.mkdir(parents=True, exist_ok=True)
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    config = terminalreporter.config
    root = _root(config)
    if root is None or _worker() != "main":
        return
    suite = root / SUITE_CGROUP
    costs: dict[str, float] = {}
    for worker in (p for p in suite.iterdir() if p.is_dir()):
        for module in (p for p in worker.iterdir() if p.is_dir()):
            costs[module.name] = costs.get(module.name, 0.0) + _usage_s(module)
    jobs = root / CGROUP_PARENT
    in_runs = (_usage_s(jobs) if jobs.is_dir() else 0.0) - config.stash.get(_JOBS_AT, 0.0)
    write = terminalreporter.write_line
    write(f"CPU by module: {sum(costs.values()):.0f} s; jobs in run cgroups {in_runs:.0f} s")
    for name, seconds in sorted(costs.items(), key=lambda kv: -kv[1]):
        write(f"{seconds:8.1f} s  {name}")
    if path := os.environ.get("RUNWARDEN_CPU_BY_MODULE_JSON"):
        Path(path).write_text(json.dumps({"modules": costs, "run_cgroups": in_runs}, indent=1))
    # This process ran tests too without xdist: back to the root, so its cgroup goes.
    (root / "cgroup.procs").write_text(str(os.getpid()))
    _remove(suite)


def _remove(cgroup: Path) -> None:
    """Removes `cgroup` and its descendants that are empty (`rmdir`, deepest first: a
    cgroup's files cannot be unlinked); one still holding a process is left."""
    for path in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            path.rmdir()
    with contextlib.suppress(OSError):
        cgroup.rmdir()
