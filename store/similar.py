"""The active records most similar to texts about to be written: what a
reconciliation shows the model. Reads only, outside any write transaction.

For each text: the records with the same text (trimmed, case-insensitive: the
most similar there can be), then its hybrid recall (vector and full text,
fused, as ``Store.recall``), ``top_k`` records per text and no record twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import psycopg

from .embedders import Embedder, EmbedderResolver, embed_checked, embedder_for
from .errors import EmbeddingMismatchError
from .model import Scope
from .recall import RecallQuery, lexical_query, recall
from .reconcile import Candidate, normalized

# Same-text look-ups: the full-text index narrows a scope to the records holding
# every word of the text; the comparison itself is made here.
_SAME_WORDS = """
    SELECT record_id, revision, origin, text FROM engram_revisions
    WHERE scope_id = %s AND current AND status = 'active'
      AND (expires_at IS NULL OR expires_at > now())
      AND tsv @@ plainto_tsquery('simple', %s)
    ORDER BY record_id LIMIT 100
"""


_SCOPE_AND_GENERATION = """
    SELECT s.id, g.id, g.model_id, g.dims, i.index_name IS NOT NULL
    FROM engram_scopes s
    LEFT JOIN engram_generations g ON g.status = 'active'
    LEFT JOIN engram_vector_indexes i ON i.scope_id = s.id AND i.generation_id = g.id
    WHERE s.key = %s
"""


def similar_records(
    pool: Any,
    scope: Scope,
    texts: Sequence[str],
    embedder: Embedder | EmbedderResolver | None,
    top_k: int,
) -> list[Candidate]:
    with pool.connection() as conn:
        row = conn.execute(_SCOPE_AND_GENERATION, (scope.key,)).fetchone()
    if row is None:
        return []  # a scope never written holds nothing
    scope_id, generation_id, model_id, dims, hnsw = row
    vectors: list[Any] = [None] * len(texts)
    if generation_id is not None:
        chosen = embedder_for(embedder, model_id, dims)
        if chosen is not None and (chosen.model_id, chosen.dims) != (model_id, dims):
            raise EmbeddingMismatchError(
                f"the active embedding generation is {model_id} ({dims} dimensions), "
                f"not {chosen.model_id} ({chosen.dims})"
            )
        # Embedded with no connection taken: a model may take a while.
        vectors = list(embed_checked(chosen, texts)) if chosen else vectors
    # Reads that need no snapshot of their own; an HNSW search sets its options for one
    # transaction. (A generation switched since is seen by the next phase.)
    found: dict[str, Candidate] = {}
    with pool.connection() as conn, conn.transaction() if hnsw else nullcontext():
        for text, vector in zip(texts, vectors, strict=True):
            for candidate in _similar_to(conn, scope_id, text, vector, row, top_k):
                found.setdefault(candidate.id, candidate)
    return list(found.values())


def _similar_to(
    conn: psycopg.Connection[Any],
    scope_id: int,
    text: str,
    vector: Any,
    row: Sequence[Any],
    top_k: int,
) -> list[Candidate]:
    _, generation_id, _, dims, hnsw = row
    hits = recall(
        conn,
        RecallQuery(
            scope_id=scope_id,
            text=text,
            vector=vector,
            generation_id=generation_id,
            dims=dims,
            top_k=top_k,
            kind=None,
            include_retracted=False,
            recorded_as_of=None,
            hnsw=bool(hnsw),
            superseded_by=False,
        ),
    )
    similar = _same_text(conn, scope_id, text) + [
        Candidate(h.record.id, h.record.revision, h.record.origin, h.record.text) for h in hits
    ]
    return list(dict.fromkeys(similar))[:top_k]


def _same_text(conn: psycopg.Connection[Any], scope_id: int, text: str) -> list[Candidate]:
    if lexical_query(text) is None:
        return []  # no words to look up by
    rows = conn.execute(_SAME_WORDS, (scope_id, text)).fetchall()
    key = normalized(text)
    return [Candidate(*r) for r in rows if normalized(r[3]) == key]
