"""Everything that publishes events: the Python API, the CLI, the policies.

`producers` imports `schemas` and never `workers`: a producer in another service
needs only `celery` and the public task names.
"""
