"""Flower's configuration file for runwarden (`celery flower --conf=<this file>`, as
`runwarden serve --flower` and compose run it). Flower executes it and takes its
module-level names as options.

- `basic_auth`: from the file named by `RUNWARDEN_FLOWER_AUTH_FILE` (`user:password`,
  one line: the secrets directory's `flower-basic-auth`), so the credentials are on no
  command line and in no environment. Without it, a random password nobody knows:
  Flower is never open.
- `tasks_columns`: the tasks table shows each task's ETA and its arguments, which
  runwarden's own messages describe for people (`kwargsrepr`: the run, what the task
  does, the reason), never the signature they carry.
- Flower 2.2 serves `/metrics` (every task's name and counts, the workers' names)
  without asking for the credentials: its handler lacks Tornado's `authenticated`,
  which every other page has. This file gives it that, so no page but `/healthcheck`
  (a bare `OK`) answers without them.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import tornado.web
from flower.views import monitor

_auth_file = os.environ.get("RUNWARDEN_FLOWER_AUTH_FILE", "")
_credentials = Path(_auth_file).read_text(encoding="utf-8").strip() if _auth_file else ""
if ":" not in _credentials:
    _credentials = f"runwarden:{secrets.token_urlsafe(32)}"

basic_auth = [_credentials]

if not getattr(monitor.Metrics.get, "__wrapped__", None):
    monitor.Metrics.get = tornado.web.authenticated(monitor.Metrics.get)
tasks_columns = "name,uuid,state,eta,kwargs,received,started,runtime,worker"
