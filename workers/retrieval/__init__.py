"""Retrieval of a run's artifacts into the artifact store, verified against the
target's manifest (docs/architecture.md, "Artifacts"). Independent of the task
queue: the caller decides when to retrieve and whether to retry (see
`RetrievalError.retryable`).

How much may come home ([`ArtifactLimits`], `quota`): at most a quota per run and
one for the whole store, never leaving less free space than a reserve on the store's
filesystem; checked before the download and as it arrives, a retrieval that would
pass one stops (`ArtifactQuotaExceeded`) and leaves nothing.

What comes home ([`retrieval_plan`]): `job.log` always; for a stopped run also
`snapshot.json` and the snapshot's checkpoint; for a succeeded run `output/` without
its intermediate `checkpoint-*` directories.

How ([`retrieve`]): the target's manifest (SHA-256 of every file, computed there)
runs on a thread while the download runs, and the download hashes every file as it
writes it, so verification costs no second pass over the data here. On the target
the manifest must read the files itself (it is the independent account of what the
target holds); it does so while the archive reads them, so mostly from the page
cache, with OpenSSL's SHA-256 where available. The download goes into a fresh
directory beside `dest`, flushed to disk as it arrives; only a download that
matches the manifest exactly (no file missing, differing or extra) is given its
`manifest.json` and renamed to `dest`, atomically. So `dest` either does not exist
or holds a complete, verified copy: a reader never sees a partial retrieval.

Layout of `dest`: the retrieved entries at their paths in the run directory (e.g.
`dest/output/checkpoint-12/...`), plus `manifest.json`:

    {"version": 2, "run_id": "<the run it was made for>",
     "entries": [...], "exclude": [...], "absent": [...],
     "files": [{"path": "job.log", "sha256": "<64 hex>", "size": 1234}, ...],
     "links": [{"path": "output/ck/latest", "target": "model.bin"}, ...],
     "skipped_links": [{"path": "output/ck/data", "target": "/datasets/x"}, ...]}

Symbolic links come as the executors' `download` makes them: those whose targets
stay inside the run directory are kept (`links`, not verified: the manifest lists
regular files); the others are not made, and are listed in `skipped_links`. A
retrieval is only ever reused or resumed from for the run it was made for
(`run_id`); a version 1 manifest has none and counts as made for the run its
directory is named after (those versions only wrote `<artifact store>/<run id>`).

`dest` belongs to retrieval alone (nothing else may write there); its parent holds
the in-progress `.incoming-<dest name>-<random>` directories.

    plan      what comes home for each final state
    verified  `retrieve`: download, manifest beside it, compare, publish
    disk      flushing to disk and walking a downloaded tree
    quota     the per-run and total quotas and the disk reserve of the store
    stored    `manifest.json`, and checks of a stored retrieval

Errors: `workers.errors.RetrievalError` and its subclasses (`retryable` says whether
trying again may help).
"""


from __future__ import annotations

from .plan import CHECKPOINT_EXCLUDE, retrieval_plan
from .quota import ArtifactLimits
from .stored import (
    MANIFEST_FILE,
    Retrieved,
    StoredFile,
    StoredManifest,
    check_stored,
    reuse_stored,
    stored_files,
    stored_manifest,
)
from .verified import retrieve

__all__ = [
    "CHECKPOINT_EXCLUDE",
    "MANIFEST_FILE",
    "ArtifactLimits",
    "Retrieved",
    "StoredFile",
    "StoredManifest",
    "check_stored",
    "retrieval_plan",
    "retrieve",
    "reuse_stored",
    "stored_files",
    "stored_manifest",
]
