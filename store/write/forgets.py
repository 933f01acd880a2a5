"""What the redaction listeners read and write in the store, by ids only.

A forget commits first; its listeners run afterwards (seed 000) and need, per
forgotten record, the operations that ever wrote it (their stream entries and
dead letters may still hold its text), the forgets still waiting for their
listeners, and a way to record how the listeners did (and how many times a
forget was handed to them again, when its job was lost). ``vacuum`` removes the
dead row versions a forget leaves behind in the tables it deleted from, once
nothing holds them (``horizon``); until then the forget stays ``pending``, with
what holds it as its reason.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..errors import RedactionHeldError
from ..rows import scope_from_key
from ..session import ForgetEvent
from ..values import Redaction
from . import horizon
from .operations import OpKey

log = logging.getLogger(__name__)

# The tables a forget deletes from or rewrites (apply._delete_replaced): their
# old row versions hold the text until VACUUM removes them.
FORGET_TABLES = (
    "engram_revisions",
    "engram_vectors",
    "engram_links",
    "engram_records",
    "engram_receipts",
)


# The operations a call names, by (scope key, operation id): an operation id identifies
# an operation within its scope. Joined as ``k`` with its scope ``s``.
_KEYS = (
    " unnest(%(scope_keys)s::text[], %(op_ids)s::text[]) AS k(scope_key, op)"
    " JOIN engram_scopes s ON s.key = k.scope_key"
)


def _keys(keys: Sequence[OpKey]) -> dict[str, Any]:
    return {"scope_keys": [k[0] for k in keys], "op_ids": [k[1] for k in keys]}


def writers(pool: Any, records: Sequence[tuple[str, str]]) -> dict[tuple[str, str], list[OpKey]]:
    """The operations, as (scope key, operation id), whose receipts wrote each record,
    named (scope key, record id): a record id is its scope's (the forgets' own excluded)."""
    found: dict[tuple[str, str], list[OpKey]] = defaultdict(list)
    if not records:
        return found
    with pool.connection() as conn:
        for key, record_id, op_id in conn.execute(
            "SELECT s.key, rr.record_id, rr.operation_id"
            " FROM unnest(%s::text[], %s::text[]) AS k(scope_key, record_id)"
            " JOIN engram_scopes s ON s.key = k.scope_key"
            " JOIN engram_receipt_records rr"
            " ON rr.scope_id = s.id AND rr.record_id = k.record_id"
            " ORDER BY rr.record_id, rr.revision",
            ([r[0] for r in records], [r[1] for r in records]),
        ).fetchall():
            found[(key, record_id)].append((key, op_id))
    return found


def pending(pool: Any, committed_before: datetime, limit: int = 1000) -> list[ForgetEvent]:
    """Forgets committed before ``committed_before`` whose redaction is still pending."""
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT s.key, c.request->>'id', c.forgotten_revisions, c.operation_id,"
            " c.already_forgotten FROM engram_receipts c JOIN engram_scopes s ON s.id = c.scope_id"
            " WHERE c.redaction = 'pending' AND c.committed_at < %s"
            " ORDER BY c.committed_at LIMIT %s",
            (committed_before, limit),
        ).fetchall()
    return [
        ForgetEvent(
            scope=scope_from_key(key),
            record_id=record_id,
            revisions=tuple(revisions or ()),
            operation_id=op_id,
            already_forgotten=bool(already),
        )
        for key, record_id, revisions, op_id, already in rows
    ]


def committed_at(pool: Any, keys: Sequence[OpKey]) -> dict[OpKey, datetime]:
    """When these forgets (scope key, operation id) committed (those whose receipt is
    still there)."""
    with pool.connection() as conn:
        rows = conn.execute(
            f"SELECT s.key, c.operation_id, c.committed_at FROM {_KEYS}"
            " JOIN engram_receipts c ON c.scope_id = s.id AND c.operation_id = k.op"
            " WHERE c.kind = 'forget'",
            _keys(keys),
        ).fetchall()
    return {(key, op_id): at for key, op_id, at in rows}


def set_redaction(
    pool: Any, keys: Sequence[OpKey], status: Redaction, reason: str | None = None
) -> int:
    """Record how the listeners of these forgets (scope key, operation id) did, and why
    when they failed or, still ``pending``, are held (content-free); returns how many
    receipts changed."""
    with pool.connection() as conn:
        cur = conn.execute(
            "UPDATE engram_receipts c SET redaction = %(status)s, redaction_reason = %(reason)s"
            f" FROM {_KEYS}"
            " WHERE c.scope_id = s.id AND c.operation_id = k.op AND c.kind = 'forget'",
            {"status": status, "reason": reason, **_keys(keys)},
        )
        count: int = cur.rowcount
    return count


def held(conn: Any) -> tuple[int, str | None]:
    """How many forgets are held (still ``pending``, with the reason their holders gave),
    and the reason of the latest one."""
    row = conn.execute(
        "SELECT count(*), (array_agg(redaction_reason ORDER BY committed_at DESC))[1]"
        " FROM engram_receipts WHERE redaction = 'pending' AND kind = 'forget'"
        " AND redaction_reason IS NOT NULL"
    ).fetchone()
    return (int(row[0]), row[1]) if row else (0, None)


def hand_over_again(
    pool: Any,
    keys: Sequence[OpKey],
    *,
    max_handovers: int,
    reason: str,
    count_held: bool = True,
) -> tuple[list[OpKey], list[OpKey]]:
    """Count one more hand-over of these pending forgets (scope key, operation id), in
    one transaction: (those to hand over again, those that had reached ``max_handovers``
    and are now ``failed`` with ``reason``). Forgets no longer pending are in neither.

    A held forget (pending with the reason its holders gave, ``set_redaction``) whose
    job ended is handed over again until they are gone: with ``count_held`` off (the
    sweeper's), that hand-over is not counted, as no job was lost."""
    counted = "(%(count_held)s OR c.redaction_reason IS NULL)"
    params = {"max": max_handovers, "reason": reason, "count_held": count_held, **_keys(keys)}
    matched = (
        f" FROM {_KEYS} WHERE c.scope_id = s.id AND c.operation_id = k.op"
        " AND c.kind = 'forget' AND c.redaction = 'pending'"
    )
    with pool.connection() as conn, conn.transaction():
        failed = conn.execute(
            "UPDATE engram_receipts c SET redaction = 'failed', redaction_reason = %(reason)s"
            f"{matched} AND c.redaction_handovers >= %(max)s AND {counted}"
            " RETURNING s.key, c.operation_id",
            params,
        ).fetchall()
        again = conn.execute(
            "UPDATE engram_receipts c SET redaction_handovers = c.redaction_handovers"
            f" + CASE WHEN {counted} THEN 1 ELSE 0 END{matched}"
            " RETURNING s.key, c.operation_id",
            params,
        ).fetchall()
    return [(r[0], r[1]) for r in again], [(r[0], r[1]) for r in failed]


def vacuum(pool: Any, *, wait_s: float = 60.0, record_ids: Sequence[str] = ()) -> datetime:
    """VACUUM the tables a forget touches, indexes included, to remove the row versions
    of every forget committed before the call; returns when the VACUUM began.

    VACUUM keeps the row versions a snapshot anywhere may still read, so it first waits
    until nothing holds the xmin horizon before the call (``horizon.holders``: open
    transactions, a standby's snapshot through hot_standby_feedback, replication slots,
    prepared transactions), and raises ``RedactionHeldError`` naming them after
    ``wait_s``. Then the vectors still stored for any of ``record_ids`` that is
    forgotten (tombstoned) are deleted: a writer whose snapshot predated the forget
    could have stored one (``embeddings._put`` holds the scopes against that; this is
    the second line), and once those transactions are over no new one can read the
    record to store one. Then the forgets' deleted row versions are gone from the heap
    and the indexes (``INDEX_CLEANUP ON``: never skipped for having few dead rows), and
    the full-text index's pending list is merged, and the tables' statistics are taken
    again from what is left (ANALYZE's samples may have held the text). The holders are
    looked at again after the VACUUM: one that came meanwhile (a standby reconnecting
    with an old snapshot) may have kept the rows, and that too raises
    ``RedactionHeldError``. What may remain in the data files is described in
    ``docs/jobs.md``."""
    deadline = time.monotonic() + wait_s
    with pool.connection() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        called: datetime = row[0]
        before = horizon.limit(conn)
        while held := horizon.holders(conn, before):
            if time.monotonic() > deadline:
                raise RedactionHeldError(held)
            time.sleep(0.2)
        strays = delete_stray_vectors(conn, record_ids)
        if strays:
            log.warning("vectors of forgotten records deleted", extra={"vectors": strays})
        # ANALYZE too: the planner's statistics keep sample values and words of the
        # tables (pg_statistic), which may be the forgotten text's.
        conn.execute(f"VACUUM (INDEX_CLEANUP ON, ANALYZE) {', '.join(FORGET_TABLES)}")
        if held := horizon.holders(conn, before):
            raise RedactionHeldError(held)
    return called


def delete_stray_vectors(conn: Any, record_ids: Sequence[str]) -> int:
    """Delete the vectors, in every generation, of the records forgotten in their scope
    whose ids are among ``record_ids``; how many. A forget deletes them itself: any found
    here were stored by a transaction that raced it. Another scope's record of the same
    id keeps its vector."""
    if not record_ids:
        return 0
    cur = conn.execute(
        "DELETE FROM engram_vectors x USING engram_forgotten f"
        " WHERE f.record_id = ANY(%s) AND x.scope_id = f.scope_id"
        " AND x.record_id = f.record_id",
        (list(record_ids),),
    )
    count: int = cur.rowcount
    return count


# The full-text index: GIN keeps a word as a key of its entry tree once it was indexed,
# even when no row has it any more (VACUUM empties its posting list, not the key).
TEXT_INDEX = "engram_revisions_tsv_idx"


def reindex_text(pool: Any) -> None:
    """Rebuild the full-text index without blocking writes (``REINDEX CONCURRENTLY``), so
    that the words of forgotten texts leave it. A rebuild that failed earlier leaves an
    invalid copy (``…_ccnew``): it is dropped first."""
    with pool.connection() as conn:
        for (name,) in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid"
            " WHERE NOT i.indisvalid AND c.relname LIKE %s",
            (f"{TEXT_INDEX}_ccnew%",),
        ).fetchall():
            conn.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
        conn.execute(f"REINDEX INDEX CONCURRENTLY {TEXT_INDEX}")
