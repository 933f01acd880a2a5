"""engram's background jobs on RQ: re-embedding, retention, redaction of forgotten records.

``engram jobs`` runs them (``runner``); the dashboard lists them (``web.rqjobs``). What
the dashboard, the HTTP API and the command line call:

>>> started = reembed.start(store, client, registry, "minilm", requested_by="ada")
>>> status = reembed.progress(store)        # ReembedStatus: .progress.done, .total, ...
>>> report = prune.run(store, client, settings.retention, ["history"])
>>> job_id = prune.enqueue(client, "receipts")

``client`` is a Redis client with bytes replies (``worker.runtime.connect_redis``);
``registry`` a ``store.vectors.registry.EmbedderRegistry``; ``settings`` a ``JobsSettings``.
Nothing here connects at import time.
"""

from . import keys, prune, reembed
from .settings import JobsSettings

__all__ = ["JobsSettings", "keys", "prune", "reembed"]
