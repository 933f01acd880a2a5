"""Approximate (HNSW) indexes for the scopes too large for an exact vector search,
kept off the write path.

A vector row is written *fresh* (``settled`` false): it is in no approximate index,
so a write pays no graph insertion. An ordinary scope is searched exactly. A scope
that grows past ``LARGE_SCOPE_VECTORS`` gets a partial HNSW index of its own, on the
*settled* rows of that (generation, scope): ``index_large_scopes`` marks the scope's
rows settled and builds the index concurrently; from then on ``settle_fresh`` marks
the rows written since settled in batches, each insertion into the graph paid by
that job, not by the writer. Recall searches the settled rows through the index and
the fresh ones exactly (``store.read.recall``), so a row is found in exactly one of
the two parts whatever the jobs have done so far.

Building off the write path is what affords the larger graph (``HNSW_M``,
``HNSW_EF_CONSTRUCTION``): with pgvector's defaults the default embedder's vectors
index badly (docs/benchmarks.md).

Each scope is worked on under a session advisory lock, so two jobs never settle or
build the same scope at once. Every step can be killed and run again: a batch
settles in its own transaction, a build killed midway leaves an invalid index that
the next run drops and builds again, and the index is registered (recall uses it)
only once it is valid.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Any

import psycopg

from ..limits import LARGE_SCOPE_VECTORS

log = logging.getLogger(__name__)

# Graph parameters of the scopes' indexes (pgvector's defaults are 16 and 64).
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 200


def indexed(generation_id: int, dims: int, vector: str = "embedding") -> str:
    """What a scope's index holds, spelled as recall must spell it (for a query vector,
    ``vector`` is its parameter) for the index to be used: each vector less its
    generation's mean direction, in half precision.

    The default embedder's vectors crowd into a cone (cosine 0.38 to their mean at
    100,000 sentences): a graph built on them left records unlike the rest, which are
    what a labelled question asks for, out of reach (at 10,000 records, 6 of 56 answers
    ranked first by the exact search were not found at ef_search 200; centred, none was
    missed at ef_search 100). Half precision finds the same share as full precision for
    a third less build time (docs/benchmarks.md)."""
    return f"(engram_centred_g{int(generation_id)}({vector}))::halfvec({int(dims)})"


# Fresh rows settled per transaction: each settled row is a graph insertion, and the
# batch's row locks are held until it commits (a write updating one of them waits).
SETTLE_BATCH = 500
# The most rows a settling run takes from one scope (about 20-90 s of graph insertions
# at 100,000 vectors): under a steady write load its tail never empties, and a run
# that never ends would hold the jobs worker and the scope's lock for good.
SETTLE_RUN_ROWS = 10_000
# A run that settled this many rows refreshes the table's statistics: the planner
# must know the fresh rows are few to search them through their own index (stale
# statistics counting a settled scope as fresh had it scan the whole table).
ANALYZE_AFTER_ROWS = 1_000
# The memory an index build may use (``build_memory_mb``): a graph that does not fit in
# it is built one insertion at a time once full, as slowly as ``settle_fresh`` extends
# it (pgvector says so in a notice, which the build logs as a warning).
BUILD_MEMORY_FLOOR_MB = 512
BUILD_MEMORY_CAP_MB = 4096  # a graph of about two million vectors of 256 dimensions
_LOCK_CLASS = 0x656E7669  # "envi": the first key of the per-scope advisory locks


def build_memory_mb(vectors: int, dims: int) -> int:
    """The ``maintenance_work_mem`` (MB) that holds the graph of ``vectors`` vectors of
    ``dims`` dimensions while it is built, a quarter to spare: each element holds its
    half-precision vector and, on the ground layer, ``2 * HNSW_M`` neighbours of 16
    bytes each (about 1.8 kB at 256 dimensions), within the floor and the cap."""
    element = 2 * int(dims) + 2 * HNSW_M * 16 + 256
    needed = int(vectors) * element * 5 // 4 // 2**20
    return max(BUILD_MEMORY_FLOOR_MB, min(BUILD_MEMORY_CAP_MB, needed))


def index_name(generation_id: int, scope_id: int) -> str:
    return f"engram_vectors_hnsw_g{int(generation_id)}_s{int(scope_id)}"


def index_large_scopes(
    pool: Any, threshold: int = LARGE_SCOPE_VECTORS, batch: int = SETTLE_BATCH
) -> list[str]:
    """Give every scope with ``threshold`` or more vectors in the active generation its
    own HNSW index on its settled rows (settling them first); smaller scopes stay on the
    exact (generation, scope) search. The names of the indexes built."""
    built = []
    with _autocommit(pool) as conn:
        rows = conn.execute(
            """
            SELECT g.id, g.dims, x.scope_id, count(*) FROM engram_generations g
            JOIN engram_vectors x ON x.generation_id = g.id
            WHERE g.status = 'active'
              AND NOT EXISTS (SELECT 1 FROM engram_vector_indexes i
                              WHERE i.generation_id = g.id AND i.scope_id = x.scope_id)
            GROUP BY g.id, g.dims, x.scope_id HAVING count(*) >= %s
            """,
            (threshold,),
        ).fetchall()
        for gen, dims, scope, vectors in rows:
            with _scope_lock(conn, gen, scope) as held:
                if held:  # else another job is building it
                    _build(conn, gen, dims, scope, batch, build_memory_mb(vectors, dims))
                    built.append(index_name(gen, scope))
        if built:
            conn.execute("ANALYZE engram_vectors")  # the scopes' rows are settled now
    return built


def settle_fresh(pool: Any, batch: int = SETTLE_BATCH, max_rows: int = SETTLE_RUN_ROWS) -> int:
    """Settle the fresh rows of every scope that has an index in the active generation,
    about ``max_rows`` a scope at most (the next run goes on); the rows settled."""
    settled = 0
    with _autocommit(pool) as conn:
        rows = conn.execute(
            """
            SELECT i.generation_id, i.scope_id FROM engram_vector_indexes i
            JOIN engram_generations g ON g.id = i.generation_id AND g.status = 'active'
            WHERE EXISTS (SELECT 1 FROM engram_vectors x WHERE x.generation_id = i.generation_id
                          AND x.scope_id = i.scope_id AND NOT x.settled)
            """
        ).fetchall()
        for gen, scope in rows:
            with _scope_lock(conn, gen, scope) as held:
                if held:  # else another job is settling it
                    settled += _settle(conn, gen, scope, batch, max_rows)
        if settled >= ANALYZE_AFTER_ROWS:
            conn.execute("ANALYZE engram_vectors")
    return settled


def _build(
    conn: psycopg.Connection[Any], gen: int, dims: int, scope: int, batch: int, memory_mb: int
) -> None:
    name = index_name(gen, scope)
    # A build killed midway leaves its index invalid (and unregistered): build it again.
    if _invalid(conn, name):
        conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    # Settled before the build, so that it reads them all; not yet searched through
    # it (unregistered), recall reads the scope exactly meanwhile.
    _settle(conn, gen, scope, batch)
    _define_centring(conn, gen)
    conn.execute(f"SET maintenance_work_mem = '{int(memory_mb)}MB'")

    def outgrown(notice: psycopg.errors.Diagnostic) -> None:
        if "no longer fits" in (notice.message_primary or ""):
            log.warning(
                "approximate index outgrew its build memory: the rest is built slowly",
                extra={
                    "generation": gen,
                    "scope": scope,
                    "memory_mb": memory_mb,
                    "notice": notice.message_primary,
                },
            )

    conn.add_notice_handler(outgrown)
    try:
        conn.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON engram_vectors"
            f" USING hnsw (({indexed(gen, dims)}) halfvec_cosine_ops)"
            f" WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION})"
            f" WHERE generation_id = {int(gen)} AND scope_id = {int(scope)} AND settled"
        )
    finally:
        conn.remove_notice_handler(outgrown)
    conn.execute(
        "INSERT INTO engram_vector_indexes (generation_id, scope_id, index_name)"
        " VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
        (gen, scope, name),
    )
    log.info("approximate index built", extra={"generation": gen, "scope": scope})


def _define_centring(conn: psycopg.Connection[Any], gen: int) -> None:
    """The generation's centring function (``indexed``), defined once, by its first index
    build, from the mean of its unit vectors then: it never changes after, since the
    indexes built with it hold what it computed."""
    name = f"engram_centred_g{int(gen)}"
    defined = conn.execute("SELECT to_regprocedure(%s)", (f"{name}(vector)",)).fetchone()
    if defined and defined[0] is not None:
        return
    row = conn.execute(
        "SELECT avg(l2_normalize(embedding))::text FROM engram_vectors WHERE generation_id = %s",
        (gen,),
    ).fetchone()
    mean = row[0] if row else None
    if mean is None or not _VECTOR_TEXT.fullmatch(mean):
        raise ValueError(f"generation {gen} has no vectors to centre on")
    with contextlib.suppress(psycopg.errors.DuplicateFunction, psycopg.errors.UniqueViolation):
        conn.execute(
            f"CREATE FUNCTION {name}(v vector) RETURNS vector"
            f" LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE"
            f" RETURN l2_normalize(v) - '{mean}'::vector"
        )  # (another build of the generation defined it meanwhile: the same mean)


_VECTOR_TEXT = re.compile(r"\[[-+0-9.eE,]*\]")


def _settle(
    conn: psycopg.Connection[Any], gen: int, scope: int, batch: int, max_rows: int | None = None
) -> int:
    """Mark the scope's fresh rows settled, ``batch`` a transaction, until none is left
    or ``max_rows`` are; the rows marked. Rows a writer holds are skipped (settled by
    the next run)."""
    settled = 0
    while max_rows is None or settled < max_rows:
        cur = conn.execute(
            """
            UPDATE engram_vectors x SET settled = true FROM (
                SELECT generation_id, scope_id, record_id FROM engram_vectors
                WHERE generation_id = %s AND scope_id = %s AND NOT settled
                LIMIT %s FOR UPDATE SKIP LOCKED
            ) f
            WHERE x.generation_id = f.generation_id AND x.scope_id = f.scope_id
              AND x.record_id = f.record_id
            """,
            (gen, scope, batch),
        )
        settled += cur.rowcount
        if cur.rowcount < batch:
            break
    return settled


def _invalid(conn: psycopg.Connection[Any], name: str) -> bool:
    row = conn.execute(
        "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE c.relname = %s",
        (name,),
    ).fetchone()
    return bool(row and row[0])


@contextlib.contextmanager
def _scope_lock(conn: psycopg.Connection[Any], gen: int, scope: int) -> Iterator[bool]:
    """The scope's advisory lock, if no other job holds it (whether it was got). A session
    lock: a killed job's goes with its connection."""
    key = (int(gen) * 1_000_003 + int(scope)) % 2**31  # the second key is an int4
    got = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (_LOCK_CLASS, key)).fetchone()
    held = bool(got and got[0])
    try:
        yield held
    finally:
        if held:
            conn.execute("SELECT pg_advisory_unlock(%s, %s)", (_LOCK_CLASS, key))


@contextlib.contextmanager
def _autocommit(pool: Any) -> Iterator[psycopg.Connection[Any]]:
    """A pool connection in autocommit mode (CREATE INDEX CONCURRENTLY runs outside a
    transaction; each settling batch commits on its own), handed back as it was found.
    It checks every second that its client is alive, so that a killed job's build stops
    (and its lock goes) instead of running on to the end."""
    with pool.connection() as conn:
        autocommit = conn.autocommit
        conn.autocommit = True
        conn.execute("SET client_connection_check_interval = '1s'")
        try:
            yield conn
        finally:
            conn.execute("RESET client_connection_check_interval")
            conn.execute("RESET maintenance_work_mem")
            conn.autocommit = autocommit  # the pool's connections are autocommit
