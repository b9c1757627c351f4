"""`schemas` loads its submodules on first use (what `import schemas` loads:
tests/integration/producers/test_cli_imports.py), and every public name still
resolves, to the object its submodule defines. The names the type checker sees (the imports under
TYPE_CHECKING) and the ones loaded at run time (`_WHERE`) are the same."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

import schemas


def checked_imports() -> dict[str, str]:
    """Name -> submodule, from the imports under `if TYPE_CHECKING:` in schemas/__init__."""
    tree = ast.parse(inspect.getsource(schemas))
    guard = next(n for n in tree.body if isinstance(n, ast.If))
    return {
        alias.asname or alias.name: str(node.module)
        for node in guard.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_the_checked_and_the_loaded_names_agree() -> None:
    assert checked_imports() == schemas._WHERE
    assert sorted(schemas.__all__) == sorted(schemas._WHERE)


def test_every_name_resolves_to_its_modules_object() -> None:
    for name, module in schemas._WHERE.items():
        assert getattr(schemas, name) is getattr(
            importlib.import_module(f"schemas.{module}"), name
        )
    assert "Settings" in dir(schemas)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchName"):
        _ = schemas.NoSuchName  # type: ignore[attr-defined]

