"""The worker side of runwarden: the Celery app (`app.py`) and its tasks (`tasks.py`,
the Celery edge only), the run operations they call (one module per concern, sharing
a `Context`), the verified retrieval (`retrieval/`), the executors that act on
targets (`executors/`), and the job-side files shipped into run directories
(`jobside/`).

`workers` imports `schemas` and `store`, never `producers`.
"""
