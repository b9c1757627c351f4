"""Plain help pages for the `runwarden` command line: typer without rich markup,
with a help formatter that never cuts a word.

click's formatter wraps at hyphens (`--usd-per-` / `hour`) and cuts a word longer
than its line (a path); typer labels each argument with its Python type (`RUN_ID
<str>`) and writes a required one as `{RUN_ID}`. The formatter here wraps at spaces
only (a longer word overflows its line: a terminal folds it on screen, as any long
line), keeps the lines of a paragraph whose first line is `\\b` (as click does: the
examples), leaves the type labels out and writes arguments as click does (`RUN_ID`,
`[RUN_ID]`). `PlainTyper` makes every command and group of an app use it; text is
never read as markup, so `[options]` and `user@host[:port]` print as written.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.models import CommandFunctionType

__all__ = ["PlainTyper", "wrap"]

_TYPE_LABEL = re.compile(r" <[^<>]*>$")
"""typer's label of an argument's Python type, after its name in the help list."""
_REQUIRED = re.compile(r"\{([^{}]+)\}")
"""typer's `{NAME}` for a required argument in the usage line."""
_NO_REWRAP = "\b"
"""click's mark, alone on the first line of a paragraph: keep its lines."""


def wrap(
    text: str, width: int, initial: str = "", subsequent: str = "", paragraphs: bool = False
) -> str:
    """`text` wrapped to `width` columns at spaces only, never inside a word, the
    first line after `initial` and the others after `subsequent`. With `paragraphs`,
    blank lines separate paragraphs, each wrapped on its own with its first line's
    indentation, and a paragraph whose first line is `\\b` keeps its lines as they
    are (indented only)."""
    wrapper = textwrap.TextWrapper(
        width=max(width, 1), initial_indent=initial, subsequent_indent=subsequent,
        replace_whitespace=False, break_long_words=False, break_on_hyphens=False,
    )  # fmt: skip
    if not paragraphs:
        return wrapper.fill(text)
    blocks: list[list[str]] = [[]]
    for line in text.expandtabs().splitlines():
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    done = []
    for block in (b for b in blocks if b):
        extra = " " * (len(block[0]) - len(block[0].lstrip()))
        if block[0].strip() == _NO_REWRAP:
            kept = (
                (subsequent if i else initial) + extra + line for i, line in enumerate(block[1:])
            )
            done.append("\n".join(line.rstrip() for line in kept))
        else:
            wrapper.initial_indent, wrapper.subsequent_indent = initial + extra, subsequent + extra
            done.append(wrapper.fill(" ".join(line.strip() for line in block)))
    return "\n\n".join(done)


_Base: Any = typer.Context.formatter_class
"""click's help formatter (typer may bring its own copy of click)."""


class _Formatter(_Base):  # type: ignore[misc]  # click's formatter is untyped here
    """click's help formatter with `wrap` in place of click's wrapping."""

    width: int
    current_indent: int

    def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
        head = f"{'Usage: ' if prefix is None else prefix:>{self.current_indent}}{prog} "
        width = self.width - self.current_indent
        self.write(wrap(_REQUIRED.sub(r"\1", args), width, head, " " * len(head)) + "\n")

    def write_text(self, text: str) -> None:
        indent = " " * self.current_indent
        self.write(wrap(text, self.width, indent, indent, paragraphs=True) + "\n")

    def write_dl(
        self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2
    ) -> None:
        rows = [(_TYPE_LABEL.sub("", first), second) for first, second in rows]
        first_col = min(max((len(first) for first, _ in rows), default=0), col_max)
        first_col += col_spacing
        margin = " " * (first_col + self.current_indent)
        for first, second in rows:
            self.write(" " * self.current_indent + first)
            if not second:
                self.write("\n")
                continue
            if len(first) <= first_col - col_spacing:
                self.write(" " * (first_col - len(first)))
            else:
                self.write("\n" + margin)
            lines = wrap(second, max(self.width - first_col - 2, 10), paragraphs=True)
            head, *rest = lines.splitlines() or [""]
            self.write(head + "\n")
            for line in rest:
                self.write((margin + line if line else "") + "\n")


class _Context(typer.Context):
    formatter_class = _Formatter


class _Command(TyperCommand):
    context_class = _Context


class _Group(TyperGroup):
    context_class = _Context


class PlainTyper(typer.Typer):
    """A `typer.Typer` whose help is plain text laid out by `wrap`: its commands (unless
    given another `cls`) and the app itself as a group."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=_Group, rich_markup_mode=None, **kwargs)

    def command(
        self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kwargs: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(name, cls=cls or _Command, **kwargs)
