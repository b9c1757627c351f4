"""The worker side of runwarden: the Celery app and tasks, the run store, the
executors that act on targets, and the job-side files shipped into run directories.

`workers` imports `schemas`, never `producers`.
"""
