"""`runwarden producers add|ls|rm`: the services allowed to publish to runwarden, each
with its own signing key in this machine's secrets directory (`schemas.auth`)."""

from __future__ import annotations

from typing import Annotated

import typer

from schemas import Settings
from schemas.auth import OPERATOR, WORKER
from schemas.secrets import producer_key_file

from .common import app, fail, out, print_json, run_op

__all__ = ["producers_add", "producers_ls", "producers_rm"]

producers_app = typer.Typer(
    help="Producers: the services allowed to publish, each with its own key.",
    no_args_is_help=True,
)
app.add_typer(producers_app, name="producers")
_PREFIX, _SUFFIX = "producer.", ".key"


@producers_app.command("add")
def producers_add(name: str) -> None:
    """Create the signing key of producer NAME (once; an existing key is kept) and
    print where it is: give that file to the service (it signs every message with
    it), and put the same file in every worker's secrets directory. A stop it asks
    is recorded as asked by NAME.

    Example: runwarden producers add billing"""
    settings = Settings()
    file_name = run_op(lambda: producer_key_file(name))
    _, created = run_op(lambda: settings.secrets.ensure(file_name))
    where = settings.secrets.path / file_name
    out.print(f"{'created' if created else 'kept'} {where}", markup=False, soft_wrap=True)


@producers_app.command("ls")
def producers_ls(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the producers that have a key in this machine's secrets directory."""
    settings = Settings()
    names = [
        n[len(_PREFIX) : -len(_SUFFIX)]
        for n in settings.secrets.names()
        if n.startswith(_PREFIX) and n.endswith(_SUFFIX)
    ]
    if as_json:
        print_json(names)
        return
    for name in names:
        out.print(name, markup=False)


@producers_app.command("rm")
def producers_rm(name: str) -> None:
    """Remove producer NAME's key: its messages are refused from then on (workers read
    their keys again within seconds)."""
    if name in (OPERATOR, WORKER):
        fail(f"{name} is the service's own producer: it cannot be removed", 2)
    settings = Settings()
    file_name = run_op(lambda: producer_key_file(name))
    if not settings.secrets.remove(file_name):
        fail(f"no producer {name!r}", 2)
    out.print(f"removed producer {name}", markup=False)
