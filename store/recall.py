"""Hybrid recall: exact or approximate vector search on the active generation,
PostgreSQL full-text search (simple configuration), fused by reciprocal rank
fusion (k = 60). Records without a vector in the active generation never
enter the vector list: they are found by text, never scored as zero.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from pgvector import Vector

from .limits import CANDIDATES_PER_LIST, RRF_K
from .model import Hit, Match
from .rows import REVISION_COLUMNS, record_from_row, superseded_by


@dataclass(frozen=True, slots=True)
class RecallQuery:
    scope_id: int
    text: str | None
    vector: np.ndarray | None
    generation_id: int | None
    dims: int | None
    top_k: int
    kind: str | None
    include_retracted: bool
    recorded_as_of: datetime | None
    hnsw: bool = False  # the (generation, scope) pair has an approximate index
    superseded_by: bool = True  # read each hit's ``superseded_by`` (one more query)


def lexical_query(text: str) -> str | None:
    """Any of the query's words (OR), as a tsquery for the simple configuration."""
    words = sorted(set(re.findall(r"[^\W_]+", text.lower())))
    return " | ".join(words) if words else None


def recall(conn: psycopg.Connection[Any], q: RecallQuery) -> list[Hit]:
    vector_ids: list[tuple[str, int]] = []
    lexical_ids: list[tuple[str, int]] = []
    if q.vector is not None and q.generation_id is not None and bool(np.any(q.vector)):
        vector_ids = _vector_candidates(conn, q)
    tsq = lexical_query(q.text) if q.text else None
    if tsq:
        lexical_ids = _lexical_candidates(conn, q, tsq)
    if q.text is None and q.vector is None:
        lexical_ids = _latest(conn, q)
    return _fuse(conn, q, vector_ids, lexical_ids)


def _filters(q: RecallQuery, alias: str) -> tuple[str, dict[str, Any]]:
    """Status, expiry and kind filters on rows that have status/expires_at/kind."""
    clauses = []
    params: dict[str, Any] = {"at": q.recorded_as_of}
    if not q.include_retracted:
        clauses.append(f"{alias}.status = 'active'")
    clauses.append(f"({alias}.expires_at IS NULL OR {alias}.expires_at > coalesce(%(at)s, now()))")
    if q.kind is not None:
        clauses.append(f"{alias}.kind = %(kind)s")
        params["kind"] = q.kind
    return " AND ".join(clauses), params


# The revisions current at recorded_as_of (or now): one row per record of the scope.
_AS_OF = """
    SELECT DISTINCT ON (record_id) record_id, revision, status, expires_at, kind, tsv
    FROM engram_revisions
    WHERE scope_id = %(scope)s AND recorded_at <= %(at)s
    ORDER BY record_id, revision DESC
"""


def _vector_candidates(conn: psycopg.Connection[Any], q: RecallQuery) -> list[tuple[str, int]]:
    assert q.vector is not None
    params: dict[str, Any] = {
        "scope": q.scope_id,
        "gen": q.generation_id,
        "q": Vector(q.vector),
        "n": CANDIDATES_PER_LIST,
        "at": q.recorded_as_of,
    }
    if q.recorded_as_of is not None:
        where, more = _filters(q, "c")
        sql = f"""
            WITH c AS ({_AS_OF})
            SELECT x.record_id, x.revision, x.embedding <=> %(q)s FROM engram_vectors x
            JOIN c ON c.record_id = x.record_id AND c.revision = x.revision
            WHERE x.generation_id = %(gen)s AND x.scope_id = %(scope)s AND {where}
            ORDER BY 3 LIMIT %(n)s
        """
    elif q.hnsw:
        # The partial HNSW index of this (generation, scope) is used only when its
        # predicate and expression appear literally; these are integers we own.
        gen, scope, dims = int(q.generation_id or 0), int(q.scope_id), int(q.dims or 0)
        where, more = _filters(q, "x")
        conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        conn.execute("SET LOCAL hnsw.ef_search = 100")
        sql = f"""
            SELECT x.record_id, x.revision, x.embedding::vector({dims}) <=> %(q)s::vector({dims})
            FROM engram_vectors x
            WHERE x.generation_id = {gen} AND x.scope_id = {scope} AND {where}
            ORDER BY 3 LIMIT %(n)s
        """
    else:
        # Exact search in one scope: the (generation, scope) index and the
        # status/kind/expiry copies on the vector rows, no join.
        where, more = _filters(q, "x")
        sql = f"""
            SELECT x.record_id, x.revision, x.embedding <=> %(q)s FROM engram_vectors x
            WHERE x.generation_id = %(gen)s AND x.scope_id = %(scope)s AND {where}
            ORDER BY 3 LIMIT %(n)s
        """
    rows = conn.execute(sql, {**params, **more}).fetchall()
    # A zero vector has no direction: its distance is NaN and it is not a match.
    ranked = sorted((r for r in rows if not math.isnan(r[2])), key=lambda r: r[2])
    return [(r[0], r[1]) for r in ranked]


