"""Hybrid recall: exact or approximate vector search on the active generation
(approximate in a large scope: its settled vectors through its HNSW index, merged
with its fresh ones searched exactly; ``store.vectors.vector_indexes``) and
PostgreSQL full-text search each bring ``CANDIDATES_PER_LIST`` candidates, and every
candidate is scored the same way, whichever list found it: the cosine similarity of
its vector to the query's (0 when negative; none for a record without a vector in
the active generation, which is found by text and never scored as zero), plus
``LEXICAL_WEIGHT`` times the square of the share of the query's telling weight its
text holds, plus ``NEIGHBOUR_WEIGHT`` times the best such score of the conversation
turns next to it, read for the ``NEIGHBOUR_CANDIDATES`` best candidates by the rest
of their score only (the others gain nothing). All in one statement (one round trip:
both lists, the scores, the hits' rows and their ``superseded_by``). Each hit says
which lists found it and where each ranked it; its ``relevance`` is its score, at
most 1, whatever its rank, and hits under ``min_relevance`` are left out, so a
query matching nothing returns nothing rather than ``top_k`` unrelated records.

The lexical list reads the query with PostgreSQL's own parser, less English stop
words (configuration ``engram_query``, migration 006), and scores a record by the
rarity of the query words it holds, like BM25's inverse document frequency: a
word's share of all revisions comes from the statistics ANALYZE keeps on the text
index (``pg_stats.most_common_elem_freqs``), so it costs nothing to look up.
Words held by more than ``COMMON_WORD_SHARE`` of the revisions are left out: they
say little about which record is meant, and matching them meant ranking most of
a large scope on every recall (a query made only of such words asks for records
holding all of them). A record must hold ``LEXICAL_COVER`` of the weight of the
words kept, so the index is asked only for the records holding one of the rarest
words, as many of them as a record must hold one of to reach that share (the words
left out weigh less than it): their index entries are the shortest, and the records
holding only commoner words, which could not pass, are never read. At 100,000
records this read 11% of the rows that asking for every telling word did (8,705
against 75,852 over the benchmark's 260 queries), and gave the same lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from pgvector import Vector

from ..errors import InvalidRequestError
from ..limits import CANDIDATES_PER_LIST, LEXICAL_WEIGHT, NEIGHBOUR_CANDIDATES, NEIGHBOUR_WEIGHT
from ..rows import REVISION_COLUMNS, record_from_row
from ..values import Generation, Hit
from ..vectors.vector_indexes import indexed
from ..write.writer import GENERIC_PLANS
from .metadata_filter import MetadataFilter


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
    hnsw: bool = False  # the (generation, scope) pair has an approximate index (settled rows)
    superseded_by: bool = True  # read each hit's ``superseded_by``
    metadata: MetadataFilter | None = None  # only records whose current metadata meets it
    min_relevance: float | None = None  # only hits of this relevance or more (None: all)


@dataclass(frozen=True, slots=True)
class RecallContext:
    generation: Generation | None  # the active one
    scope_id: int | None  # None: the scope was never written
    hnsw: bool  # the scope has an approximate index in the active generation

    def query(
        self,
        text: str | None,
        vector: np.ndarray | None,
        top_k: int,
        *,
        kind: str | None = None,
        include_retracted: bool = False,
        recorded_as_of: datetime | None = None,
        superseded_by: bool = True,
        metadata: MetadataFilter | None = None,
        min_relevance: float | None = None,
    ) -> RecallQuery:
        """A recall in this context's scope (which must exist)."""
        assert self.scope_id is not None
        active = self.generation
        return RecallQuery(
            scope_id=self.scope_id,
            text=text,
            vector=vector,
            generation_id=active.id if active else None,
            dims=active.dims if active else None,
            top_k=top_k,
            kind=kind,
            include_retracted=include_retracted,
            recorded_as_of=recorded_as_of,
            hnsw=self.hnsw,
            superseded_by=superseded_by,
            metadata=metadata,
            min_relevance=min_relevance,
        )


