"""`workers.executors.scripts.common`: `quote`, as properties, under dash (`sh`) and
`busybox sh`."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.executors import InvalidArgument, quote

SHELLS = [("sh",), ("busybox", "sh")]
shell_text = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=60
)


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
@settings(max_examples=60, deadline=None)
@given(text=shell_text)
def test_quote_is_one_word_expanding_to_itself(shell: tuple[str, ...], text: str) -> None:
    script = f'set -- {quote(text)}; printf \'%s|%s\' "$#" "$1"'
    out = subprocess.run([*shell, "-c", script], capture_output=True, check=True, timeout=10)
    assert out.stdout == b"1|" + text.encode()


@pytest.mark.parametrize("shell", SHELLS, ids=" ".join)
@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet="'\"\\$`!*?[]{}()<>;&| \t\n~#=%-a", max_size=30))
def test_quote_survives_shell_syntax(shell: tuple[str, ...], text: str) -> None:
    out = subprocess.run(
        [*shell, "-c", "printf %s " + quote(text)], capture_output=True, check=True, timeout=10
    )
    assert out.stdout == text.encode()
    assert out.stderr == b""


@given(st.text(max_size=20), st.text(max_size=20))
def test_quote_refuses_nul(before: str, after: str) -> None:
    with pytest.raises(InvalidArgument):
        quote(before + "\0" + after)


@given(shell_text)
def test_quote_is_single_quoted(text: str) -> None:
    quoted = quote(text)
    assert quoted.startswith("'")
    assert quoted.endswith("'")
    assert quoted.replace("'\\''", "").count("'") == 2
