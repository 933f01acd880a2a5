"""Embedding generations and the re-embedding job (seed 000, "Embeddings and re-embedding").

Exactly one generation is active. ``begin`` prepares a pending one (retiring
any other pending generation and deleting its vectors in the same
transaction); ``pending`` lists current revisions without a vector in it;
``put`` stores vectors bound to a revision and text digest, refusing any
whose record moved on; ``activate`` switches atomically, and refuses while a
current revision still lacks a vector; ``cancel`` ends a pending generation
(``cancelled``) and deletes its vectors. A retired or cancelled generation never
returns. A pending generation retired by ``begin`` for another model keeps the
id of the one that superseded it in its progress (``superseded_by``).

Writes go on during a re-embedding, and each new text leaves a gap in the
pending generation (writers embed for the active one only). ``switch`` closes
the last gaps and activates with writes held off: it takes the switch lock
exclusively (a session lock, so no transaction stays open while it embeds),
which every write transaction takes shared before anything else. Holding it
waits for the commits in flight; then nothing commits until the gaps it
listed are filled and the generation switched. It only does so for a few
gaps (``max_missing``), so writes wait at most one small batch's embedding.

Retiring (or cancelling) a generation is a change of its status, made where the
switch (or ``begin``) holds writes off, under the generation row's lock that
activation takes too: a generation cancelled is never activated, one activated
is never cancelled. Its vectors and approximate indexes are deleted after, in
batches of their own (``purge_retired``), while writes and recall go on.
Whatever a crash left of them, the next switch, ``begin`` or the jobs worker's
upkeep deletes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from ..errors import (
    EmbeddingMismatchError,
    FencedError,
    GenerationNotPendingError,
    InvalidRequestError,
    NotFoundError,
)
from ..limits import LARGE_SCOPE_VECTORS, REEMBED_BATCH_SIZE, REEMBED_MAX_PASSES
from ..values import Fence, Generation, ReembedResult
from . import vector_indexes
from .embedders import Embedder, embed_checked

log = logging.getLogger(__name__)

PURGE_BATCH = 10_000  # vectors of a retired generation deleted per transaction

_COLUMNS = "id, model_id, dims, status, created_at, activated_at, progress"

# The generation switch lock (see the module's docstring). Migrations use 0x656E6772616D.
SWITCH_LOCK_KEY = 0x656E6772616D01
HOLD_SWITCH_SHARED = f"SELECT pg_advisory_xact_lock_shared({SWITCH_LOCK_KEY})"

# Statuses whose vectors are deleted: never read again.
_ENDED = "('retired', 'cancelled')"

# Current revisions (every scope) without a vector in the generation %(g)s.
_MISSING = """
    FROM engram_records r
    JOIN engram_revisions v
      ON v.scope_id = r.scope_id AND v.record_id = r.id AND v.revision = r.revision
    WHERE NOT EXISTS (SELECT 1 FROM engram_vectors x WHERE x.generation_id = %(g)s
                      AND x.scope_id = r.scope_id AND x.record_id = r.id
                      AND x.revision = r.revision AND x.digest = v.digest)