def recall_context(conn: psycopg.Connection[Any], scope_key: str) -> RecallContext:
    """What a recall needs to know before it embeds its query, in one round trip."""
    row = conn.execute(_CONTEXT, (scope_key,)).fetchone()
    assert row is not None  # one row, whatever exists
    generation = Generation(*row[:7]) if row[0] is not None else None
    return RecallContext(generation, row[7], bool(row[8]))


_CONTEXT = """
    SELECT g.id, g.model_id, g.dims, g.status, g.created_at, g.activated_at, g.progress,
           s.id, i.index_name IS NOT NULL
    FROM (SELECT 1) one
    LEFT JOIN engram_generations g ON g.status = 'active'
    LEFT JOIN engram_scopes s ON s.key = %s
    LEFT JOIN engram_vector_indexes i ON i.scope_id = s.id AND i.generation_id = g.id
"""


def recall(conn: psycopg.Connection[Any], q: RecallQuery) -> list[Hit]:
    """The ``top_k`` best hits, best first. An HNSW search expects the connection's
    ``hnsw.*`` settings of ``HNSW_SETTINGS``."""
    statement = _statement(q)
    if statement is None:
        return []
    sql, params = statement
    # The statement is prepared by the connection after a few runs; a generic plan then
    # spares planning it each time (half its time at 1,000 records). Both go in one
    # round trip with the transaction that scopes the setting.
    with conn.pipeline():
        with conn.transaction():
            conn.execute(GENERIC_PLANS)
            conn.execute(_SERIAL)
            found = conn.execute(sql, params)
        rows = found.fetchall()
    return [
        Hit(
            record=record_from_row(row[5:], row[4] or ()),
            score=row[0],
            match=row[1],
            vector_rank=row[2],
            lexical_rank=row[3],
        )
        for row in rows
    ]


# A recall is a few milliseconds of work: parallel workers cost more to start than they
# save. The planner started two for the fresh part of a 100,000-record scope when the
# statistics counted many fresh rows (recall took 37 ms at the median, against 9 for
# the bare HNSW search).
_SERIAL = "SET LOCAL max_parallel_workers_per_gather = 0"


