"""The layers of `workers/`: its modules and subpackages import one another without a
circle, at most [`MOST_LEVELS`] deep (a module that imports none of the others is level
1; one that does, one more than the deepest it imports). Every import counts, the ones
inside a function too: they are the chain a reader follows."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from bench.harness.paths import ROOT

MOST_LEVELS = 6
PACKAGE = ROOT / "workers"


def _room(module: str) -> str | None:
    """The part of `workers` a dotted module belongs to: a module of the package (its
    name) or a subpackage (its name); None outside `workers` or for the package."""
    parts = module.split(".")
    return parts[1] if parts[0] == "workers" and len(parts) > 1 else None


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> set[str]:
    """The dotted modules `path` imports (relative ones resolved; `from . import x`
    counted as the module `x` of that package)."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = str(node.module)
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    """Each part of `workers` -> the other parts it imports."""
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        room = _room(_module_of(path))
        if room is None:
            continue
        edges.setdefault(room, set())
        for target in _imported(path):
            other = _room(target)
            if other in (None, room):
                continue
            if (PACKAGE / f"{other}.py").exists() or (PACKAGE / str(other)).is_dir():
                edges[room].add(str(other))
    return edges


def test_workers_has_no_circle_and_at_most_six_levels() -> None:
    edges = graph()

    @cache
    def level(room: str, seen: frozenset[str] = frozenset()) -> int:
        assert room not in seen, f"a circle of imports through {sorted(seen | {room})}"
        return 1 + max((level(o, seen | {room}) for o in edges[room]), default=0)

    levels = {room: level(room) for room in edges}
    deepest = max(levels.values())
    top = sorted(room for room, n in levels.items() if n == deepest)
    assert deepest <= MOST_LEVELS, f"{deepest} levels, at the top: {top}"
    assert {"tasks", "executors", "watch"} <= set(levels)  # the graph was read
