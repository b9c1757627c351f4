"""`schemas.errors`: the error tree. Every exception class defined in `schemas`,
`store`, `producers` and `workers` (every module, walked) is a `RunwardenError`, so a
caller can catch one class, and each is drawn by name in the tree of this module's
docstring, so a reader finds it there."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import producers
import schemas
import store
import workers
from schemas import RunwardenError, errors

PACKAGES = (schemas, store, producers, workers)

PRIVATE_SIGNALS = frozenset({"schemas.snapshot._NotStrictJson"})
"""Exceptions raised and caught inside their own module, never seen by a caller (a
parser's signal to itself): outside the tree. A new entry needs the same reason."""


def modules() -> list[ModuleType]:
    """Every module of `PACKAGES`, imported; not `__main__` (running it runs the CLI)."""
    found: list[ModuleType] = []
    for package in PACKAGES:
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if info.name.rsplit(".", 1)[-1] != "__main__":
                found.append(importlib.import_module(info.name))
    return found


def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined (not imported) in those modules, by its module's
    name and its own."""
    return {
        f"{module.__name__}.{name}": value
        for module in modules()
        for name, value in vars(module).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == module.__name__
    }


def test_the_walk_finds_the_errors_of_every_layer() -> None:
    found = exception_classes()
    for name in (
        "schemas.errors.RunwardenError",
        "schemas.errors.StoreError",
        "producers.api.OperationFailed",
        "producers.embedded.NotServing",
        "workers.errors.RetrievalError",
        "workers.executors.errors.UnsafeArchive",
    ):
        assert name in found, sorted(found)


def test_every_error_is_a_runwarden_error() -> None:
    outside = [
        name
        for name, cls in exception_classes().items()
        if name not in PRIVATE_SIGNALS and not issubclass(cls, RunwardenError)
    ]
    assert outside == []


def test_every_error_is_drawn_in_the_tree() -> None:
    tree = errors.__doc__
    assert tree is not None
    missing = [
        name
        for name, cls in exception_classes().items()
        if name not in PRIVATE_SIGNALS
        and re.search(rf"(?<!\w){re.escape(cls.__name__)}(?!\w)", tree) is None
    ]
    assert missing == []


def test_the_private_signals_are_private_and_still_there() -> None:
    found = exception_classes()
    for name in PRIVATE_SIGNALS:
        assert name in found, f"{name} is gone: drop it from PRIVATE_SIGNALS"
        assert found[name].__name__.startswith("_"), name
