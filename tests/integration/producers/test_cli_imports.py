"""What the command line loads before it does anything: `import producers.cli`,
`runwarden --help` and `runwarden show --help` build the command tree without the
models, Celery, the store, the SSH client, the doctor's checks or the web stack, so a
person's `--help` (and a command's own parsing) does not pay for them. Each case runs
in a fresh interpreter, which lists the modules it ended with; so does `import
schemas`, which loads its submodules on first use. No timing here:
bench/cli_startup.py measures the CPU time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "celery",
    "kombu",
    "redis",
    "paramiko",
    "flower",
    "fastapi",
    "starlette",
    "uvicorn",
    "jinja2",
    "prometheus_client",
    "pydantic_settings",
    "store",
    "workers",
    "producers.api",
    "producers.embedded",
    "producers.service",
    "producers.web",
    "producers.demo",
    "producers.health",
    "producers.metrics",
    "schemas.settings",
    "schemas.run",
    "schemas.events",
    "schemas.doctor",
)
"""Modules (with their submodules) none of the cases may load."""

_PROBE = """
import json, sys
import producers.cli
exec(sys.argv.pop(1))
if sys.argv[1:]:
    sys.argv = ["runwarden", *sys.argv[1:]]
    try:
        producers.cli.main()
    except SystemExit as end:
        assert end.code in (0, None), end.code
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def loaded(*argv: str, also: str = "") -> set[str]:
    """The modules a fresh interpreter holds after `import producers.cli`, the Python
    code `also` and, with `argv`, the command line run on `argv`."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, also, *argv],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


def heavy_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(f"{h}.") for h in HEAVY))


@pytest.mark.parametrize("argv", [(), ("--help",), ("show", "--help")])
def test_the_command_tree_loads_nothing_heavy(argv: tuple[str, ...]) -> None:
    modules = loaded(*argv)
    assert "producers.cli.views" in modules  # the commands were registered
    assert heavy_in(modules) == []


def test_the_top_help_does_not_load_pydantic() -> None:
    # Typer builds a command's parameters with pydantic, but only for the command
    # that runs: the list of commands needs none of it.
    assert not any(m == "pydantic" or m.startswith("pydantic.") for m in loaded("--help"))


def test_the_probe_sees_a_heavy_import() -> None:
    # What a command body imports when it runs: the check above would see it.
    assert {"producers.api", "store", "redis"} <= set(heavy_in(loaded(also="import producers.api")))


def test_importing_the_package_builds_no_model() -> None:
    code = (
        "import json, sys, schemas, schemas.text, schemas.defaults; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    modules = set(json.loads(done.stdout))
    assert not {m for m in modules if m.startswith("pydantic")}
    assert {m for m in modules if m.startswith("schemas.")} == {"schemas.text", "schemas.defaults"}
