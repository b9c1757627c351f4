"""Everything a person or another program drives runwarden with: the Python API
(`api.py`), the `runwarden` CLI (`cli/`), the web view (`web/`), the metrics endpoint,
the service's health, `runwarden serve` with the embedded Redis, and the demo. (The
policies, which publish snapshot requests too, run on the workers.)

`producers` imports `schemas` and `store`, never `workers`: `runwarden serve` names
the workers' modules only as commands to run (the Celery app, the reaper, and
`workers.deathsig`, through which each child dies with serve: `children.py`). A
producer in another service needs only `celery` and the public task names.
"""
