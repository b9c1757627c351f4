"""The public faces of `schemas`, `store` and `workers.executors` (code outside a
package imports from these, never from its modules), pinned as httpx pins its own:
`__all__` names exactly the package's public members, each of which exists, and it
is sorted as ruff's RUF022 sorts it (constants, then classes, then the rest; numbers
in names in numeric order)."""

from __future__ import annotations
import __future__

import re
from types import ModuleType

import pytest

import schemas
import store
from workers import executors

PACKAGES = [schemas, store, executors]


def public_members(package: ModuleType) -> list[str]:
    """The names a package binds that a caller may use: neither private, nor one of its
    submodules (bound by importing them), nor the `annotations` future feature; and
    those it binds on first use (`_LAZY`, through its `__getattr__`)."""
    bound = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_")
        and not isinstance(value, ModuleType)
        and value is not __future__.annotations
    }
    return sorted(bound | set(getattr(package, "_LAZY", ())))


def isort_key(name: str) -> tuple[int, list[int | str]]:
    """RUF022's order: SCREAMING_SNAKE_CASE, then CamelCase, then the rest; within each,
    a natural order."""
    kind = 0 if name.upper() == name else 1 if name[0].isupper() else 2
    return kind, [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda package: package.__name__)
def test_all_exports_exactly_the_public_members(package: ModuleType) -> None:
    exported: list[str] = package.__all__
    assert len(set(exported)) == len(exported)
    for name in exported:
        assert hasattr(package, name), name
    assert sorted(exported) == public_members(package)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda package: package.__name__)
def test_all_is_sorted(package: ModuleType) -> None:
    exported: list[str] = package.__all__
    assert exported == sorted(exported, key=isort_key)
