"""The doctor's oldest Python for each job-side file (`doctor_checks.JOBSIDE_PYTHON`)
is what the files need: computed here from their syntax trees, the newest of the
run-time constructs they use (names imported from `typing`, builtin and `collections.abc`
types subscripted outside annotations, `X | None` outside annotations,
`str.removeprefix`, walrus, positional-only parameters, `match`). A file that starts
using something newer fails this test until the doctor says so too. Annotations are
not run (each file has `from __future__ import annotations`, checked here)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import pytest

from workers.executors.doctor_checks import JOBSIDE_PYTHON
from workers.jobside import jobside_dir

Version = tuple[int, int]

TYPING_SINCE: Final[dict[str, Version]] = {
    **dict.fromkeys(
        ["Any", "Callable", "cast", "ClassVar", "Generic", "IO", "Iterator", "NamedTuple",
         "NoReturn", "Optional", "overload", "TYPE_CHECKING", "TypeVar", "Union"],
        (3, 6),
    ),
    **dict.fromkeys(
        ["Final", "final", "Literal", "Protocol", "runtime_checkable", "TypedDict"], (3, 8)
    ),
    "Annotated": (3, 9),
    **dict.fromkeys(["Concatenate", "ParamSpec", "TypeAlias", "TypeGuard"], (3, 10)),
    **dict.fromkeys(
        ["assert_never", "LiteralString", "Never", "NotRequired", "Required", "Self"], (3, 11)
    ),
    **dict.fromkeys(["override", "TypeAliasType"], (3, 12)),
}  # fmt: skip
"""When each name of `typing` appeared; a name not here fails the test (add it)."""
GENERIC_BUILTINS: Final = {"dict", "frozenset", "list", "set", "tuple", "type"}
BUILTIN_TYPES: Final = GENERIC_BUILTINS | {"bool", "bytes", "float", "int", "object", "str"}
PREEMPT_MARK: Final = "_PREEMPT_MODULE"
"""The name through which `runwarden_job` loads `runwarden_preempt`: its functions
that use it belong to the preemption signals."""


def _annotation_ids(tree: ast.AST) -> set[int]:
    """The ids of every node inside an annotation (not run under the future import)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        parts: list[ast.AST | None] = []
        if isinstance(node, ast.AnnAssign | ast.arg):
            parts.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            parts.append(node.returns)
        for part in parts:
            if part is not None:
                inside.update(id(n) for n in ast.walk(part))
    return inside


