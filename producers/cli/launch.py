"""The commands that start runs: `launch`, `resume`."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from schemas.defaults import DEFAULT_MAX_PREEMPTIONS

from .common import (
    app,
    checked_run_id,
    client,
    fail,
    json_option,
    print_run,
    run_op,
)

if TYPE_CHECKING:
    from schemas import RunRecord
    from schemas.chain import OnPreempt
    from schemas.events import LaunchSpec

    from ..api import Runwarden

__all__ = ["launch", "resume"]


_KEY_HELP = (
    "Idempotency key, 1-128 of A-Za-z0-9_.- (default: a random one): a launch with a "
    "used key returns that run instead of starting another."
)


@app.command(context_settings={"allow_interspersed_args": False}, options_metavar="[OPTIONS] --")
def launch(
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="CMD",
            help="The job's command and its arguments, after `--`: run in the run "
            "directory by the target's POSIX shell, each word quoted.",
            show_default=False,
        ),
    ] = None,
    target: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="The target to run on (`runwarden targets ls`); required.",
            show_default=False,
        ),
    ] = "",
    name: Annotated[
        str,
        typer.Option(
            metavar="TEXT",
            help="A name for people; its slug goes into the run id (default: none).",
            show_default=False,
        ),
    ] = "",
    label: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=VALUE",
            help="A label kept on the run, by which `stop --label` selects it (repeat "
            "for several, at most 16; keys 1-63 of A-Za-z0-9_.-, values 1-63 of "
            "A-Za-z0-9_.:+-).",
            show_default=False,
        ),
    ] = None,
    upload: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="A directory of this machine copied into the run "
            "directory first; it must be under one of the target's upload roots "
            "(default: no upload).",
        ),
    ] = None,
    skip: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME", help="A top-level entry of --upload left out (repeat for several)."
        ),
    ] = None,
    secret: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME",
            help="A secret the job gets as environment variable "
            "NAME, read from the worker's secrets directory; the target must allow "
            "it (repeat for several).",
        ),
    ] = None,
    max_hours: Annotated[
        float | None,
        typer.Option(
            metavar="HOURS",
            help="Running time allowed, in hours: a `deadline` "
            "snapshot is asked 15 min before it (RUNWARDEN_DEADLINE_LEAD_S) "
            "(default: no limit).",
        ),
    ] = None,
    max_cost_usd: Annotated[
        float | None,
        typer.Option(
            metavar="USD",
            help="Cost allowed, in US dollars: a `cost` snapshot "
            "is asked at 95% of it (RUNWARDEN_COST_FRACTION); needs "
            "--usd-per-hour (default: no limit).",
        ),
    ] = None,
    usd_per_hour: Annotated[
        float | None,
        typer.Option(
            metavar="USD",
            help="What the target costs, in US dollars per hour "
            "of running, for --max-cost-usd (default: none).",
        ),
    ] = None,
    disk_policy: Annotated[
        bool,
        typer.Option(
            "--disk-policy/--no-disk-policy",
            help="Ask a `disk` snapshot when "
            "the run directory's filesystem fills up (default: on).",
            show_default=False,
        ),
    ] = True,
    proof_timeout: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            help="How long each stop of the run waits for the job's proof before it "
            "cancels the job, in seconds (default: learned from how long the run's saves "
            "take, else RUNWARDEN_PROOF_TIMEOUT_S).",
        ),
    ] = None,
    end_timeout: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            help="How long each stop of the run waits for the job's end after its "
            "proof, in seconds (default: RUNWARDEN_END_TIMEOUT_S).",
        ),
    ] = None,
    resume_from: Annotated[
        str | None,
        typer.Option(
            metavar="RUN_ID",
            help="A stopped run to continue from its checkpoint (as `runwarden resume`).",
        ),
    ] = None,
    snapshots: Annotated[
        bool,
        typer.Option(
            "--snapshots/--no-snapshots",
            help="Whether the job reads snapshot "
            "requests (its plugin); with --no-snapshots a stop is refused and only "
            "a cancel ends it (default: on).",
            show_default=False,
        ),
    ] = True,
    key: Annotated[str | None, typer.Option(metavar="KEY", help=_KEY_HELP)] = None,
    on_preempt: Annotated[
        str,
        typer.Option(
            help="stop (default): a preempted run stays stopped; resume: it is resumed "
            "from its verified checkpoint on the first available of --targets.",
            metavar="stop|resume",
            show_default=False,
        ),
    ] = "stop",
    targets: Annotated[
        str | None,
        typer.Option(
            help="With --on-preempt resume: where to resume, in order, comma-separated "
            "(default: the run's own target; the one just preempted is tried last).",
            metavar="A,B,...",
            show_default=False,
        ),
    ] = None,
    max_preemptions: Annotated[
        int | None,
        typer.Option(
            help="With --on-preempt resume: preemptions of the chain that are resumed "
            f"(default {DEFAULT_MAX_PREEMPTIONS}).",
            min=1,
            metavar="N",
            show_default=False,
        ),
    ] = None,
    preemption: Annotated[
        str | None,
        typer.Option(
            metavar="CLOUD",
            help="Watch the cloud's preemption notices: aws, gcp, azure, auto or off "
            "(default: the target's setting).",
            show_default=False,
        ),
    ] = None,
    wait_for_all: Annotated[
        bool,
        typer.Option(
            "--wait-for-all",
            help="The run stays running until its last process ends (cancel works "
            "until then). Default: when the job's main process ends, the processes it "
            "left (its process group, every process with its RUNWARDEN_MARK) get "
            "SIGTERM, SIGKILL 10 s later, and the run's message says how many; what "
            "is still in its cgroup, where it has one, is killed then.",
            show_default=False,
        ),
    ] = False,
    as_json: Annotated[bool, json_option("the run's record (in place of its id)")] = False,
) -> None:
    """Launch a job on a target; prints its run id once the job runs. The options
    come before `--`, the job's command after it:

    \b
      runwarden launch --target NAME [options] -- CMD [ARGS]...

    \b
    Examples:
      runwarden launch --target here -- python train.py --lr 3e-4
      runwarden launch --target gpu1 --name gpt --max-hours 24 --upload ./project -- python train.py
      runwarden launch --target gpu1 --name gpt-lr3 --label sweep=lr -- python train.py --lr 3e-4
    """
    if not command:
        fail("launch needs a command after --", 2)
    if not target:
        fail("launch needs --target", 2)
    if max_cost_usd is not None and usd_per_hour is None:
        fail("--max-cost-usd needs --usd-per-hour", 2)
    if on_preempt not in ("stop", "resume"):
        fail(f"invalid --on-preempt {on_preempt!r}: use stop or resume", 2)
    if on_preempt == "stop" and (targets is not None or max_preemptions is not None):
        fail("--targets and --max-preemptions go with --on-preempt resume", 2)
    from schemas import RunLimits
    from schemas.budget import StopTimeouts
    from schemas.chain import OnPreempt
    from schemas.events import LaunchSpec
    from schemas.idempotency import new_launch_key
    from schemas.labels import parse_labels

    labels = run_op(lambda: parse_labels(label or ()))

    def plan() -> OnPreempt | None:
        if on_preempt == "stop":
            return None
        names = tuple(t.strip() for t in (targets or "").split(",") if t.strip())
        if targets is not None and not names:
            fail("--targets names no target", 2)
        return OnPreempt(targets=names, max_preemptions=max_preemptions or DEFAULT_MAX_PREEMPTIONS)

    def build() -> LaunchSpec:
        return LaunchSpec(
            target=target, command=shlex.join(command), name=name, labels=labels,
            upload=upload.expanduser().absolute() if upload else None,
            skip=tuple(skip or ()), secrets=tuple(secret or ()),
            limits=RunLimits(max_hours=max_hours, max_cost_usd=max_cost_usd,
                             usd_per_hour=usd_per_hour, disk=disk_policy),
            resume_from=resume_from, snapshots=snapshots,
            key=key or new_launch_key(), on_preempt=plan(), preemption=preemption,
            wait_for_all=wait_for_all,
            timeouts=StopTimeouts(proof_timeout_s=proof_timeout, end_timeout_s=end_timeout),
        )  # fmt: skip

    spec = run_op(build)
    api = client()
    run = run_op(lambda: _launch_once(api, spec))
    print_run(run, as_json, run.id)


def _launch_once(api: Runwarden, spec: LaunchSpec) -> RunRecord:
    """`api.launch(spec)`, waiting for the upload (a resume: a whole checkpoint) to
    arrive; a launch that fails or is not answered in time names its key, so that the
    same launch given again (`--key`) finds its run instead of starting another job."""
    from ..api import OperationFailed

    try:
        return api.launch(spec, wait_s=api.settings.launch_max_runtime_s + 60)
    except OperationFailed as error:
        hint = f"launch key {spec.key}: launched again with --key {spec.key}, no second job"
        raise OperationFailed(f"{error} ({hint})") from error


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The stopped run.")],
    target: Annotated[
        str | None,
        typer.Option(metavar="NAME", help="Another target to run on (default: the run's own)."),
    ] = None,
    command: Annotated[
        str | None,
        typer.Option(
            metavar="SHELL_LINE",
            help="Another job command, one shell line "
            "(default: the run's own); an adopted run needs one.",
        ),
    ] = None,
    key: Annotated[str | None, typer.Option(metavar="KEY", help=_KEY_HELP)] = None,
    as_json: Annotated[bool, json_option("the new run's record (in place of its id)")] = False,
) -> None:
    """Continue a stopped run from its checkpoint (as launch --resume-from): the
    same command, upload, secrets and limits; the step count goes on. Prints the new
    run's id.

    \b
    Examples:
      runwarden resume 20260601-020000-kqzmx-gpt
      runwarden resume 20260601-020000-kqzmx-gpt --target gpu2
    """
    from schemas.events import LaunchSpec
    from schemas.idempotency import new_launch_key

    api = client()
    source = checked_run_id(run_id)
    spec = run_op(lambda: api.resume_spec(source, target=target, command=command))
    spec = run_op(lambda: LaunchSpec.model_validate({**dict(spec), "key": key or new_launch_key()}))
    new = run_op(lambda: _launch_once(api, spec))
    print_run(new, as_json, new.id)
