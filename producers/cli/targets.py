"""`runwarden targets add|ls|rm|keys`: where runs go, and the operator's key pair
that signs them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .common import client, fail, json_option, print_json, print_table, run_op, say, targets_app

if TYPE_CHECKING:
    from schemas import TargetConfig

__all__ = ["targets_add", "targets_keys", "targets_ls", "targets_rm"]


@targets_app.command("add")
def targets_add(
    name: Annotated[
        str,
        typer.Argument(
            metavar="NAME",
            help="The target's name: 1-64 of A-Za-z0-9_.-, starting with a letter or digit.",
        ),
    ],
    workdir: Annotated[
        str,
        typer.Option(
            metavar="DIR",
            help="Absolute directory on the target under which each run gets its run directory.",
        ),
    ],
    ssh: Annotated[
        str | None,
        typer.Option(
            metavar="DEST",
            help="user@host[:port] or an ssh config alias: an SSH target (default: this machine).",
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            metavar="PORT",
            min=1,
            max=65535,
            help="With --ssh: the SSH port (default: the destination's, else ssh's own).",
        ),
    ] = None,
    identity: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="With --ssh: the private key file, on the workers' machine (default: ssh's own).",
        ),
    ] = None,
    known_hosts: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="With --ssh: the known_hosts file the host key "
            "is checked against (default: ssh's own).",
        ),
    ] = None,
    ssh_config: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="With --ssh: an ssh config file (aliases, ProxyJump...) (default: none).",
        ),
    ] = None,
    allow_secret: Annotated[
        list[str] | None,
        typer.Option(
            help="A secret name its runs may receive (repeat for several); none by default.",
            metavar="NAME",
        ),
    ] = None,
    producer: Annotated[
        list[str] | None,
        typer.Option(
            help="A producer (`runwarden producers add`) whose launches, stops, bulk stops "
            "and cancels may act on this target's runs (repeat for several); default: "
            "every producer. The operator's own always may.",
            metavar="NAME",
        ),
    ] = None,
    upload_root: Annotated[
        list[Path] | None,
        typer.Option(
            help="A directory of this machine launches may upload from (repeat for several); "
            "none by default: no upload.",
            metavar="DIR",
        ),
    ] = None,
    run_as: Annotated[
        str | None,
        typer.Option(
            metavar="USER",
            help="The user the jobs run as (docs/security.md: running jobs as another "
            "user): on this machine (default: the worker's; a worker that is root refuses "
            "that unless this says root), or on an SSH target through `sudo -n` by its "
            "login user (default: the login user).",
        ),
    ] = None,
    preemption: Annotated[
        str,
        typer.Option(
            metavar="CLOUD",
            help="Whose preemption notices its runs watch by default: aws, gcp, azure, "
            "auto or off (docs/preemption.md).",
        ),
    ] = "off",
    slurm: Annotated[
        bool,
        typer.Option(
            "--slurm",
            help="A Slurm cluster: jobs are submitted with sbatch from the login node (this "
            "machine, or --ssh) into --workdir, which the compute nodes must share "
            "(docs/slurm.md).",
        ),
    ] = False,
    partition: Annotated[
        str | None,
        typer.Option(metavar="P", help="With --slurm: the partition (default: the cluster's)."),
    ] = None,
    account: Annotated[
        str | None,
        typer.Option(metavar="A", help="With --slurm: the account (default: the user's)."),
    ] = None,
    sbatch_arg: Annotated[
        list[str] | None,
        typer.Option(
            metavar="--NAME[=VALUE]",
            help="With --slurm: one more sbatch option, such as --time=4:00:00 or "
            "--gres=gpu:2 (repeat for several).",
        ),
    ] = None,
    signal_lead: Annotated[
        int,
        typer.Option(
            metavar="S",
            min=1,
            max=65535,
            help="With --slurm: seconds before the time limit at which the job is asked "
            "for a deadline snapshot (sbatch --signal=B:USR1@S).",
        ),
    ] = 300,
    as_json: Annotated[bool, json_option("the target's record")] = False,
) -> None:
    """Add (or replace) a target, signed with the operator's key: only the operator
    defines targets, and says which secrets their runs may receive and which
    directories may be uploaded to them.

    \b
    Examples:
      runwarden targets add here --workdir /data/runs
      runwarden targets add gpu1 --workdir /srv/runs --ssh me@gpu1:2222 --allow-secret HF_TOKEN
      runwarden targets add cluster --slurm --ssh me@login1 --workdir /shared/runs \\
          --partition gpu --sbatch-arg=--time=12:00:00 --sbatch-arg=--gres=gpu:4
    """

    from schemas import SshOptions, TargetConfig
    from schemas.targets import SlurmOptions

    def build() -> TargetConfig:
        options = None
        if ssh is not None:
            options = SshOptions(
                destination=ssh, port=port,
                identity=str(identity.expanduser().absolute()) if identity else None,
                known_hosts=str(known_hosts.expanduser().absolute()) if known_hosts else None,
                ssh_config=str(ssh_config.expanduser().absolute()) if ssh_config else None,
            )  # fmt: skip
        elif any(v is not None for v in (port, identity, known_hosts, ssh_config)):
            raise ValueError("--port, --identity, --known-hosts and --ssh-config need --ssh")
        cluster = None
        if slurm:
            cluster = SlurmOptions(
                partition=partition, account=account, sbatch_args=tuple(sbatch_arg or ()),
                signal_lead_s=signal_lead,
            )  # fmt: skip
        elif partition is not None or account is not None or sbatch_arg or signal_lead != 300:
            raise ValueError("--partition, --account, --sbatch-arg and --signal-lead need --slurm")
        return TargetConfig(
            name=name,
            kind="ssh" if options else "local",
            workdir=workdir,
            ssh=options,
            allow_secrets=tuple(allow_secret or ()),
            producers=tuple(producer) if producer else None,
            upload_roots=tuple(str(p.expanduser().absolute()) for p in upload_root or ()),
            run_as=run_as,
            preemption=preemption,
            slurm=cluster,
        )

    config = run_op(build)
    api = client()
    run_op(lambda: api.add_target(config))
    if as_json:
        print_json(config.model_dump(mode="json"))
        return
    as_user = f", jobs run as {config.run_as}" if config.run_as else ""
    if config.preemption != "off":
        as_user += f", {config.preemption} preemption notices watched"
    kind = f"Slurm through {config.kind} login" if config.slurm else config.kind
    say(f"target {name}: {kind}, {config.workdir}{as_user}")


@targets_app.command("ls")
def targets_ls(as_json: Annotated[bool, json_option("the targets' records")] = False) -> None:
    """List targets, and whether each record is signed by this service's operator key
    (a record written into Redis by anyone else says NO: every worker refuses it; `?`:
    this machine has no operator key to tell).

    \b
    Examples:
      runwarden targets ls
      runwarden targets ls --json
    """
    api = client()
    targets = run_op(api.list_targets)
    verified = run_op(api.verified_targets)
    if as_json:
        print_json(
            [{**t.model_dump(mode="json"), "verified": verified.get(t.name)} for t in targets]
        )
        return
    table = Table("name", "kind", "workdir", "ssh", "run as", "preemption", "signed")
    for t in targets:
        ssh = escape(t.ssh.destination) if t.ssh else ""
        signed = {True: "yes", False: "NO: refused by the workers", None: "?"}[verified.get(t.name)]
        kind = f"slurm ({t.kind} login)" if t.slurm else t.kind
        table.add_row(t.name, kind, escape(t.workdir), ssh, t.run_as or "", t.preemption, signed)
    print_table(table)


@targets_app.command("rm")
def targets_rm(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The target to remove.")],
) -> None:
    """Remove a target.

    \b
    Example:
      runwarden targets rm gpu1
    """
    api = client()
    if not run_op(lambda: api.remove_target(name)):
        fail(f"no target {name!r}", 2)
    say(f"removed target {name}")


@targets_app.command("keys")
def targets_keys(
    as_json: Annotated[bool, json_option("the key files (key_file, public_key_file)")] = False,
) -> None:
    """Make the operator's Ed25519 key pair that signs target records, in this
    machine's secrets directory (once; existing keys are kept; `runwarden serve` makes
    it too), and print where it is: the private key stays where targets are added and
    removed; give the public key file to every worker's secrets directory.
    docs/security.md: targets.

    \b
    Example:
      runwarden targets keys
    """
    from schemas import Settings
    from schemas.target_sig import TARGET_KEY, TARGET_PUBLIC_KEY, ensure_key_pair

    settings = Settings()
    run_op(lambda: ensure_key_pair(settings.secrets))
    key, public = settings.secrets.path / TARGET_KEY, settings.secrets.path / TARGET_PUBLIC_KEY
    if as_json:
        print_json({"key_file": str(key), "public_key_file": str(public)})
        return
    say(f"private key {key}\npublic key  {public}")