def check_min_relevance(value: object, what: str) -> float | None:
    """A cut-off on ``Hit.relevance``: None, or a number from 0 to 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise InvalidRequestError(f"{what} must be a number from 0 to 1")  # nan too
    return float(value)


def above(hits: list[Hit], min_relevance: float | None) -> list[Hit]:
    """The hits whose relevance reaches the cut-off, in their order."""
    if min_relevance is None:
        return hits
    # A hit exactly at the cut-off (0.8: first in the lexical list only) stays, however
    # it rounds.
    return [h for h in hits if h.relevance >= min_relevance - 1e-9]


# A word held by more than this share of all revisions is too common to tell records
# apart: a query keeps it only when it has no rarer word (module docstring). The
# share is the whole store's, not the scope's: at 0.01, in a store of six LoCoMo
# conversations, the speakers' names and the words of any everyday question were
# left out, and evidence recall@10 was 0.61; at 0.2 (only the likes of stop words
# go) 0.66, and 0.5 scored the same (docs/recall-quality.md).
COMMON_WORD_SHARE = 0.2
# A record enters the lexical list only when it holds this share of what the query's
# telling words weigh. A record holding one rare word of a question worded otherwise
# than the answer is what a vector search finds too (the default embedder is a bag
# of words): fused, each such record counted twice and pushed the answer out of the
# top 5. With the bar at 0.6, hit@5 on the labelled set at 100,000 records went from
# 0.62 to 0.78 (MRR 0.518 to 0.728). On LoCoMo's questions, which share few words
# with the turns that answer them, 0.6 kept out most answers: evidence recall@10
# 0.56 at 0.6, 0.64 at 0.5, 0.66 at 0.3, 0.63 with no bar (docs/recall-quality.md).
LEXICAL_COVER = 0.3
# The share assumed for a word with no statistics yet (a new database): all such
# words weigh the same.
RARE_WORD_SHARE = 0.0001

# Session settings for the scopes' HNSW indexes: a candidate list four times the
# CANDIDATES_PER_LIST taken from it, scanning on when the filters (status, kind,
# expiry) leave too few. With the centred index at 100,000 records, 200 found every
# labelled answer the exact search finds in its top 50 (49 of 60) and 100 found 43:
# hybrid hit@5 / MRR 0.783 / 0.758 (the exact search's) against 0.767 / 0.733.
HNSW_SETTINGS = {"hnsw.ef_search": "200", "hnsw.iterative_scan": "relaxed_order"}
# The candidates the approximate search takes, by their centred distance, for the
# CANDIDATES_PER_LIST nearest by their own (``vector_indexes.indexed``).
APPROXIMATE_CANDIDATES = 2 * CANDIDATES_PER_LIST


def _statement(q: RecallQuery) -> tuple[str, dict[str, Any]] | None:
    where, params, allowed = _filters(q)
    ctes = [allowed] if allowed else []
    params.update(
        scope=q.scope_id,
        n=CANDIDATES_PER_LIST,
        k=q.top_k,
        lw=LEXICAL_WEIGHT,
        floor=q.min_relevance or 0.0,
    )
    source = f"({_AS_OF})" if q.recorded_as_of is not None else _CURRENT
    lists: dict[str, str] = {}
    searched = q.vector is not None and q.generation_id is not None and bool(np.any(q.vector))
    if searched:
        lists["vector"] = _vector_list(q, where, params)
    if q.text is not None:
        params["text"] = q.text
        params.update(common=COMMON_WORD_SHARE, rare=RARE_WORD_SHARE, cover=LEXICAL_COVER)
        ctes.append(_QUERY_WORDS)
        lists["lexical"] = _LEXICAL.format(source=source, where=where)
    elif q.vector is None:
        lists["lexical"] = _LATEST.format(source=source, where=where)  # no query: the newest
    if not lists:
        return None
    ranked = " UNION ALL ".join(
        f"SELECT record_id, revision, rank, '{name}' AS list FROM {name}" for name in lists
    )
    ctes += [f"{name} AS ({sql})" for name, sql in lists.items()]
    base, vectors = _score(q, "v", "x", searched)
    score = "r.base"
    neighbours = ""
    if q.recorded_as_of is None and NEIGHBOUR_WEIGHT > 0:
        # A turn's neighbours: the message before it (``context_of``, migration 018)
        # and the one after, among the records this recall may read; looked up only
        # for the NEIGHBOUR_CANDIDATES best candidates by the rest of their score, the
        # others gaining nothing, whatever top_k: a smaller top_k is always the first
        # hits of a larger one.
        near, near_vectors = _score(q, "n", "nx", searched)
        score = "r.base + %(nw)s * coalesce(nb.near, 0)"
        params.update(nw=NEIGHBOUR_WEIGHT, nn=NEIGHBOUR_CANDIDATES)
        neighbours = f"""LEFT JOIN LATERAL (
                SELECT max({near}) AS near FROM (
                    (SELECT c.* FROM {_CURRENT} c
                     WHERE r.place <= %(nn)s AND c.record_id = r.context_of AND {where})
                    UNION ALL
                    (SELECT c.* FROM {_CURRENT} c
                     WHERE r.place <= %(nn)s AND c.context_of = r.record_id AND {where})
                ) n {near_vectors}
            ) nb ON true"""
    links = _SUPERSEDED_BY if q.superseded_by else "(SELECT NULL::text[] AS ids) sup"
    sql = f"""
        WITH {", ".join(ctes)},
        found AS (
            SELECT record_id, revision,
                   array_agg(list ORDER BY list) AS lists,
                   min(rank) FILTER (WHERE list = 'vector') AS vector_rank,
                   min(rank) FILTER (WHERE list = 'lexical') AS lexical_rank
            FROM ({ranked}) found
            GROUP BY record_id, revision
        ),
        based AS (
            SELECT f.*, v.context_of, {base} AS base
            FROM found f
            -- each candidate's row through the primary key: joined as a set, the generic
            -- plan hashed the whole scope's revisions for some fifty candidates (4 of 14
            -- ms at 10,000 records)
            CROSS JOIN LATERAL (
                SELECT v.record_id, v.revision, v.tsv, v.context_of FROM engram_revisions v
                WHERE v.scope_id = %(scope)s AND v.record_id = f.record_id
                  AND v.revision = f.revision
                LIMIT 1
            ) v
            {vectors}
        ),
        placed AS (
            SELECT b.*, row_number() OVER (
                ORDER BY base DESC, lexical_rank NULLS LAST, vector_rank NULLS LAST,
                         record_id COLLATE "C", revision) AS place
            FROM based b
        ),
        rated AS MATERIALIZED (  -- once per candidate: the sort and the cut read it
            SELECT r.*, {score} AS score
            FROM placed r
            {neighbours}
        ),
        fused AS (
            SELECT * FROM rated
            WHERE score >= %(floor)s * (1 - 1e-9)
            ORDER BY score DESC, lexical_rank NULLS LAST, vector_rank NULLS LAST,
                     record_id COLLATE "C", revision
            LIMIT %(k)s
        )
        SELECT f.score,
               CASE WHEN cardinality(f.lists) = 2 THEN 'hybrid' ELSE f.lists[1] END,
               f.vector_rank, f.lexical_rank, sup.ids, {REVISION_COLUMNS}
        FROM fused f
        JOIN engram_revisions v
          ON v.scope_id = %(scope)s AND v.record_id = f.record_id AND v.revision = f.revision
        JOIN engram_scopes s ON s.id = v.scope_id,
        {links}
        ORDER BY f.score DESC, f.lexical_rank NULLS LAST, f.vector_rank NULLS LAST,
                 f.record_id COLLATE "C", f.revision
    """
    return sql, params


def _score(q: RecallQuery, row: str, vector: str, searched: bool) -> tuple[str, str]:
    """The score of the revision ``row`` (its cosine similarity to the query, plus
    LEXICAL_WEIGHT times the square of its share of the query's telling weight), and
    the join that reads its vector as ``vector``. A record with no vector of this
    revision has no similarity; a zero vector has no direction, and none either."""
    share = _SHARE.format(row=row) if q.text is not None else "0.0"
    if not searched:
        return f"(%(lw)s * ({share})::float8 ^ 2)", ""
    similarity = (
        f"CASE WHEN {vector}.d <> 'NaN'::float8 THEN greatest(1 - {vector}.d, 0) ELSE 0 END"
    )
    join = f"""LEFT JOIN LATERAL (
                SELECT e.embedding <=> %(q)s AS d FROM engram_vectors e
                WHERE e.generation_id = %(gen)s AND e.scope_id = %(scope)s
                  AND e.record_id = {row}.record_id AND e.revision = {row}.revision
            ) {vector} ON true"""
    return f"(({similarity})::float8 + %(lw)s * ({share})::float8 ^ 2)", join


def _filters(q: RecallQuery) -> tuple[str, dict[str, Any], str | None]:
    """Status, expiry, kind and metadata filters on rows ``c`` with
    record_id/status/expires_at/kind, and the ``allowed`` part of the statement the
    metadata filter reads (None without one)."""
    clauses = []
    allowed = None
    params: dict[str, Any] = {"at": q.recorded_as_of}
    if not q.include_retracted:
        clauses.append("c.status = 'active'")
    clauses.append("(c.expires_at IS NULL OR c.expires_at > coalesce(%(at)s, now()))")
    if q.kind is not None:
        clauses.append("c.kind = %(kind)s")
        params["kind"] = q.kind
    if q.metadata is not None and q.metadata.conditions:
        # Both lists take their candidates among these records only, so a filter never
        # leaves a list short of the hits it could have had.
        # The records meeting it are found once (``_statement``'s ``allowed``) and
        # each row is looked up in their hash: asked in place, the planner joined the
        # filter to each list as a nested-loop semi join that read the scope's current
        # revisions again for every candidate (a LangGraph search under a namespace
        # prefix took 112 ms against 16 without). ``IS TRUE`` keeps the test a hashed
        # subplan, never turned into a join: joined, the generic plan walked the
        # records meeting the filter one index probe each, 1.3 times slower than the
        # unfiltered recall when the filter kept every record.
        where, filtered = q.metadata.sql("m.metadata")
        allowed = (
            "allowed AS MATERIALIZED (SELECT m.record_id FROM engram_revisions m"
            f" WHERE m.scope_id = %(scope)s AND m.current AND {where})"
        )
        clauses.append("(c.record_id IN (SELECT record_id FROM allowed)) IS TRUE")
        params.update(filtered)
    return " AND ".join(clauses), params, allowed


# The scope's current revisions.
_CURRENT = "(SELECT * FROM engram_revisions WHERE scope_id = %(scope)s AND current)"

# The revisions current at recorded_as_of: one row per record of the scope.
_AS_OF = """
    SELECT DISTINCT ON (record_id) record_id, revision, status, expires_at, kind, tsv,
           recorded_at
    FROM engram_revisions
    WHERE scope_id = %(scope)s AND recorded_at <= %(at)s
    ORDER BY record_id, revision DESC
"""


def _vector_list(q: RecallQuery, where: str, params: dict[str, Any]) -> str:
    """The nearest CANDIDATES_PER_LIST vectors of the scope, ranked. A zero vector
    in the store has no direction: its distance is NaN and it is not a match."""
    assert q.vector is not None
    params.update(gen=q.generation_id, q=Vector(q.vector))
    if q.recorded_as_of is not None:
        nearest = f"""
            SELECT x.record_id, x.revision, x.embedding <=> %(q)s AS d FROM engram_vectors x
            JOIN ({_AS_OF}) c ON c.record_id = x.record_id AND c.revision = x.revision
            WHERE x.generation_id = %(gen)s AND x.scope_id = %(scope)s AND {where}
            ORDER BY d LIMIT %(n)s
        """
    elif q.hnsw:
        # The settled rows through the partial HNSW index of this (generation, scope),
        # which is used only when its predicate and expression appear literally (these
        # are integers we own; a limit the generic plan cannot see had it read the scope
        # exactly): APPROXIMATE_CANDIDATES of them by their centred distance,
        # ranked then by their full-precision distance; the fresh
        # rows, not in it yet, exactly through their own small index. A record has one
        # row per generation, settled or not, read on one snapshot: the parts cannot
        # overlap, and DISTINCT ON only makes it plain.
        gen, scope, dims = int(q.generation_id or 0), int(q.scope_id), int(q.dims or 0)
        nearest = f"""
            SELECT * FROM (
                SELECT DISTINCT ON (record_id) * FROM ((
                    SELECT c.record_id, c.revision, c.embedding <=> %(q)s AS d
                    FROM engram_vectors c
                    WHERE c.generation_id = {gen} AND c.scope_id = {scope} AND c.settled
                      AND {where}
                    ORDER BY {indexed(gen, dims)} <=> {indexed(gen, dims, "%(q)s::vector")}
                    LIMIT {APPROXIMATE_CANDIDATES}
                ) UNION ALL (
                    SELECT c.record_id, c.revision, c.embedding <=> %(q)s AS d
                    FROM engram_vectors c
                    WHERE c.generation_id = {gen} AND c.scope_id = {scope} AND NOT c.settled
                      AND {where}
                    ORDER BY d LIMIT %(n)s
                )) parts ORDER BY record_id, d
            ) merged ORDER BY d LIMIT %(n)s
        """
    else:
        # Exact search in one scope: the (generation, scope) index and the
        # status/kind/expiry copies on the vector rows, no join.
        nearest = f"""
            SELECT c.record_id, c.revision, c.embedding <=> %(q)s AS d FROM engram_vectors c
            WHERE c.generation_id = %(gen)s AND c.scope_id = %(scope)s AND {where}
            ORDER BY d LIMIT %(n)s
        """
    return f"""
        SELECT record_id, revision, row_number() OVER (ORDER BY d) AS rank
        FROM ({nearest}) nearest WHERE d <> 'NaN'::float8
    """


# The query's words (stop words dropped unless there is nothing else), each with
# its share of all revisions (the most common words' shares are kept by ANALYZE; a
# word not among them is rarer than the rarest that is) and its weight, the
# rarity -ln(share) of an inverse document frequency.
_WORDS = """
    WITH read AS (
        SELECT to_tsvector('engram_text', %(text)s) AS tsv
    ), stats AS MATERIALIZED (  -- once: the arrays are long
        SELECT most_common_elems::text::text[] AS elems, most_common_elem_freqs AS freqs
        FROM pg_stats WHERE schemaname = current_schema()
          AND tablename = 'engram_revisions' AND attname = 'tsv'
    ), shares AS (
        SELECT w.word, plainto_tsquery('simple', w.word) AS query,
               coalesce(s.freqs[array_position(s.elems, w.word)],
                        s.freqs[cardinality(s.elems) + 1]) AS share
        FROM read, unnest(tsvector_to_array(read.tsv)) AS w(word) LEFT JOIN stats s ON true
    )
    SELECT word, query, share, -ln(greatest(coalesce(share, %(rare)s), 1e-9)) AS weight
    FROM shares
"""

# The query's words and what they weigh, as top-level parts of the statement: the
# lexical list reads them, and so does every candidate's share (``_SHARE``). Only
# words held by at most %(common)s of all revisions count (when the query has none,
# all of its words, and a lexical match must then hold all of them).
_QUERY_WORDS = f"""
    words AS ({_WORDS}),
    telling AS (SELECT * FROM words WHERE coalesce(share, 0) <= %(common)s),
    scored AS (SELECT * FROM telling UNION ALL
               SELECT * FROM words WHERE NOT EXISTS (SELECT 1 FROM telling)),
    needed AS (  -- the rarest words, enough that a record holding none cannot pass
        SELECT query FROM (
            SELECT query, sum(weight) OVER () AS total,
                   sum(weight) OVER (ORDER BY weight, word DESC ROWS UNBOUNDED PRECEDING)
                   AS this_and_commoner
            FROM telling
        ) ranked
        WHERE this_and_commoner >= %(cover)s * total * (1 - 1e-9)
    ),
    wanted AS (
        SELECT CASE WHEN EXISTS (SELECT 1 FROM telling)
                    THEN (SELECT engram_tsquery_or(query) FROM needed)
                    ELSE (SELECT engram_tsquery_and(query) FROM words) END AS query,
               (SELECT sum(weight) FROM scored) AS weight
    )
"""

# The share of the query's telling weight a revision ``v`` holds (0 to 1).
_SHARE = """coalesce((SELECT sum(w.weight) FROM scored w WHERE {row}.tsv @@ w.query)
                  / nullif((SELECT weight FROM wanted), 0), 0)"""

# The records that hold at least LEXICAL_COVER of what the query's telling words
# weigh, ranked by the weight they hold; shorter texts first among equals, as BM25's
# length normalisation would have it.
_LEXICAL = """
    SELECT record_id, revision,
           row_number() OVER (ORDER BY score DESC, words, record_id COLLATE "C") AS rank
    FROM (
        SELECT c.record_id, c.revision, length(c.tsv) AS words,
               (SELECT sum(w.weight) FROM scored w WHERE c.tsv @@ w.query) AS score,
               wanted.weight AS wanted
        FROM {source} c, wanted
        WHERE c.tsv @@ wanted.query AND {where}
        ORDER BY score DESC, words, c.record_id COLLATE "C" LIMIT %(n)s
    ) matched
    WHERE score >= %(cover)s * wanted
"""

# No query at all: the most recently written records.
_LATEST = """
    SELECT record_id, revision, row_number() OVER (ORDER BY recorded_at DESC) AS rank
    FROM (SELECT c.record_id, c.revision, c.recorded_at FROM {source} c WHERE {where}
          ORDER BY c.recorded_at DESC LIMIT %(k)s) latest
"""

# The live records of the scope whose links supersede each hit (seed 003).
_SUPERSEDED_BY = """
    LATERAL (
        SELECT array_agg(l.record_id ORDER BY l.record_id) AS ids
        FROM engram_links l
        JOIN engram_records r ON r.scope_id = l.scope_id AND r.id = l.record_id
        WHERE l.scope_id = v.scope_id AND l.target_id = v.record_id
          AND l.relation = 'supersedes' AND r.status = 'active'
          AND (r.expires_at IS NULL OR r.expires_at > now())
    ) sup
"""
