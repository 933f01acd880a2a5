"""The active records most similar to texts about to be written: what a
reconciliation shows the model. Reads only, outside any write transaction.

For each text: the records with the same text (trimmed, case-insensitive: the
most similar there can be), then its hybrid recall (vector and full text,
fused, as ``Store.recall``), ``top_k`` records per text and no record twice.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import psycopg

from ..read.recall import RecallContext, recall, recall_context
from ..values import Scope
from ..vectors.embedders import (
    Embedder,
    EmbedderResolver,
    check_matches,
    embed_checked,
    embedder_for,
)
from ..write.reconcile import Candidate, normalized

# Same-text look-ups: the full-text index narrows a scope to the records holding
# every word of the text; the comparison itself is made here.
_SAME_WORDS = """
    SELECT record_id, revision, origin, text FROM engram_revisions
    WHERE scope_id = %s AND current AND status = 'active'
      AND (expires_at IS NULL OR expires_at > now())
      AND tsv @@ plainto_tsquery('engram_text', %s)
    ORDER BY record_id LIMIT 100
"""


def similar_records(
    pool: Any,
    scope: Scope,
    texts: Sequence[str],
    embedder: Embedder | EmbedderResolver | None,
    top_k: int,
) -> list[Candidate]:
    with pool.connection() as conn:
        context = recall_context(conn, scope.key)
    if context.scope_id is None:
        return []  # a scope never written holds nothing
    active = context.generation
    vectors: list[Any] = [None] * len(texts)
    if active is not None:
        chosen = embedder_for(embedder, active.model_id, active.dims)
        if chosen is not None:
            check_matches(chosen, active.model_id, active.dims)
        # Embedded with no connection taken: a model may take a while.
        vectors = list(embed_checked(chosen, texts)) if chosen else vectors
    # Reads that need no snapshot of their own. (A generation switched since is seen
    # by the next phase.)
    found: dict[str, Candidate] = {}
    with pool.connection() as conn:
        for text, vector in zip(texts, vectors, strict=True):
            for candidate in _similar_to(conn, context, text, vector, top_k):
                found.setdefault(candidate.id, candidate)
    return list(found.values())


def _similar_to(
    conn: psycopg.Connection[Any],
    context: RecallContext,
    text: str,
    vector: Any,
    top_k: int,
) -> list[Candidate]:
    assert context.scope_id is not None
    hits = recall(conn, context.query(text, vector, top_k, superseded_by=False))
    similar = _same_text(conn, context.scope_id, text) + [
        Candidate(h.record.id, h.record.revision, h.record.origin, h.record.text) for h in hits
    ]
    return list(dict.fromkeys(similar))[:top_k]


def _same_text(conn: psycopg.Connection[Any], scope_id: int, text: str) -> list[Candidate]:
    if not re.search(r"[^\W_]", text):
        return []  # no words to look up by
    rows = conn.execute(_SAME_WORDS, (scope_id, text)).fetchall()
    key = normalized(text)
    return [Candidate(*r) for r in rows if normalized(r[3]) == key]
