"""`workers.retrieval.quota`: the artifact store cannot be filled by a retrieval, on
every executor (`target`: local, shell, ssh against a real sshd). The target's sizes
are counted as the download brings them; a retrieval that would pass the per-run
quota, the store's quota or the free-space reserve is refused before it starts, or
stopped as bytes arrive when the target cannot say, and leaves nothing here while
the target's copy stays as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schemas import RunState
from workers.errors import ArtifactQuotaExceeded, RetrievalError
from workers.executors.digest import Charge
from workers.retrieval import ArtifactLimits, retrieval_plan, retrieve
from workers.retrieval import quota as quota_module
from workers.retrieval import verified as verified_module
from workers.retrieval.quota import Budget, free_bytes, remote_bytes, stored_bytes

from ....conftest import Target
from .conftest import RUN, SNAPSHOT, leftovers, listing

MIB = 1024 * 1024
FREE = 2**40
"""The free space the reserve case gives the artifact store (1 TiB), as it fills."""
UNLIMITED = ArtifactLimits(run_bytes=2**60, total_bytes=2**60, reserve_bytes=0)


def expected_bytes(target: Target, run: Path, state: RunState) -> int:
    entries, exclude = retrieval_plan(state, SNAPSHOT if state is RunState.STOPPED else None)
    digests = target.executor.manifest(str(run), entries, exclude)
    return sum((run / d.path).stat().st_size for d in digests)


def snapshot_of(run: Path) -> dict[str, bytes]:
    """Every regular file of the target's run directory, by path: to see it untouched."""
    return {
        path: (run / path).read_bytes()
        for path in listing(run)
        if (run / path).is_file() and not (run / path).is_symlink()
    }


@pytest.mark.parametrize("state", [RunState.STOPPED, RunState.SUCCEEDED])
def test_the_target_counts_what_the_download_brings(
    target: Target, run: Path, state: RunState
) -> None:
    entries, exclude = retrieval_plan(state, SNAPSHOT if state is RunState.STOPPED else None)
    counted = remote_bytes(target.executor, str(run), entries, exclude)
    assert counted == expected_bytes(target, run, state)
    # Stopped: the checkpoint's weights and optimizer, its hard link in full again;
    # succeeded: the model, no checkpoint.
    assert counted >= (400_000 if state is RunState.STOPPED else 100_000)


def test_a_target_that_cannot_count_answers_none(target: Target, tmp_path: Path) -> None:
    assert remote_bytes(target.executor, str(tmp_path / "gone"), ["job.log"], []) is None


def test_within_the_limits_it_retrieves(target: Target, run: Path, tmp_path: Path) -> None:
    entries, exclude = retrieval_plan(RunState.STOPPED, SNAPSHOT)
    size = expected_bytes(target, run, RunState.STOPPED)
    limits = ArtifactLimits(run_bytes=size, total_bytes=size, reserve_bytes=0)
    got = retrieve(target.executor, str(run), tmp_path / "s" / RUN, entries, exclude,
                   run_id=RUN, limits=limits)  # fmt: skip
    assert got.bytes == size


def refused(
    target: Target, run: Path, tmp_path: Path, limits: ArtifactLimits, match: str
) -> ArtifactQuotaExceeded:
    before = snapshot_of(run)
    entries, exclude = retrieval_plan(RunState.STOPPED, SNAPSHOT)
    store = tmp_path / "store"
    with pytest.raises(ArtifactQuotaExceeded, match=match) as caught:
        retrieve(target.executor, str(run), store / RUN, entries, exclude, run_id=RUN,
                 limits=limits)  # fmt: skip
    assert not caught.value.retryable
    assert isinstance(caught.value, RetrievalError)
    assert not (store / RUN).exists()
    assert leftovers(store) == []
    assert snapshot_of(run) == before  # the target's copy is kept as it was
    assert f"runwarden retrieve {RUN}" in str(caught.value)
    return caught.value


def test_a_run_above_its_quota_is_refused_before_it_starts(
    target: Target, run: Path, tmp_path: Path
) -> None:
    size = expected_bytes(target, run, RunState.STOPPED)
    limits = ArtifactLimits(run_bytes=size - 1, total_bytes=2**60, reserve_bytes=0)
    error = refused(target, run, tmp_path, limits, "RUNWARDEN_ARTIFACT_QUOTA_RUN_BYTES")
    assert "before it started" in str(error)


