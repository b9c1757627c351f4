"""`python -m producers.cli`: the `runwarden` command line."""

from __future__ import annotations

from . import main

main()
