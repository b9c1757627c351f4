"""Every `--help` page of the `runwarden` command line, walked from the app itself (so
a new command is checked the day it is added), rendered through typer's CliRunner at
a narrow and a normal terminal width: each option and argument says what it is for,
each command shows an example, flag pairs read `--x/--no-x` (never `--no-no-x`), no
type label (`<bool>`, `<list[str]>`) shows, and every word of the help as written
(a path, a flag, `[options]`) comes out whole on one line: never eaten as markup,
never cut by a line break."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from producers.cli import app
from producers.cli.helpfmt import wrap
from schemas import SnapshotReason

WIDTHS = (50, 80)
"""COLUMNS for each page: click lays help out at least 50 columns wide."""
TYPE_LABEL = re.compile(r"<[a-z_]+(?:\[[^\]]*\])?(?: range)?>")
BRACKETED = re.compile(r"\[[^\]\s]+\]")
PATH = re.compile(r"(?<![\w/])(?:~|\.{1,2})?/[\w.@:+-]+(?:/[\w.@:+-]+)*")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*[a-z]")


def pages(command: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(the words that reach it, the click command) of every command and group."""
    command = command if command is not None else get_command(app)
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from pages(sub, (*path, name))


PAGES = dict(pages())
LEAVES = [p for p, c in PAGES.items() if not hasattr(c, "commands")]


def rendered(path: tuple[str, ...], width: int) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.output


def written(command: Any) -> str:
    """The help of `command` as its source writes it: its text, epilog, and the help
    of each of its parameters."""
    texts = [command.help or "", command.epilog or ""]
    texts += [getattr(p, "help", None) or "" for p in command.params]
    return "\n".join(texts).replace("\b", "")


def test_the_walk_finds_every_command() -> None:
    assert {" ".join(p) for p in LEAVES} >= {
        "launch", "resume", "retrieve", "follow", "stop", "cancel", "serve", "demo", "runs",
        "show", "logs", "stops", "targets add", "targets ls", "targets rm", "producers add",
        "producers ls", "producers rm",
    }  # fmt: skip


@pytest.mark.parametrize("path", list(PAGES), ids=lambda p: " ".join(p) or "runwarden")
def test_every_option_and_argument_says_what_it_is_for(path: tuple[str, ...]) -> None:
    for param in PAGES[path].params:
        assert (getattr(param, "help", None) or "").strip(), f"{path}: {param.name} has no help"


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_command_shows_an_example(path: tuple[str, ...]) -> None:
    page = rendered(path, 80)
    examples = [line.strip() for line in page.splitlines() if line.startswith("    runwarden ")]
    assert examples, page
    assert all(line.split()[1 : 1 + len(path)] == list(path) for line in examples), examples


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("path", list(PAGES), ids=lambda p: " ".join(p) or "runwarden")
def test_help_pages_have_no_warts(path: tuple[str, ...], width: int) -> None:
    page = rendered(path, width)
    assert "--no-no-" not in page, page
    assert TYPE_LABEL.search(page) is None, page
    assert "{" not in page.split("\n", 1)[0], page  # the usage line: `RUN_ID`, not `{RUN_ID}`
    lines = page.splitlines()
    source = written(PAGES[path])
    for pattern in (BRACKETED, PATH, FLAG):
        for token in pattern.findall(source):
            assert any(token in line for line in lines), f"{token!r} is cut or lost:\n{page}"
    for word in source.split():
        assert any(word in line for line in lines), f"{word!r} is cut or lost:\n{page}"


def test_the_checks_above_meet_what_they_guard() -> None:
    """The words the wart checks look for are there to look for: a bracket that rich
    markup would eat, hyphenated flags click would cut, paths, and a flag pair."""
    launch = written(PAGES[("launch",)])
    assert "[options]" in BRACKETED.findall(launch)
    assert "--usd-per-hour" in FLAG.findall(launch)
    assert "user@host[:port]" in written(PAGES[("targets", "add")])
    assert "/data/runs/started-by-hand" in PATH.findall(written(PAGES[("follow",)]))
    page = rendered(("launch",), 80)
    assert "--disk-policy / --no-disk-policy" in page
    assert "--snapshots / --no-snapshots" in page


@pytest.mark.parametrize(
    "path",
    [("runs",), ("show",), ("stops",), ("targets", "ls"), ("producers", "ls"), ("launch",),
     ("resume",), ("follow",), ("stop",), ("cancel",), ("retrieve",), ("targets", "add"),
     ("producers", "add"), ("producers", "rm")],
    ids=" ".join,
)  # fmt: skip
def test_commands_that_print_a_record_or_a_listing_take_json(path: tuple[str, ...]) -> None:
    names = {o for p in PAGES[path].params for o in getattr(p, "opts", ())}
    assert "--json" in names, names


def test_wrap_breaks_at_spaces_only() -> None:
    text = "needs --usd-per-hour and /a/rather-long/path-that-is-longer-than-the-line here"
    lines = wrap(text, 12).splitlines()
    assert "--usd-per-hour" in lines
    assert "/a/rather-long/path-that-is-longer-than-the-line" in lines
    assert " ".join(lines) == text


def test_wrap_keeps_the_lines_of_a_paragraph_marked_b() -> None:
    text = "A paragraph to\nwrap again.\n\n\b\nExamples:\n  runwarden x --flag a b c d\n"
    assert wrap(text, 30, "  ", "  ", paragraphs=True) == (
        "  A paragraph to wrap again.\n\n  Examples:\n    runwarden x --flag a b c d"
    )


def test_stop_names_every_reason() -> None:
    page = " ".join(rendered(("stop",), 200).split())
    assert all(reason.value in page for reason in SnapshotReason), page
