"""`schemas.idempotency`: the rules of a launch key, the keys producers pick, the key
derived from a message's task id, and `LaunchSpec.key` on the wire."""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError

from schemas import SchemaError
from schemas.events import LaunchSpec
from schemas.idempotency import (
    LAUNCH_KEY_MAX_LEN,
    new_launch_key,
    owned_launch_key,
    task_launch_key,
    validate_launch_key,
)

HOSTILE = [
    "",
    " ",
    "a b",
    "a:b",
    "a|b",
    "a/b",
    "..",
    "-rf",
    ".hidden",
    "_x",
    "$(touch /tmp/pwned)",
    "`id`",
    "a;b",
    "a'b",
    'a"b',
    "a\nb",
    "a\rb",
    "a\0b",
    "ключ",
    "k" * (LAUNCH_KEY_MAX_LEN + 1),
]


# A fixed uuid4, not a fresh one: every pytest-xdist process must collect the same ids.
UUID4 = "9f1c2b7e-4d3a-4f6b-8e2d-5a7c9b1d3e4f"


@pytest.mark.parametrize("good", ["k", "0", "A-b_c.d", UUID4, "k" * LAUNCH_KEY_MAX_LEN])
def test_a_valid_key_is_kept(good: str) -> None:
    assert validate_launch_key(good) == good
    assert LaunchSpec(target="t", command="true", key=good).key == good


@pytest.mark.parametrize("bad", HOSTILE)
def test_a_hostile_key_is_refused_by_name(bad: str) -> None:
    with pytest.raises(SchemaError, match="invalid launch key") as error:
        validate_launch_key(bad)
    assert isinstance(error.value, ValueError)
    with pytest.raises(ValidationError, match="invalid launch key"):
        LaunchSpec(target="t", command="true", key=bad)


def test_a_key_is_a_string() -> None:
    with pytest.raises(SchemaError, match="a launch key is a string"):
        validate_launch_key(42)  # type: ignore[arg-type]


def test_a_spec_without_a_key_has_none_and_keeps_its_wire_shape() -> None:
    spec = LaunchSpec(target="t", command="true")
    assert spec.key is None
    body = spec.model_dump(mode="json")
    assert body["key"] is None
    assert LaunchSpec.model_validate({k: v for k, v in body.items() if k != "key"}) == spec


def test_new_keys_are_valid_and_distinct() -> None:
    keys = {new_launch_key() for _ in range(1000)}
    assert len(keys) == 1000
    assert all(validate_launch_key(k) == k and len(k) == 32 for k in keys)


def test_a_task_id_gives_the_same_key_every_time() -> None:
    task_id = str(uuid.uuid4())
    assert task_launch_key(task_id) == f"task-{task_id}"
    assert task_launch_key(task_id) == task_launch_key(task_id)
    assert task_launch_key(task_id) != task_launch_key(str(uuid.uuid4()))


@pytest.mark.parametrize("task_id", [t for t in HOSTILE if t] + ["x" * 500, "\udcff"])
def test_any_task_id_gives_a_valid_key(task_id: str) -> None:
    key = task_launch_key(task_id)
    assert validate_launch_key(key) == key
    assert key == task_launch_key(task_id)
    if all(c.isascii() and (c.isalnum() or c in "_.-") for c in task_id) and len(task_id) < 100:
        assert key == f"task-{task_id}"
    else:  # hashed: nothing of the id reaches a Redis key, a file or a log
        assert key.startswith("task-")
        assert len(key) == len("task-") + 64


def test_no_task_id_no_key() -> None:
    with pytest.raises(SchemaError, match="task id"):
        task_launch_key("")


def test_a_stored_key_says_whose_it_is_and_two_producers_never_share_one() -> None:
    assert owned_launch_key("billing", "nightly-0601") == "billing_nightly-0601"
    assert owned_launch_key("billing", "a_b") != owned_launch_key("billing-a", "b")
    # Whose: everything before the first `_` (no producer's name holds one).
    assert owned_launch_key("billing", "x_y").split("_", 1)[0] == "billing"
    long = "k" * LAUNCH_KEY_MAX_LEN
    owned = owned_launch_key("billing", long)
    assert owned == owned_launch_key("billing", long) != owned_launch_key("other", long)
    assert owned.startswith("billing_sha256-")
    assert validate_launch_key(owned) == owned


@pytest.mark.parametrize(
    ("producer", "key"), [("Bad", "k"), ("a_b", "k"), ("ok", "a b"), ("ok", "")]
)
def test_an_owned_key_needs_a_producer_s_name_and_a_launch_key(producer: str, key: str) -> None:
    with pytest.raises(SchemaError):
        owned_launch_key(producer, key)
