"""What holds a run's job, in words for people (`show`, the web view): whether its
processes are contained by a cgroup of their own (`JobId.cgroup`, docs/protocol.md,
"Containment"), and whether its target runs jobs as a user of their own (`run_as`,
docs/security.md). The worker's `doctor` says the same of a target."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas import RunRecord

    from .api import Runwarden

__all__ = ["boundary_lines"]


def boundary_lines(api: Runwarden, run: RunRecord) -> list[tuple[str, str]]:
    """`contained` and `job-user`, each with its text; nothing for a run without a
    job. The job user is read from the target as it is now (none said when it cannot
    be read: removed meanwhile, or the store failed)."""
    from schemas import RunwardenError  # noqa: PLC0415 - the CLI's --help loads no pydantic

    if run.job is None:
        return []
    lines: list[tuple[str, str]] = []
    if run.job.cgroup is not None:
        lines.append(
            ("contained", f"yes: every process of its job is in the cgroup {run.job.cgroup}")
        )
    else:
        why = f"`runwarden doctor {run.target}` says why"
        lines.append(
            ("contained", f"no: its processes are known by their group and mark only ({why})")
        )
    try:
        config = api.store.targets.get(run.target)
    except RunwardenError:
        return lines
    run_as = config.get("run_as")
    if run_as == "root":
        lines.append(("job-user", "root (`--run-as root`): not protected against a hostile job"))
    elif run_as:
        lines.append(("job-user", f"{run_as}: out of reach of the worker's files and environment"))
    else:
        who = "the SSH login user" if config.get("kind") == "ssh" else "the worker's own user"
        text = f"{who}: not protected against a hostile job (docs/security.md; `--run-as`)"
        lines.append(("job-user", text))
    return lines
