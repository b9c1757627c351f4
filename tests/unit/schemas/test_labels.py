"""Run labels and bulk-stop selections (`schemas.labels`): the grammar, refused before
anything is claimed or published, and the selection rule."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from schemas.events import LaunchSpec, StopManyBody
from schemas.labels import MAX_LABELS, parse_label, parse_labels, selects


@pytest.mark.parametrize(
    "text",
    ["sweep=lr3", "a=b", "team.ml_x-1=v1.2:3+4", f"{'k' * 63}={'v' * 63}", "Seed=0"],
)
def test_a_label_of_the_grammar_is_kept(text: str) -> None:
    key, value = parse_label(text)
    assert f"{key}={value}" == text


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("sweep", "is not KEY=VALUE"),
        ("=v", "label key ''"),
        ("-k=v", "label key '-k'"),
        (f"{'k' * 64}=v", "label key"),
        ("k=", "value ''"),
        ("k=a b", "value 'a b'"),
        ("k=a=b", "value 'a=b'"),
        ("k=a/b", "value 'a/b'"),
        ("k=*", "value '*'"),
        (f"k={'v' * 64}", "value"),
        ("k=v\n", "value"),
        ("kéy=v", "label key"),
    ],
)
def test_a_label_off_the_grammar_is_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_label(text)


def test_labels_are_bounded_and_a_key_given_twice_is_refused() -> None:
    assert len(parse_labels([f"k{i}=v" for i in range(MAX_LABELS)])) == MAX_LABELS
    with pytest.raises(ValueError, match=f"at most {MAX_LABELS} labels"):
        parse_labels([f"k{i}=v" for i in range(MAX_LABELS + 1)])
    with pytest.raises(ValueError, match="label k is given twice"):
        parse_labels(["k=a", "k=b"])


def test_a_launch_and_a_bulk_stop_refuse_bad_labels_in_their_bodies() -> None:
    with pytest.raises(ValidationError, match="value 'a b'"):
        LaunchSpec(target="t", command="true", labels={"k": "a b"})
    with pytest.raises(ValidationError, match="at most 16 labels"):
        LaunchSpec(target="t", command="true", labels={f"k{i}": "v" for i in range(17)})
    with pytest.raises(ValidationError, match="label key"):
        StopManyBody(targets=("t",), labels={"": "v"})
    assert LaunchSpec(target="t", command="true", labels={"b": "2", "a": "1"}).labels == {
        "a": "1",
        "b": "2",
    }


def test_a_bulk_stop_selects_something_on_named_targets() -> None:
    with pytest.raises(ValidationError, match="all, labels or a name glob"):
        StopManyBody(targets=("t",))
    with pytest.raises(ValidationError, match="at least 1"):
        StopManyBody(targets=(), all=True)
    with pytest.raises(ValidationError, match="name glob"):
        StopManyBody(targets=("t",), name_glob="")
    with pytest.raises(ValidationError, match="control character"):
        StopManyBody(targets=("t",), name_glob="gpt\n*")
    assert StopManyBody(targets=("t", "u", "t"), all=True).targets == ("t", "u")


def test_the_selectors_combine() -> None:
    labels = {"sweep": "lr", "seed": "1"}
    assert selects(labels, "gpt-a", {}, None)  # --all
    assert selects(labels, "gpt-a", {"sweep": "lr"}, None)
    assert selects(labels, "gpt-a", {"sweep": "lr", "seed": "1"}, "gpt-*")
    assert not selects(labels, "gpt-a", {"sweep": "lr", "seed": "2"}, None)
    assert not selects(labels, "gpt-a", {"other": "lr"}, None)
    assert not selects(labels, "gpt-a", {"sweep": "lr"}, "bert-*")
    assert not selects(labels, "GPT-a", {}, "gpt-*")  # case-sensitive
    assert selects({}, "run[1]", {}, "run[[]1]")