def _type_like(node: ast.AST, type_names: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is None
    if isinstance(node, ast.Subscript):
        return True
    if isinstance(node, ast.Name):
        return node.id in BUILTIN_TYPES or node.id in type_names
    if isinstance(node, ast.Attribute):  # `signal.Handlers`, never `os.O_RDONLY`
        return node.attr[0].isupper() and not node.attr.isupper()
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _type_like(node.left, type_names) or _type_like(node.right, type_names)
    return False


def _construct(
    node: ast.AST, type_names: set[str], abc_names: set[str]
) -> list[tuple[Version, str]]:
    """The run-time constructs `node` itself is, with the Python each needs."""
    where = f"line {getattr(node, 'lineno', '?')}"
    if isinstance(node, ast.ImportFrom) and node.module == "typing":
        for alias in node.names:
            assert alias.name in TYPING_SINCE, f"add typing.{alias.name} to TYPING_SINCE"
        return [(TYPING_SINCE[a.name], f"typing.{a.name} ({where})") for a in node.names]
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        if node.value.id in GENERIC_BUILTINS | abc_names:
            return [((3, 9), f"{node.value.id}[...] at run time ({where})")]
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        if _type_like(node.left, type_names) and _type_like(node.right, type_names):
            return [((3, 10), f"X | Y of types at run time ({where})")]
    elif isinstance(node, ast.Attribute) and node.attr in ("removeprefix", "removesuffix"):
        return [((3, 9), f"str.{node.attr} ({where})")]
    elif isinstance(node, ast.NamedExpr):
        return [((3, 8), f"walrus ({where})")]
    elif isinstance(node, ast.arguments) and node.posonlyargs:
        return [((3, 8), f"positional-only parameters ({where})")]
    elif isinstance(node, ast.Match):
        return [((3, 10), f"match ({where})")]
    return []


def needs(nodes: Iterable[ast.AST], tree: ast.Module, label: str = "") -> tuple[Version, list[str]]:
    """The newest Python the run-time constructs among `nodes` (and below) need, and
    why (one line per distinct construct found, `label` in front)."""
    skip = _annotation_ids(tree)
    abc_names: set[str] = set()
    type_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("typing", "types"):
            type_names.update(a.asname or a.name for a in node.names)
        if isinstance(node, ast.ImportFrom) and node.module == "collections.abc":
            abc_names.update(a.asname or a.name for a in node.names)
    found: list[tuple[Version, str]] = [((3, 6), "f-strings")]
    for top in nodes:
        for node in ast.walk(top):
            if id(node) not in skip:
                found.extend(_construct(node, type_names, abc_names))
    version = max(v for v, _ in found)
    return version, sorted({f"{label}{why}" for v, why in found if v == version})


def parse(name: str) -> ast.Module:
    source = (jobside_dir() / f"{name}.py").read_text()
    tree = ast.parse(source)
    futures = [
        alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "__future__"
        for alias in node.names
    ]
    assert "annotations" in futures, f"{name}: annotations would run"
    return tree


def mentions(node: ast.AST, name: str) -> bool:
    return any(
        (isinstance(n, ast.Name) and n.id == name)
        or (isinstance(n, ast.Attribute) and n.attr == name)
        for n in ast.walk(node)
    )


def floors() -> dict[str, tuple[Version, list[str]]]:
    job, hf, preempt = parse("runwarden_job"), parse("runwarden_hf"), parse("runwarden_preempt")
    metrics = parse("runwarden_metrics")
    assert any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and "runwarden_metrics" in n.value
        for n in ast.walk(job)
    ), "runwarden_job no longer loads runwarden_metrics: revise this test"
    metrics_floor = needs(metrics.body, metrics, "runwarden_metrics: ")
    preempting = [
        n for n in job.body if isinstance(n, ast.FunctionDef) and mentions(n, PREEMPT_MARK)
    ]
    assert preempting, "runwarden_job no longer loads runwarden_preempt: revise this test"
    rest = [n for n in job.body if n not in preempting]
    # runwarden_job loads runwarden_metrics when it is imported: its floor is both's.
    job_floor = max(needs(rest, job, "runwarden_job: "), metrics_floor)
    preempt_floor = max(
        needs(preempt.body, preempt, "runwarden_preempt: "),
        needs(preempting, job, "runwarden_job: "),
    )
    loop = parse("runwarden_loop")
    loop_floor = max(needs(loop.body, loop, "runwarden_loop: "), job_floor)
    if mentions(loop, "install_preemption_signals"):
        loop_floor = max(loop_floor, preempt_floor)
    hf_floor = max(needs(hf.body, hf, "runwarden_hf: "), job_floor)
    if mentions(hf, "install_preemption_signals"):
        hf_floor = max(hf_floor, preempt_floor)
    assert any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and "runwarden_loop" in n.value
        for n in ast.walk(hf)
    ), "runwarden_hf no longer loads runwarden_loop: revise this test"
    hf_floor = max(hf_floor, loop_floor)  # loaded when runwarden_hf is imported
    lightning = parse("runwarden_lightning")
    assert any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and "runwarden_loop" in n.value
        for n in ast.walk(lightning)
    ), "runwarden_lightning no longer loads runwarden_loop: revise this test"
    # It loads runwarden_job and runwarden_loop when imported; its callback makes a
    # StopPoint, which installs the preemption signals, when training starts.
    lightning_floor = max(needs(lightning.body, lightning, "runwarden_lightning: "), loop_floor)
    return {
        "runwarden_job": job_floor,
        "runwarden_loop": loop_floor,
        "runwarden_hf": hf_floor,
        "runwarden_lightning": lightning_floor,
        "runwarden_preempt": preempt_floor,
        "runwarden_metrics": metrics_floor,
    }


def test_the_doctor_knows_the_oldest_python_of_each_job_side_file() -> None:
    computed = floors()
    for name, (version, why) in computed.items():
        assert JOBSIDE_PYTHON[name] == version, f"{name} needs {version}: {why}"
    assert set(JOBSIDE_PYTHON) == set(computed)


@pytest.mark.parametrize(
    ("source", "version"),
    [
        ("from typing import Final\n", (3, 8)),
        ("from typing import Self\n", (3, 11)),
        ("def f(x):\n    return x.removeprefix('a')\n", (3, 9)),
        ("x = tuple[int, ...]\n", (3, 9)),
        ("from collections.abc import Callable\nH = Callable[[int], None]\n", (3, 9)),
        ("from types import FrameType\nH = FrameType | None\n", (3, 10)),
        ("import os\nflags = os.O_RDONLY | os.O_NOFOLLOW\n", (3, 6)),
        ("x: tuple[int, ...] | None = None\n", (3, 6)),
        ("def f(a, /):\n    pass\n", (3, 8)),
        ("if (n := 1):\n    pass\n", (3, 8)),
        ("match 1:\n    case _:\n        pass\n", (3, 10)),
    ],
)
def test_the_scan_sees_each_construct(source: str, version: Version) -> None:
    tree = ast.parse(source)
    assert needs(tree.body, tree)[0] == version


def test_every_job_side_file_is_scanned() -> None:
    shipped = {Path(p).stem for p in (jobside_dir()).glob("runwarden_*.py")}
    assert shipped == set(JOBSIDE_PYTHON)