"""


@dataclass(frozen=True, slots=True)
class PendingItem:
    scope_id: int  # a record id is its scope's
    record_id: str
    revision: int
    digest: str
    text: str

    @property
    def cursor(self) -> str:
        """Where a pass goes on after this item (``pending``'s ``after``)."""
        return f"{self.scope_id}:{self.record_id}"


@dataclass(frozen=True, slots=True)
class VectorItem:
    scope_id: int
    record_id: str
    revision: int
    digest: str
    vector: Sequence[float] | np.ndarray


@dataclass(frozen=True, slots=True)
class Switched:
    activated: bool
    embedded: int  # gaps filled while writes waited
    missing: int  # gaps left (more than a switch holds writes for, or moved meanwhile)
    held_s: float = 0.0  # how long writes were held off


def _generation(row: Sequence[Any] | None) -> Generation | None:
    return Generation(*row) if row else None


class Embeddings:
    def __init__(self, pool: Any, *, admin_timeout_s: float | None = None) -> None:
        self.pool = pool
        # The bound of the long maintenance below (``purge_retired``, ``counts``) on a
        # pool whose statements have a shorter one (the dashboard's); None: the pool's.
        self.admin_timeout_s = admin_timeout_s

    def active(self) -> Generation | None:
        with self.pool.connection() as conn:
            return _generation(
                conn.execute(
                    f"SELECT {_COLUMNS} FROM engram_generations WHERE status = 'active'"
                ).fetchone()
            )

    def get(self, generation_id: int) -> Generation | None:
        with self.pool.connection() as conn:
            return _generation(
                conn.execute(
                    f"SELECT {_COLUMNS} FROM engram_generations WHERE id = %s", (generation_id,)
                ).fetchone()
            )

    def all(self) -> list[Generation]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM engram_generations ORDER BY id DESC"
            ).fetchall()
        return [Generation(*r) for r in rows]

    def begin(self, model_id: str, dims: int) -> Generation:
        """The pending generation for this model and size, created if needed."""
        if not model_id or not 1 <= dims <= 16000:
            raise InvalidRequestError("a generation needs a model id and 1 to 16000 dimensions")
        with self.pool.connection() as conn, conn.transaction():
            conn.execute("LOCK TABLE engram_generations IN SHARE ROW EXCLUSIVE MODE")
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM engram_generations WHERE status = 'pending'"
            ).fetchone()
            if row is not None:
                if row[1] == model_id and row[2] == dims:
                    return Generation(*row)
                _retire(conn, row[0])
            created = conn.execute(
                "INSERT INTO engram_generations (model_id, dims, status)"
                f" VALUES (%s, %s, 'pending') RETURNING {_COLUMNS}",
                (model_id, dims),
            ).fetchone()
            assert created is not None
            if row is not None:
                _merge_progress(conn, row[0], {"superseded_by": created[0]})
        log.info("embedding generation begun", extra={"generation": created[0]})
        self.purge_retired()
        return Generation(*created)

    def pending(
        self, generation_id: int, limit: int = REEMBED_BATCH_SIZE, after: str | None = None
    ) -> list[PendingItem]:
        """Current revisions (every scope) without a vector in this pending generation,
        in (scope, record id) order, from after ``after`` (a ``PendingItem.cursor``; one
        that is not, as a cursor from before record ids were their scope's, starts over)."""
        with self.pool.connection() as conn:
            return _pending(conn, generation_id, limit, after)

    def counts(self, generation_id: int) -> tuple[int, int]:
        """(current revisions with a vector in this generation, current revisions)."""
        with self.pool.connection() as conn, statement_bound(conn, self.admin_timeout_s):
            [row] = _compare_all(
                conn,
                f"SELECT (SELECT count(*) FROM engram_records), (SELECT count(*) {_MISSING})",
                {"g": generation_id},
            )
        total, missing = int(row[0]), int(row[1])
        return total - missing, total

    def put(
        self, generation_id: int, items: Sequence[VectorItem], *, fence: Fence | None = None
    ) -> int:
        """Store vectors whose record is still at that revision and text; return how many.

        With ``fence``, refuse (``FencedError``, nothing stored) once a newer token of
        that name has been seen: a re-embedding job that lost its lock stores nothing."""
        if not items:
            return 0
        with self.pool.connection() as conn:
            return _put(conn, generation_id, items, fence)

    def activate(self, generation_id: int) -> bool:
        """Make a pending generation active, atomically; False (and no change) if it can't be."""
        with self.pool.connection() as conn:
            activated = _activate(conn, generation_id)
        if activated:
            log.info("embedding generation activated", extra={"generation": generation_id})
            self.purge_retired()
        return activated

    def cancel(self, generation_id: int, progress: Mapping[str, Any]) -> Generation:
        """End a pending generation for good (``cancelled``), merging ``progress`` into
        its progress, and delete its vectors. ``GenerationNotPendingError`` (nothing
        changed) for any other; ``NotFoundError`` for no such generation.

        The row lock is the one activation takes: an activation in flight commits
        first (and this refuses) or finds the generation cancelled (and refuses)."""
        with self.pool.connection() as conn, conn.transaction():
            found = conn.execute(
                "SELECT status FROM engram_generations WHERE id = %s FOR UPDATE",
                (generation_id,),
            ).fetchone()
            if found is None:
                raise NotFoundError(f"no generation {generation_id}")
            if found[0] != "pending":
                raise GenerationNotPendingError(
                    f"generation {generation_id} is {found[0]}: only a pending generation "
                    "can be cancelled"
                )
            row = conn.execute(
                "UPDATE engram_generations SET status = 'cancelled', retired_at = now(),"
                f" progress = progress || %s WHERE id = %s RETURNING {_COLUMNS}",
                (Jsonb(dict(progress)), generation_id),
            ).fetchone()
        assert row is not None
        log.info("embedding generation cancelled", extra={"generation": generation_id})
        self.purge_retired()
        return Generation(*row)

    def vector_count(self, generation_id: int) -> int:
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT count(*) FROM engram_vectors WHERE generation_id = %s", (generation_id,)
            ).fetchone()
        return int(row[0]) if row else 0

    def switch(
        self,
        generation_id: int,
        embedder: Embedder,
        *,
        max_missing: int = REEMBED_BATCH_SIZE,
        fence: Fence | None = None,
    ) -> Switched:
        """Fill the last gaps of a pending generation and activate it, with writes held
        off meanwhile. Nothing is switched when more than ``max_missing`` current
        revisions lack a vector, or the generation is no longer pending.

        The embedder runs while writes wait: it must not write to this store."""
        # One connection for all of it: writers waiting for the lock may hold the others.
        with self.pool.connection() as conn:
            # Before writes are held: statistics that know how many vectors the passes
            # stored (taken before, they say the generation is empty).
            conn.execute("ANALYZE engram_vectors")
            # A session lock, not a transaction: none stays open while we embed.
            conn.execute("SELECT pg_advisory_lock(%s)", (SWITCH_LOCK_KEY,))
            held = time.monotonic()
            try:
                gaps = _pending(conn, generation_id, max_missing + 1, None)
                if len(gaps) > max_missing:
                    return Switched(False, 0, len(gaps), time.monotonic() - held)
                vectors = embed_checked(embedder, [g.text for g in gaps])
                items = [
                    VectorItem(g.scope_id, g.record_id, g.revision, g.digest, v)
                    for g, v in zip(gaps, vectors, strict=True)
                ]
                stored = _put(conn, generation_id, items, fence) if items else 0
                activated = _activate(conn, generation_id)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (SWITCH_LOCK_KEY,))
                held_s = time.monotonic() - held
        if activated:
            log.info(
                "embedding generation activated",
                extra={"generation": generation_id, "writes_held_ms": round(held_s * 1000, 1)},
            )
            self.purge_retired()
        return Switched(activated, stored, len(gaps) - stored, held_s)

    def purge_retired(self, batch: int = PURGE_BATCH) -> int:
        """Delete what retired and cancelled generations left behind, their approximate indexes
        (``DROP INDEX CONCURRENTLY``) and their vectors (``batch`` rows a transaction),
        so that neither writes nor recall wait on it; the vectors deleted."""
        with self.pool.connection() as conn, statement_bound(conn, self.admin_timeout_s):
            for (name,) in conn.execute(
                "SELECT i.index_name FROM engram_vector_indexes i"
                f" JOIN engram_generations g ON g.id = i.generation_id WHERE g.status IN {_ENDED}"
            ).fetchall():
                conn.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
                conn.execute("DELETE FROM engram_vector_indexes WHERE index_name = %s", (name,))
            deleted = 0
            while True:
                cur = conn.execute(
                    f"""
                    DELETE FROM engram_vectors v USING (
                        SELECT x.generation_id, x.scope_id, x.record_id FROM engram_vectors x
                        JOIN engram_generations g ON g.id = x.generation_id
                        WHERE g.status IN {_ENDED} LIMIT %s) d
                    WHERE v.generation_id = d.generation_id AND v.scope_id = d.scope_id
                      AND v.record_id = d.record_id
                    """,
                    (batch,),
                )
                count: int = cur.rowcount
                deleted += count
                if count < batch:
                    break
        if deleted:
            log.info("retired vectors deleted", extra={"vectors": deleted})
        return deleted

    def set_progress(
        self, generation_id: int, progress: dict[str, Any], *, if_pending: bool = False
    ) -> bool:
        """Store a re-embedding's progress on its generation; whether it was stored.
        ``if_pending``: only while the generation is still pending (what read the
        progress earlier must not overwrite the last word of a switch made since)."""
        with self.pool.connection() as conn:
            cur = conn.execute(
                "UPDATE engram_generations SET progress = %s WHERE id = %s"
                + (" AND status = 'pending'" if if_pending else ""),
                (Jsonb(progress), generation_id),
            )
            return bool(cur.rowcount == 1)

    def fill(
        self,
        generation_id: int,
        embedder: Embedder,
        batch_size: int = REEMBED_BATCH_SIZE,
        *,
        on_batch: Callable[[int, int], None] | None = None,
    ) -> tuple[int, int]:
        """One pass over the current revisions without a vector in a pending generation,
        embedded and stored in batches of ``batch_size``; (stored, skipped: the records
        that moved meanwhile). ``on_batch`` is told both counts so far after each batch."""
        stored_all = skipped_all = 0
        after: str | None = None
        while batch := self.pending(generation_id, batch_size, after):
            after = batch[-1].cursor
            vectors = embed_checked(embedder, [item.text for item in batch])
            stored = self.put(
                generation_id,
                [
                    VectorItem(i.scope_id, i.record_id, i.revision, i.digest, v)
                    for i, v in zip(batch, vectors, strict=True)
                ],
            )
            stored_all, skipped_all = stored_all + stored, skipped_all + len(batch) - stored
            if on_batch is not None:
                on_batch(stored_all, skipped_all)
        return stored_all, skipped_all

    def reembed(
        self,
        embedder: Embedder,
        *,
        batch_size: int = REEMBED_BATCH_SIZE,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> ReembedResult:
        """Fill a pending generation for ``embedder`` and activate it (up to three passes)."""
        generation = self.begin(embedder.model_id, embedder.dims)
        embedded = skipped = 0
        for pass_number in range(1, REEMBED_MAX_PASSES + 1):
            report = partial(
                self._report, generation.id, on_progress, pass_number, embedded, skipped
            )
            stored, moved = self.fill(generation.id, embedder, batch_size, on_batch=report)
            embedded, skipped = embedded + stored, skipped + moved
            switched = self.switch(generation.id, embedder, max_missing=batch_size)
            embedded += switched.embedded
            if switched.activated:
                self.index_large_scopes()
                return ReembedResult(generation.id, embedded, skipped, activated=True)
            current = self.get(generation.id)
            if current is None or current.status != "pending":
                break  # retired by a newer begin: this job is over
        return ReembedResult(generation.id, embedded, skipped, activated=False)

    def _report(
        self,
        generation_id: int,
        on_progress: Callable[[dict[str, Any]], None] | None,
        pass_number: int,
        embedded_before: int,
        skipped_before: int,
        stored: int,
        moved: int,
    ) -> None:
        """Progress of ``reembed``: this pass's counts so far, on top of earlier passes'."""
        progress = {
            "pass": pass_number,
            "embedded": embedded_before + stored,
            "skipped": skipped_before + moved,
        }
        self.set_progress(generation_id, progress)
        if on_progress is not None:
            on_progress(progress)

    def index_large_scopes(self, threshold: int = LARGE_SCOPE_VECTORS) -> list[str]:
        """Give every scope with ``threshold`` or more vectors in the active generation its
        own HNSW index (``vector_indexes``); smaller scopes stay on the exact search."""
        return vector_indexes.index_large_scopes(self.pool, threshold)

    def settle_fresh(self) -> int:
        """Move the vectors written since into the approximate indexes of the scopes that
        have one (``vector_indexes``); the vectors moved."""
        return vector_indexes.settle_fresh(self.pool)


def _compare_all(conn: psycopg.Connection[Any], sql: str, params: Any) -> list[Any]:
    """Rows of a statement that compares every current revision with a generation's
    vectors, run without nested loops. Statistics taken before a pass filled the
    generation say it holds no vector; the planner then compares all pairs in a nested
    loop, quadratic in the store's size (measured: 20 s at 20,000 records; a switch
    held writes off for 8 minutes at 100,000). Hashed or merged, it is linear."""
    with conn.transaction():
        conn.execute("SET LOCAL enable_nestloop = off")
        return conn.execute(sql, params).fetchall()


def _pending(
    conn: psycopg.Connection[Any], generation_id: int, limit: int, after: str | None
) -> list[PendingItem]:
    # The cursor bounds every side of the joins, not only the records': without it the
    # planner merges from the first revision and the first vector of the generation at
    # every batch (measured: 300 ms a batch at 120,000 records, against 1.4 ms). Each
    # table's primary key leads with (scope, record id), the cursor's order.
    scope_id, record_id = _cursor(after)
    rows = _compare_all(
        conn,
        """
        SELECT r.scope_id, r.id, r.revision, v.digest, v.text
        FROM engram_records r
        JOIN engram_revisions v
          ON v.scope_id = r.scope_id AND v.record_id = r.id AND v.revision = r.revision
        WHERE (r.scope_id, r.id) > (%(s)s, %(after)s)
          AND (v.scope_id, v.record_id) > (%(s)s, %(after)s)
          AND NOT EXISTS (SELECT 1 FROM engram_vectors x WHERE x.generation_id = %(g)s
                          AND (x.scope_id, x.record_id) > (%(s)s, %(after)s)
                          AND x.scope_id = r.scope_id AND x.record_id = r.id
                          AND x.revision = r.revision AND x.digest = v.digest)
          AND EXISTS (SELECT 1 FROM engram_generations g
                      WHERE g.id = %(g)s AND g.status = 'pending')
        ORDER BY r.scope_id, r.id LIMIT %(n)s
        """,
        {"g": generation_id, "s": scope_id, "after": record_id, "n": limit},
    )
    return [PendingItem(*r) for r in rows]


def _cursor(after: str | None) -> tuple[int, str]:
    """A ``PendingItem.cursor`` read back: (scope id, record id); the start otherwise."""
    scope, _, record_id = (after or "").partition(":")
    return (int(scope), record_id) if scope.isdigit() and _ else (0, "")


def _put(
    conn: psycopg.Connection[Any],
    generation_id: int,
    items: Sequence[VectorItem],
    fence: Fence | None,
) -> int:
    with conn.transaction():
        if fence is not None:
            _raise_fence(conn, fence)
        gen = conn.execute(
            "SELECT dims, status FROM engram_generations WHERE id = %s FOR SHARE",
            (generation_id,),
        ).fetchone()
        if gen is None or gen[1] in ("retired", "cancelled"):
            return 0
        dims = gen[0]
        vectors = []
        for item in items:
            vector = np.asarray(item.vector, dtype=np.float32)
            if vector.shape != (dims,):
                raise EmbeddingMismatchError(
                    f"generation {generation_id} holds {dims}-dimensional vectors, "
                    f"not {vector.shape[0] if vector.ndim == 1 else vector.shape}"
                )
            vectors.append(vector)
        _hold_scopes(conn, sorted({i.scope_id for i in items}))
        cur = conn.execute(
            """
            INSERT INTO engram_vectors (generation_id, record_id, scope_id, revision, digest,
                                        status, kind, expires_at, embedding)
            SELECT %(g)s, r.id, r.scope_id, r.revision, v.digest, r.status, r.kind,
                   r.expires_at, i.embedding
            FROM unnest(%(scopes)s::int8[], %(ids)s::text[], %(revs)s::int[],
                        %(digests)s::text[], %(vecs)s::vector[])
                 AS i(scope_id, id, revision, digest, embedding)
            JOIN engram_records r
              ON r.scope_id = i.scope_id AND r.id = i.id AND r.revision = i.revision
            JOIN engram_revisions v
              ON v.scope_id = r.scope_id AND v.record_id = r.id AND v.revision = r.revision
                                   AND v.digest = i.digest
            ON CONFLICT (generation_id, scope_id, record_id) DO UPDATE
              SET revision = EXCLUDED.revision, digest = EXCLUDED.digest,
                  status = EXCLUDED.status, kind = EXCLUDED.kind,
                  expires_at = EXCLUDED.expires_at, embedding = EXCLUDED.embedding,
                  settled = false  -- fresh: no graph insertion
            """,
            {
                "g": generation_id,
                "scopes": [i.scope_id for i in items],
                "ids": [i.record_id for i in items],
                "revs": [i.revision for i in items],
                "digests": [i.digest for i in items],
                "vecs": vectors,
            },
        )
        stored: int = cur.rowcount
        return stored


def _hold_scopes(conn: psycopg.Connection[Any], scope_ids: Sequence[int]) -> None:
    """Lock these scopes (the records' to be given vectors) FOR SHARE, in key order,
    until the transaction ends.

    Every write transaction locks its scopes' rows first (in key order too), so this
    waits for a forget of these records in flight, and a forget that starts later waits
    for this transaction. Without it, an insert whose snapshot still saw a record being
    forgotten stored its vector after the forget's delete of the record's vectors had
    run: a vector of a forgotten record, in no one's sight. The insert that follows is
    a statement of its own, so its snapshot sees every forget committed before."""
    conn.execute(
        "SELECT s.id FROM engram_scopes s WHERE s.id = ANY(%s) ORDER BY s.key FOR SHARE OF s",
        (list(scope_ids),),
    )


def _activate(conn: psycopg.Connection[Any], generation_id: int) -> bool:
    with conn.transaction():
        # Waits for in-flight writes, which hold the active row FOR SHARE.
        rows = conn.execute(
            "SELECT id, status FROM engram_generations WHERE status IN ('active', 'pending')"
            " OR id = %s FOR UPDATE",
            (generation_id,),
        ).fetchall()
        status = {r[0]: r[1] for r in rows}
        if status.get(generation_id) != "pending":
            return False
        [(missing,)] = _compare_all(
            conn, f"SELECT EXISTS (SELECT 1 {_MISSING})", {"g": generation_id}
        )
        if missing:
            return False
        for gid, state in status.items():
            if state == "active":
                _retire(conn, gid)
        conn.execute(
            "UPDATE engram_generations SET status = 'active', activated_at = now() WHERE id = %s",
            (generation_id,),
        )
    return True


def _merge_progress(
    conn: psycopg.Connection[Any], generation_id: int, progress: Mapping[str, Any]
) -> None:
    conn.execute(
        "UPDATE engram_generations SET progress = progress || %s WHERE id = %s",
        (Jsonb(dict(progress)), generation_id),
    )


def _raise_fence(conn: psycopg.Connection[Any], fence: Fence) -> None:
    raised = conn.execute(
        "INSERT INTO engram_fences (name, token) VALUES (%s, %s)"
        " ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token"
        " WHERE engram_fences.token <= EXCLUDED.token RETURNING name",
        (fence.name, fence.token),
    ).fetchone()
    if raised is None:
        raise FencedError(f"stale fencing token for {fence.name}", fences=(fence.name,))


@contextmanager
def statement_bound(conn: psycopg.Connection[Any], seconds: float | None) -> Iterator[None]:
    """The statements inside run under their own ``statement_timeout`` (a session
    ``SET``, for statements such as ``DROP INDEX CONCURRENTLY`` that no transaction may
    hold), then ``RESET`` to the connection's own. None: nothing changed."""
    if seconds is None:
        yield
        return
    conn.execute(f"SET statement_timeout = {max(1, round(seconds * 1000))}")
    try:
        yield
    finally:
        if not conn.broken:
            conn.execute("RESET statement_timeout")


def _retire(conn: psycopg.Connection[Any], generation_id: int) -> None:
    """Retire a generation for good. Its vectors and approximate indexes are no longer
    read from now on; ``purge_retired`` deletes them once the transaction is over."""
    conn.execute(
        "UPDATE engram_generations SET status = 'retired', retired_at = now() WHERE id = %s",
        (generation_id,),
    )
    log.info("embedding generation retired", extra={"generation": generation_id})
