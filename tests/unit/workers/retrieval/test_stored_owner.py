"""A stored retrieval belongs to the run it was made for (`manifest.json`'s `run_id`):
never reused, resumed from or returned for another run, directly and through the
worker's retrieval (fakeredis, a real local executor). And what a retrieval left
out (links leading outside the run) reaches the run's record and the CLI."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from producers.cli.common import artifacts_line
from schemas import Artifacts, ArtifactsPhase, JobStatus, NotResumable, RunState
from workers import finish
from workers.artifacts import retrieve_artifacts
from workers.errors import StoredArtifactsInvalid
from workers.executors import LocalExecutor
from workers.launch import resumable
from workers.retrieval import MANIFEST_FILE, check_stored, retrieve, reuse_stored

from ..conftest import ended_run, policy_worker

ENTRIES = ["job.log", "output"]


@pytest.fixture
def stored_a(tmp_path: Path) -> Path:
    """Run A's complete retrieval in `store/A`."""
    run = tmp_path / "work" / "A"
    (run / "output").mkdir(parents=True)
    (run / "job.log").write_text("run A\n")
    (run / "output" / "weights.bin").write_bytes(b"A" * 1000)
    dest = tmp_path / "store" / "A"
    retrieve(LocalExecutor(tmp_path / "work"), str(run), dest, ENTRIES, run_id="A")
    return dest


def drop_run_id(dest: Path) -> None:
    """Rewrites `dest/manifest.json` as a version that recorded no run id wrote it."""
    path = dest / MANIFEST_FILE
    document = json.loads(path.read_text())
    for key in ("run_id", "links", "skipped_links"):
        del document[key]
    document["version"] = 1
    path.write_text(json.dumps(document))


def test_a_retrieval_records_its_run(stored_a: Path) -> None:
    document = json.loads((stored_a / MANIFEST_FILE).read_text())
    assert document["run_id"] == "A"
    assert document["version"] == 2
    assert document["skipped_links"] == []
    assert len(check_stored(stored_a, "", "A")) == 2
    assert reuse_stored(stored_a, "A") is not None


def test_a_copy_of_run_a_is_never_accepted_for_run_b(stored_a: Path, tmp_path: Path) -> None:
    with pytest.raises(StoredArtifactsInvalid, match="made for run 'A', not 'B'"):
        check_stored(stored_a, "output", "B")
    run_b = tmp_path / "work" / "B"
    run_b.mkdir()
    (run_b / "job.log").write_text("run B\n")
    executor = LocalExecutor(tmp_path / "work")
    # Not returned as B's, nor replaced: a person looks first.
    with pytest.raises(StoredArtifactsInvalid, match="made for run 'A'"):
        retrieve(executor, str(run_b), stored_a, ENTRIES, run_id="B")
    assert (stored_a / "job.log").read_text() == "run A\n"

    # A's copy where B's belongs: not B's, moved aside, retrieved again for B.
    dest_b = tmp_path / "store" / "B"
    shutil.copytree(stored_a, dest_b, symlinks=True)
    with pytest.raises(StoredArtifactsInvalid, match="made for run 'A', not 'B'"):
        check_stored(dest_b, "job.log", "B")
    assert reuse_stored(dest_b, "B") is None
    assert not dest_b.exists()
    [aside] = (tmp_path / "store").glob("B.damaged-*")
    assert (aside / "job.log").read_text() == "run A\n"
    got = retrieve(executor, str(run_b), dest_b, ENTRIES, run_id="B")
    assert not got.reused
    assert (dest_b / "job.log").read_text() == "run B\n"
    assert check_stored(dest_b, "job.log", "B")


def test_a_manifest_without_a_run_id_belongs_to_its_directory(
    stored_a: Path, tmp_path: Path
) -> None:
    # Versions that recorded no run id wrote only `<store>/<run id>`: such a copy is
    # the run's whose name its directory has.
    drop_run_id(stored_a)
    assert len(check_stored(stored_a, "", "A")) == 2
    with pytest.raises(StoredArtifactsInvalid, match="made for run 'A', not 'B'"):
        check_stored(stored_a, "", "B")
    reused = reuse_stored(stored_a, "A")
    assert reused is not None
    assert reused.skipped_links == ()
    # Its limit, documented: copied by hand under another run's name, it is that run's.
    shutil.copytree(stored_a, tmp_path / "store" / "C", symlinks=True)
    assert len(check_stored(tmp_path / "store" / "C", "", "C")) == 2


def test_the_worker_never_takes_another_runs_copy(tmp_path: Path) -> None:
    worker, store, _ = policy_worker(tmp_path)
    for run_id in ("e1", "e2"):
        run = ended_run(store, tmp_path, run_id)
        (Path(run.remote_dir) / "job.log").write_text(f"{run_id}\n")
        finish.finish(worker, run, JobStatus.CANCELLED, worker.executor("local"))
        assert store.runs.get(run_id).state is RunState.STOPPED
    root = worker.settings.artifacts_root
    assert retrieve_artifacts(worker, "e1", datetime.now(UTC)).phase is ArtifactsPhase.DONE
    shutil.copytree(root / "e1", root / "e2", symlinks=True)

    # e1's copy in e2's place is not taken for e2's: moved aside, retrieved again.
    done = retrieve_artifacts(worker, "e2", datetime.now(UTC))
    assert done.phase is ArtifactsPhase.DONE, done
    assert (root / "e2" / "job.log").read_text() == "e2\n"
    assert json.loads((root / "e2" / MANIFEST_FILE).read_text())["run_id"] == "e2"
    [aside] = root.glob("e2.damaged-*")
    assert (aside / "job.log").read_text() == "e1\n"
    assert resumable(worker, "e2")[1] == "output/checkpoint-3"

    # Swapped in after e2's retrieval: e2 is not resumed from e1's checkpoint.
    shutil.rmtree(root / "e2")
    shutil.copytree(root / "e1", root / "e2", symlinks=True)
    with pytest.raises(NotResumable, match="made for run 'e1', not 'e2'"):
        resumable(worker, "e2")


def test_links_leading_outside_are_counted_in_the_record(tmp_path: Path) -> None:
    worker, store, _ = policy_worker(tmp_path)
    run = ended_run(store, tmp_path, "e3")
    checkpoint = Path(run.remote_dir) / "output" / "checkpoint-3"
    (checkpoint / "passwd").symlink_to("/etc/passwd")
    (checkpoint / "up").symlink_to("../../../elsewhere")
    (checkpoint / "weights.link").symlink_to("weights.bin")
    finish.finish(worker, run, JobStatus.CANCELLED, worker.executor("local"))
    done = retrieve_artifacts(worker, "e3", datetime.now(UTC))
    assert done.phase is ArtifactsPhase.DONE, done
    assert done.skipped_links == 2
    assert store.runs.get("e3").artifacts == done
    assert "2 link(s) leading outside the run left out" in artifacts_line(done)
    document = json.loads((worker.settings.artifacts_root / "e3" / MANIFEST_FILE).read_text())
    assert document["skipped_links"] == [
        {"path": "output/checkpoint-3/passwd", "target": "/etc/passwd"},
        {"path": "output/checkpoint-3/up", "target": "../../../elsewhere"},
    ]
    assert document["links"] == [
        {"path": "output/checkpoint-3/weights.link", "target": "weights.bin"},
    ]


def test_an_old_record_without_the_count_still_reads() -> None:
    old = Artifacts.model_validate({"phase": "done", "files": 3, "bytes": 10, "path": "/x"})
    assert old.skipped_links == 0
    assert "link" not in artifacts_line(old)
