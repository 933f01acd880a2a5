"""Approximate (HNSW) indexes for the scopes too large for an exact vector search.

An ordinary scope is searched exactly, reading only its own rows of the active
generation; keeping an HNSW index current on the write path would cost more
than it saves. A scope that grows past ``LARGE_SCOPE_VECTORS`` gets a partial
HNSW index of its own, for that (generation, scope), built concurrently.
"""

from __future__ import annotations

import logging
from typing import Any

from ..limits import LARGE_SCOPE_VECTORS

log = logging.getLogger(__name__)


def index_large_scopes(pool: Any, threshold: int = LARGE_SCOPE_VECTORS) -> list[str]:
    """Give every scope with ``threshold`` or more vectors in the active generation its
    own HNSW index; smaller scopes stay on the exact (generation, scope) search."""
    created = []
    with pool.connection() as conn:
        autocommit = conn.autocommit  # CREATE INDEX CONCURRENTLY runs outside a transaction
        conn.autocommit = True
        try:
            rows = conn.execute(
                """
                SELECT g.id, g.dims, x.scope_id FROM engram_generations g
                JOIN engram_vectors x ON x.generation_id = g.id
                WHERE g.status = 'active'
                  AND NOT EXISTS (SELECT 1 FROM engram_vector_indexes i
                                  WHERE i.generation_id = g.id AND i.scope_id = x.scope_id)
                GROUP BY g.id, g.dims, x.scope_id HAVING count(*) >= %s
                """,
                (threshold,),
            ).fetchall()
            for gen, dims, scope in rows:
                name = f"engram_vectors_hnsw_g{int(gen)}_s{int(scope)}"
                conn.execute(
                    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON engram_vectors"
                    f" USING hnsw ((embedding::vector({int(dims)})) vector_cosine_ops)"
                    f" WHERE generation_id = {int(gen)} AND scope_id = {int(scope)}"
                )
                conn.execute(
                    "INSERT INTO engram_vector_indexes (generation_id, scope_id, index_name)"
                    " VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                    (gen, scope, name),
                )
                log.info("approximate index built", extra={"generation": gen, "scope": scope})
                created.append(name)
        finally:
            conn.autocommit = autocommit  # the pool's connections are autocommit
    return created
