"""`workers.executors.scripts.proof`: the one rule for a proof's checkpoint (with no
symbolic link on its path, a non-empty directory inside the run directory), judged
by its script under dash (`sh`) and `busybox sh` (the `sh` fixture), with hostile
names."""

from __future__ import annotations

import os
from pathlib import Path

from bench.harness.users import WORKER_USER, as_user, shared_dir
from workers.executors import LocalTransport, ScriptExecutor

from .....shells import HOSTILE_DIR, Shell, no_pwned

CKPT = "output/checkpoint-21"


def run_with(sh: Shell, name: str) -> Path:
    run = sh.workdir / name
    run.mkdir(parents=True)
    return run


def real_checkpoint(run: Path, checkpoint: str = CKPT) -> Path:
    path = run / checkpoint
    path.mkdir(parents=True)
    (path / "weights.bin").write_bytes(b"w" * 100)
    return path


def test_every_way_a_checkpoint_can_fail_is_named(sh: Shell, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "checkpoint-21").mkdir(parents=True)
    (elsewhere / "checkpoint-21" / "weights.bin").write_bytes(b"w")
    cases: dict[str, str | None] = {}
    checks: list[tuple[str, str]] = []

    def case(name: str, want: str | None) -> Path:
        run = run_with(sh, name)
        checks.append((str(run), CKPT))
        cases[name] = want
        return run

    real_checkpoint(case("good", None))
    (case("hidden only", None) / CKPT).mkdir(parents=True)
    (sh.workdir / "hidden only" / CKPT / ".state").write_text("x")
    (case("linked", f"checkpoint {CKPT} is a symbolic link") / "output").mkdir()
    (sh.workdir / "linked" / CKPT).symlink_to("/etc")
    parent = case("parent linked", f"checkpoint {CKPT}: output is a symbolic link")
    (parent / "output").symlink_to(elsewhere)
    inside = case("linked inside", f"checkpoint {CKPT} is a symbolic link")
    real_checkpoint(inside, "output/real")
    (inside / CKPT).symlink_to("real")
    dangling = case("dangling", f"checkpoint {CKPT} is a symbolic link")
    (dangling / "output").mkdir()
    (dangling / CKPT).symlink_to("nowhere")
    case("missing", f"checkpoint {CKPT}: output is missing")
    (case("no checkpoint", f"checkpoint {CKPT} is missing") / "output").mkdir()
    afile = case("a file", f"checkpoint {CKPT} is not a directory")
    (afile / "output").mkdir()
    (afile / CKPT).write_text("not a directory")
    (case("empty", f"checkpoint {CKPT} is empty") / CKPT).mkdir(parents=True)
    fifo = case("fifo", f"checkpoint {CKPT} is not a directory")
    (fifo / "output").mkdir()
    os.mkfifo(fifo / CKPT)
    real_checkpoint(case(HOSTILE_DIR, None))
    checks.append((str(sh.workdir / "gone"), CKPT))
    cases["gone"] = "the run directory is missing"
    verdicts = sh.executor.check_checkpoints(checks)
    assert dict(zip(cases, verdicts, strict=True)) == cases
    assert no_pwned(sh.workdir)
    assert sorted(os.listdir(elsewhere)) == ["checkpoint-21"]  # nothing written there


def test_a_directory_that_cannot_be_read_is_refused(sh: Shell) -> None:
    # Root may search any directory: the script runs as an unprivileged user, as the
    # control user of a target whose jobs run as another may.
    with shared_dir("rw-proof-") as workdir:
        run = workdir / "locked"
        run.mkdir()
        run.chmod(0o755)
        path = real_checkpoint(run)
        path.parent.chmod(0o755)
        path.chmod(0)
        executor = ScriptExecutor(
            LocalTransport(shell=(*as_user(WORKER_USER), *sh.shell)), str(workdir)
        )
        [verdict] = executor.check_checkpoints([(str(run), CKPT)])
        path.chmod(0o755)
        [readable] = executor.check_checkpoints([(str(run), CKPT)])
    assert verdict == f"checkpoint {CKPT} cannot be read"
    assert readable is None


def test_no_checks_run_no_script(sh: Shell) -> None:
    assert sh.executor.check_checkpoints([]) == []
