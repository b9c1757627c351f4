"""`workers.retrieval.stored`: the checks of a stored retrieval name what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas import RunState
from workers.errors import StoredArtifactsInvalid
from workers.executors import local_manifest
from workers.retrieval import MANIFEST_FILE, check_stored, retrieval_plan, retrieve, stored_manifest

from ....conftest import Target
from .conftest import RUN, SNAPSHOT


def test_check_stored_names_what_is_wrong(target: Target, run: Path, tmp_path: Path) -> None:
    entries, exclude = retrieval_plan(RunState.STOPPED, SNAPSHOT)
    dest = tmp_path / "store" / "run-7"
    with pytest.raises(StoredArtifactsInvalid, match=r"no manifest\.json"):
        check_stored(dest, "output/checkpoint-6", RUN)
    assert stored_manifest(dest) is None
    retrieve(target.executor, str(run), dest, entries, exclude, run_id=RUN)
    assert len(check_stored(dest, "", RUN)) == len(local_manifest(run, entries))
    with pytest.raises(StoredArtifactsInvalid, match="no file under"):
        check_stored(dest, "output/checkpoint-3", RUN)
    with pytest.raises(StoredArtifactsInvalid, match="no file under"):
        check_stored(dest, "output/checkpoint-", RUN)  # a prefix of names is not a path

    (dest / "output/checkpoint-6/optimizer.pt").unlink()
    with (dest / "output/checkpoint-6/empty").open("ab") as handle:
        handle.write(b"!")
    with pytest.raises(StoredArtifactsInvalid) as raised:
        check_stored(dest, "output/checkpoint-6", RUN)
    message = str(raised.value)
    assert "1 missing ('output/checkpoint-6/optimizer.pt')" in message
    assert "1 of another size ('output/checkpoint-6/empty')" in message
    assert not raised.value.retryable
    assert check_stored(dest, "job.log", RUN)  # the rest is still fine

    (dest / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(StoredArtifactsInvalid, match="malformed"):
        stored_manifest(dest)
