"""Run labels and bulk-stop selections: the short `key=value` pairs a run is launched
with (`runwarden launch --label sweep=lr3`, `LaunchSpec.labels`, kept on its record),
and the rule by which a bulk stop (`runwarden.stop_many`) selects runs by them and by
name. Pure rules: no Redis, no process.

The grammar, checked before anything is claimed or published:

- a key is 1-63 of `A-Za-z0-9_.-`, starting with a letter or a digit;
- a value is 1-63 of `A-Za-z0-9_.:+-` (no `=`, no space, no `/`, no glob character);
- a run has at most [`MAX_LABELS`] labels, a selection at most as many;
- a name glob is 1-[`MAX_GLOB`] printable characters, matched with `fnmatch`'s
  case-sensitive rule (`*`, `?`, `[...]`) against the run's whole name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Annotated, Final

from pydantic import AfterValidator

__all__ = [
    "LABEL_KEY",
    "LABEL_VALUE",
    "MAX_GLOB",
    "MAX_LABELS",
    "Labels",
    "check_labels",
    "check_name_glob",
    "parse_label",
    "parse_labels",
    "selects",
]

LABEL_KEY: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
LABEL_VALUE: Final = re.compile(r"[A-Za-z0-9_.:+-]{1,63}")
MAX_LABELS: Final = 16
"""Labels a run may carry, and labels a selection may name."""
MAX_GLOB: Final = 200
"""Longest name glob of a selection, in characters."""


def check_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """`labels` as a plain dict, sorted by key, when every pair fits the grammar.

    Raises:
        ValueError: saying which label and why (a pydantic field turns it into a
            validation error).
    """
    if len(labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels, not {len(labels)}")
    for key, value in labels.items():
        if not isinstance(key, str) or LABEL_KEY.fullmatch(key) is None:
            raise ValueError(
                f"label key {str(key)[:70]!r} is not 1-63 of A-Za-z0-9_.- starting with a "
                "letter or digit"
            )
        if not isinstance(value, str) or LABEL_VALUE.fullmatch(value) is None:
            raise ValueError(
                f"label {key}: value {str(value)[:70]!r} is not 1-63 of A-Za-z0-9_.:+-"
            )
    return dict(sorted(labels.items()))


Labels = Annotated[dict[str, str], AfterValidator(check_labels)]
"""A run's labels, or a selection's: [`check_labels`]."""


def parse_label(text: str) -> tuple[str, str]:
    """`KEY=VALUE` as a pair, checked (`--label sweep=lr3`).

    Raises:
        ValueError: not of that form, or a key or value off the grammar.
    """
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"label {text[:70]!r} is not KEY=VALUE")
    check_labels({key: value})
    return key, value


def parse_labels(texts: Iterable[str]) -> dict[str, str]:
    """Every `KEY=VALUE` of `texts` as one checked mapping; a key given twice is
    refused (a selection cannot ask for two values of one key).

    Raises:
        ValueError: saying which text and why.
    """
    labels: dict[str, str] = {}
    for text in texts:
        key, value = parse_label(text)
        if key in labels:
            raise ValueError(f"label {key} is given twice")
        labels[key] = value
    return check_labels(labels)


def check_name_glob(glob: str) -> str:
    """`glob` when it is 1-[`MAX_GLOB`] printable characters.

    Raises:
        ValueError: saying why.
    """
    if not 1 <= len(glob) <= MAX_GLOB:
        raise ValueError(f"a name glob is 1-{MAX_GLOB} characters")
    if not glob.isprintable():
        raise ValueError("a name glob holds no control character")
    return glob


def selects(
    run_labels: Mapping[str, str],
    run_name: str,
    labels: Mapping[str, str],
    name_glob: str | None,
) -> bool:
    """Whether a run with `run_labels` and `run_name` is selected: it carries every
    label of `labels` with the same value, and its whole name matches `name_glob`
    (when given; `fnmatch`, case-sensitive). Both empty select every run (`--all`)."""
    if any(run_labels.get(key) != value for key, value in labels.items()):
        return False
    return name_glob is None or fnmatchcase(run_name, name_glob)
