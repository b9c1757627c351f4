"""`producers.conformance`: the checks judged from observations (verdict), the bounded
reads of a run directory (observe), the options (TrainerCheck) and the loader script
(loadcheck) on real files. The checks against real jobs:
tests/integration/conformance/test_check_trainer.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from producers.conformance import CHECKS, TrainerCheck, observe
from producers.conformance.verdict import Loaded, Observation, Resumed, judge
from schemas.errors import BadRequest

T0 = 1_800_000_000.0


def honest(**changes: object) -> Observation:
    """A run that did everything right: steps 1-5 logged 0.1 s apart, the request at
    step 5's end, the proof of step 6, exit, a resume from step 7."""
    seen = Observation(ranks=2, warmup_steps=3, proof_timeout_s=60, end_timeout_s=30, max_lag=2)
    seen.steps = [(s, T0 + 0.1 * s) for s in range(1, 7)]
    seen.asked_at, seen.request_at = T0 + 0.52, T0 + 0.55
    seen.proof = {"checkpoint": "output/checkpoint-6", "step": 6, "reason": "requested"}
    seen.proof_ns = int((T0 + 0.7) * 1e9)
    seen.state, seen.checkpoint_found = "stopped", True
    seen.final = {"model.pt": (10, int((T0 + 0.65) * 1e9))}
    seen.at_proof = dict(seen.final)
    seen.loaded = Loaded("torch", 1)
    seen.reports = {0: {"step": 6}, 1: {"step": 6}}
    seen.exit_code, seen.exit_at = 0, T0 + 1.2
    seen.resumed = Resumed(first_step=7, begin_first_step=7)
    for name, value in changes.items():
        setattr(seen, name, value)
    return seen


def verdicts(seen: Observation) -> dict[str, tuple[bool, str, str]]:
    checks = judge(seen)
    assert [c.name for c in checks] == list(CHECKS)
    return {c.name: (c.passed, c.value, c.detail) for c in checks}


def failing(seen: Observation) -> list[str]:
    return [name for name, (passed, _, _) in verdicts(seen).items() if not passed]


def test_an_honest_run_passes_every_check_with_its_figures() -> None:
    found = verdicts(honest())
    assert all(passed for passed, _, _ in found.values()), found
    assert found["proof"][1] == "0.15 s"  # from the request file, not the ask
    assert found["lag"][1] == "1 step"
    assert found["end"][1] == "0.50 s"
    assert found["ranks"][1] == "2/2 ranks"


def test_no_warm_up_fails_every_check_with_that_reason() -> None:
    found = verdicts(honest(start_error="no step logged within 5 s"))
    assert [passed for passed, _, _ in found.values()] == [False] * len(CHECKS)
    assert found["proof"][2] == "not judged: the job did not warm up"


@pytest.mark.parametrize(
    ("changes", "failed", "said"),
    [
        ({"proof": None, "proof_ns": None, "state": "cancelled"}, "proof", "no proof within"),
        ({"proof_ns": int((T0 + 90) * 1e9)}, "proof", "later than the proof timeout"),
        ({"steps": []}, "lag", "no step was logged before the request"),
        ({"request_at": T0 + 0.15}, "lag", "more than 2"),
        ({"checkpoint_found": False}, "checkpoint", "is not a directory"),
        ({"final": {}}, "checkpoint", "the checkpoint is empty"),
        ({"final": {"model.pt": (10, int((T0 + 0.8) * 1e9))}}, "checkpoint", "written after"),
        ({"at_proof": {"model.pt": (9, int((T0 + 0.65) * 1e9))}}, "checkpoint", "changed after"),
        ({"loaded": Loaded("torch", 0, "model.pt: EOFError")}, "checkpoint", "does not load"),
        ({"whole": False}, "checkpoint", "too many files"),
        ({"reports": {0: {"step": 6}}}, "ranks", "no stop reported by rank 1"),
        ({"reports": {0: {"step": 6}, 1: {"step": 7}}}, "ranks", "rank 1 at 7"),
        ({"cancelled": True}, "end", "cancelled by runwarden"),
        ({"exit_code": 3}, "end", "exited with 3"),
        ({"exit_at": T0 + 40}, "end", "later than the end timeout"),
        ({"resumed": Resumed(first_step=1, begin_first_step=1)}, "resume", "first step is 1"),
        ({"resumed": Resumed(first_step=1)}, "resume", "does not continue"),
        ({"resumed": Resumed()}, "resume", "logged no step"),
        ({"resumed": None}, "resume", "no checkpoint to resume from"),
    ],
)
def test_each_flaw_fails_its_own_check(changes: dict[str, object], failed: str, said: str) -> None:
    found = verdicts(honest(**changes))
    assert not found[failed][0]
    assert said in found[failed][2]
    if failed not in ("proof",) and "proof" not in changes:
        assert failing(honest(**changes)) == [failed]


