"""Approximate vector indexes for the scopes that grew large, on a schedule.

A scope past ``store.limits.LARGE_SCOPE_VECTORS`` vectors in the active
generation is searched through an HNSW index of its own
(``store.vectors.vector_indexes``). Scopes grow by the stream workers' writes, so a jobs
worker looks for such scopes every ``INDEX_EVERY_S`` seconds and builds their
indexes (concurrently: writes go on meanwhile). A reembed builds them too, when
it switches generations.

Writes into such a scope are not inserted into its index: they stay *fresh*
(searched exactly) until a jobs worker settles them into the index in bulk, every
``SETTLE_EVERY_S`` seconds, so that the graph insertions are the job's cost and
not the writer's, and the fresh part recall searches exactly stays small.

On the index schedule it deletes what a retired generation left behind (its
vectors and indexes): a switch deletes them itself once writes are released,
so this finds something only after a process died in between.
"""

from __future__ import annotations

from .context import current
from .errors import content_free

INDEX_EVERY_S = 60.0
SETTLE_EVERY_S = 5.0


@content_free("index-large-scopes")
def index_large_scopes_job() -> list[str]:
    """Build the missing indexes; their names."""
    return current().store.embeddings.index_large_scopes()


@content_free("settle-fresh-vectors")
def settle_fresh_job() -> int:
    """Settle the fresh vectors of the indexed scopes; how many."""
    return current().store.embeddings.settle_fresh()


@content_free("purge-retired-vectors")
def purge_retired_job() -> int:
    """Delete retired generations' vectors and indexes; the vectors deleted."""
    return current().store.embeddings.purge_retired()
