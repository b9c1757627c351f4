"""Everything a person or another program drives runwarden with: the Python API
(`api.py`), the `runwarden` CLI (`cli/`), the web view (`web/`), the metrics endpoint,
the service's health, `runwarden serve` with the embedded Redis, and the demo. (The
policies, which publish snapshot requests too, run on the workers.)

`producers` imports `schemas` and `store`; of `workers`, only `workers.deathsig`
(`runwarden serve` and the embedded Redis start their children through it) and, as
commands to run, the Celery app's module path. A producer in another service needs
only `celery` and the public task names.
"""