def test_one_rank_without_a_report_is_judged_by_its_proof() -> None:
    assert failing(honest(ranks=1, reports={})) == []
    assert failing(honest(ranks=2, reports={})) == ["ranks"]


def test_a_resume_that_logs_every_few_steps_continues_within_that_gap() -> None:
    steps = [(s, T0 + 0.1 * s) for s in range(5, 31, 5)]  # logs every 5th step
    # The checkpoint is step 6: the resumed run's first log may be anywhere up to 11.
    assert failing(honest(steps=steps, resumed=Resumed(first_step=10))) == []
    assert failing(honest(steps=steps, resumed=Resumed(first_step=12))) == ["resume"]


def test_options_are_checked_and_the_ranks_wrap_a_python_command() -> None:
    with pytest.raises(BadRequest, match="empty"):
        TrainerCheck(())
    with pytest.raises(BadRequest, match="ranks"):
        TrainerCheck(("python",), ranks=0)
    with pytest.raises(BadRequest, match="proof_timeout_s"):
        TrainerCheck(("python",), proof_timeout_s=0)
    check = TrainerCheck(("/v/bin/python3.11", "train.py", "--x"), ranks=2)
    assert check.launch_words == [
        "/v/bin/python3.11", "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node=2", "train.py", "--x",
    ]  # fmt: skip
    assert check.interpreter == "/v/bin/python3.11"
    for own in (
        ("torchrun", "--nproc-per-node=2", "t.py"),
        ("python", "-m", "accelerate.commands.launch", "t.py"),
    ):
        assert TrainerCheck(own, ranks=2).launch_words == list(own)
    assert TrainerCheck(("torchrun", "t.py")).interpreter == sys.executable


def test_the_metrics_reader_takes_whole_lines_only_and_skips_garbage(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_bytes(b'{"event": "begin", "time": 1, "first_step": 4}\n{"event": "log", "ti')
    reader = observe.MetricsReader(tmp_path)
    reader.poll()
    assert reader.begin == {"event": "begin", "time": 1, "first_step": 4}
    assert reader.steps == []
    with metrics.open("ab") as file:
        file.write(
            b'me": 2.5, "step": 4}\nnot json\n[1]\n{"event": "log", "step": true, "time": 3}\n'
        )
        file.write(b'{"event": "log", "step": 5, "time": 3}\n')
    reader.read_all()
    assert reader.steps == [(4, 2.5), (5, 3.0)]
    assert reader.last_step == 5


def test_reads_open_no_link_and_no_fifo(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"step": 1}')
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(secret)
    (run / "rank-0.json").symlink_to(secret)
    os.mkfifo(run / "rank-1.json")
    (run / "ckpt").mkdir()
    (run / "ckpt" / "link").symlink_to(secret)
    (run / "ckpt" / "a.bin").write_bytes(b"x" * 3)
    reader = observe.MetricsReader(run)
    reader.read_all()
    assert reader.steps == []
    assert reader.begin is None
    assert observe.rank_reports(run, 2) == {}
    files, whole = observe.listing(run / "ckpt")
    assert list(files) == ["a.bin"]
    assert files["a.bin"][0] == 3
    assert whole
    assert observe.read_json(run / "rank-1.json") is None
    assert observe.mtime(run / "rank-0.json") is None
    assert not observe.inside("../x")
    assert not observe.inside("/etc")
    assert observe.inside("output/checkpoint-3")


def test_a_huge_report_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "rank-0.json").write_text(json.dumps({"step": 1, "pad": "x" * observe.MAX_READ}))
    assert observe.rank_reports(tmp_path, 1) == {}


def test_the_loader_tells_a_torch_checkpoint_that_loads_from_one_that_is_cut(
    tmp_path: Path,
) -> None:
    import torch  # the dev extra's; only this test needs it

    good = tmp_path / "good"
    good.mkdir()
    torch.save({"w": torch.ones(3)}, good / "model.pt")
    (good / "trainer_state.json").write_text("{}")
    script = Path(observe.__file__).with_name("loadcheck.py")

    def load(directory: Path) -> dict[str, object]:
        done = subprocess.run([sys.executable, str(script), str(directory)], capture_output=True,
                              check=True, timeout=120)  # fmt: skip
        answer: dict[str, object] = json.loads(done.stdout)
        return answer

    assert load(good) == {"framework": "hugging-face", "files": 2, "error": None}
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "model.pt").write_bytes((good / "model.pt").read_bytes()[:40])
    answer = load(cut)
    assert answer["framework"] == "unknown"
    assert str(answer["error"]).startswith("model.pt: ")