def test_a_store_above_its_quota_is_refused(target: Target, run: Path, tmp_path: Path) -> None:
    other = tmp_path / "store" / "other-run"
    other.mkdir(parents=True)
    (other / "weights.bin").write_bytes(os.urandom(MIB))
    size = expected_bytes(target, run, RunState.STOPPED)
    limits = ArtifactLimits(run_bytes=2**60, total_bytes=MIB + size - 1, reserve_bytes=0)
    refused(target, run, tmp_path, limits, "RUNWARDEN_ARTIFACT_QUOTA_TOTAL_BYTES")
    assert (other / "weights.bin").stat().st_size == MIB  # the others' untouched


def test_a_reserve_above_the_free_space_is_refused(
    target: Target, run: Path, tmp_path: Path
) -> None:
    (tmp_path / "store").mkdir()
    reserve = free_bytes(tmp_path) + 1024**3
    limits = ArtifactLimits(run_bytes=2**60, total_bytes=2**60, reserve_bytes=reserve)
    refused(target, run, tmp_path, limits, "RUNWARDEN_ARTIFACT_RESERVE_BYTES")


@pytest.mark.parametrize("limit", ["run", "total", "reserve"])
def test_without_the_target_s_count_the_download_is_stopped_as_bytes_arrive(
    target: Target,
    run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    limit: str,
) -> None:
    """A target that cannot count (no GNU find) or lies: the bytes arriving are
    counted, and the download stops before the one chunk that would pass."""
    (run / "output" / "checkpoint-6" / "big.bin").write_bytes(os.urandom(8 * MIB))
    monkeypatch.setattr(verified_module, "remote_bytes", lambda *_: None)
    charged: list[int] = []
    real_charge = Budget.charge

    def spy(self: Budget, size: int) -> None:
        real_charge(self, size)
        charged.append(size)

    monkeypatch.setattr(Budget, "charge", spy)
    store = tmp_path / "store"
    store.mkdir()
    limits = {
        "run": ArtifactLimits(run_bytes=2 * MIB, total_bytes=2**60, reserve_bytes=0),
        "total": ArtifactLimits(run_bytes=2**60, total_bytes=2 * MIB, reserve_bytes=0),
        # Free space is read at every chunk: 2 MiB more than the reserve leaves room.
        "reserve": ArtifactLimits(
            run_bytes=2**60, total_bytes=2**60, reserve_bytes=FREE - 2 * MIB
        ),
    }[limit]
    if limit == "reserve":
        # The filesystem as this download fills it: the real free space is the whole
        # machine's, and other tests write and delete files meanwhile (a full run saw it
        # grow under the download, which then never reached the reserve).
        monkeypatch.setattr(quota_module, "free_bytes", lambda _root: FREE - sum(charged))
    error = refused(target, run, tmp_path, limits, "after .* written")
    assert sum(charged) <= 2 * MIB + 1024 * 1024  # stopped on the way, not at the end
    if limit != "reserve":  # the others write on this disk too: only bounds here
        assert sum(charged) <= 2 * MIB
    assert "before it started" not in str(error)


def test_the_store_counts_its_regular_files(tmp_path: Path) -> None:
    assert stored_bytes(tmp_path / "missing") == 0
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "x").write_bytes(b"x" * 100)
    (tmp_path / "a" / "b" / "y").write_bytes(b"y" * 23)
    (tmp_path / "a" / "link").symlink_to("/etc/passwd")
    assert stored_bytes(tmp_path) == 123


def test_a_charge_that_raises_reaches_the_caller_unchanged(
    target: Target, run: Path, tmp_path: Path
) -> None:
    """The executors' contract for `charge`: whatever it raises stops the download."""

    class Stop(Exception):
        pass

    seen: list[int] = []

    def charge(size: int) -> None:
        seen.append(size)
        if sum(seen) > 100_000:
            raise Stop

    hook: Charge = charge
    with pytest.raises(Stop):
        target.executor.download(str(run), tmp_path / "x", ["output"], [], hook)
    assert 100_000 < sum(seen) < 100_000 + 300_000
