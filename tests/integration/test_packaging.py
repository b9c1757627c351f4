"""What ships: the wheel built from `pyproject.toml` holds every package and every
file the code loads at run time (Lua scripts, templates, static files, the job
side), and the image of `Dockerfile` copies every package the wheel is built from
(an image without `store/` would install, then fail at its first import)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

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


def test_the_wheel_holds_every_file_the_code_loads(tmp_path: Path) -> None:
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
    (wheel,) = tmp_path.glob("runwarden-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        str(path.relative_to(ROOT))
        for root in packaged_roots()
        for path in (ROOT / root).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert wanted - shipped == set()
    assert any(name.startswith("store/lua/") for name in wanted)
