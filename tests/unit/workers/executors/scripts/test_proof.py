"""`workers.executors.scripts.proof`: the checkpoint script's arguments and the parser
of its answer (the script itself runs under each shell in
tests/integration/workers/executors/scripts/test_proof_shells.py)."""

from __future__ import annotations

import pytest

from workers.executors import InvalidArgument, ProtocolError
from workers.executors.scripts import checkpoint_script, parse_checkpoints

CKPT = "output/checkpoint-21"


@pytest.mark.parametrize("bad", ["", "/etc", "output/../..", "output//c", "./output", "a\0b"])
def test_a_checkpoint_that_is_not_a_plain_relative_path_is_refused(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        checkpoint_script([("/w/run", bad)], "t0ken")
    with pytest.raises(InvalidArgument):
        checkpoint_script([("/w/run", CKPT)], "not a token")


def test_the_answer_is_read_strictly() -> None:
    two = [CKPT, "output/checkpoint-3"]
    ok = b"tk C 0 ok 0\ntk C 1 link 1\ntk E\n"
    assert parse_checkpoints(ok, "tk", two) == [
        None,
        "checkpoint output/checkpoint-3: output is a symbolic link",
    ]
    for broken in (
        b"tk C 0 ok 0\ntk E\n",  # one verdict missing
        b"tk C 0 ok 0\ntk C 1 ok 0\n",  # no end: cut short
        b"xx C 0 ok 0\ntk C 1 ok 0\ntk E\n",  # another token
        b"tk C 0 ok 0\ntk C 1 bogus 0\ntk E\n",  # an unknown verdict
        b"tk C 0 ok 0\ntk C 2 ok 0\ntk E\n",  # no such check
        b"tk C 0 ok\ntk C 1 ok 0\ntk E\n",  # a short record
    ):
        with pytest.raises(ProtocolError):
            parse_checkpoints(broken, "tk", two)