def _lexical_candidates(
    conn: psycopg.Connection[Any], q: RecallQuery, tsq: str
) -> list[tuple[str, int]]:
    where, params = _filters(q, "c")
    params.update(scope=q.scope_id, tsq=tsq, n=CANDIDATES_PER_LIST)
    if q.recorded_as_of is not None:
        source = f"({_AS_OF}) c"
    else:
        source = "(SELECT * FROM engram_revisions WHERE scope_id = %(scope)s AND current) c"
    sql = f"""
        SELECT c.record_id, c.revision FROM {source}, to_tsquery('simple', %(tsq)s) query
        WHERE c.tsv @@ query AND {where}
        ORDER BY ts_rank(c.tsv, query) DESC, c.record_id LIMIT %(n)s
    """
    return [(r[0], r[1]) for r in conn.execute(sql, params).fetchall()]


def _latest(conn: psycopg.Connection[Any], q: RecallQuery) -> list[tuple[str, int]]:
    """No query text: the most recently recorded records."""
    where, params = _filters(q, "c")
    params.update(scope=q.scope_id, n=q.top_k)
    if q.recorded_as_of is not None:
        sql = f"SELECT c.record_id, c.revision FROM ({_AS_OF}) c WHERE {where}"
    else:
        sql = f"""SELECT c.id, c.revision FROM engram_records c
                  WHERE c.scope_id = %(scope)s AND {where}
                  ORDER BY c.updated_at DESC LIMIT %(n)s"""
    return [(r[0], r[1]) for r in conn.execute(sql, params).fetchall()]


def _fuse(
    conn: psycopg.Connection[Any],
    q: RecallQuery,
    vector_ids: list[tuple[str, int]],
    lexical_ids: list[tuple[str, int]],
) -> list[Hit]:
    scores: dict[tuple[str, int], float] = {}
    found: dict[tuple[str, int], set[str]] = {}
    for name, ranked in (("vector", vector_ids), ("lexical", lexical_ids)):
        for rank, key in enumerate(ranked, start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (RRF_K + rank)
            found.setdefault(key, set()).add(name)
    best = sorted(scores, key=lambda k: (-scores[k], k))[: q.top_k]
    if not best:
        return []
    rows = conn.execute(
        f"""SELECT {REVISION_COLUMNS} FROM engram_revisions v
            JOIN engram_scopes s ON s.id = v.scope_id
            WHERE (v.record_id, v.revision) IN (SELECT * FROM unnest(%s::text[], %s::int[]))""",
        ([k[0] for k in best], [k[1] for k in best]),
    ).fetchall()
    by_key = {(r[0], r[1]): r for r in rows}
    links = superseded_by(conn, [q.scope_id], [k[0] for k in best]) if q.superseded_by else {}
    hits = []
    for key in best:
        row = by_key.get(key)
        if row is None:
            continue  # forgotten between the two queries
        names = found[key]
        match: Match = (
            "hybrid" if len(names) == 2 else ("vector" if "vector" in names else "lexical")
        )
        hits.append(
            Hit(record=record_from_row(row, links.get(key[0], ())), score=scores[key], match=match)
        )
    return hits
