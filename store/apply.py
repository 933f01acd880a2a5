"""Applying plans: load the state a batch names, then write every scope's plan
with one set-based statement per table (COPY for the inserts). Runs inside the
writer's transaction; the number of round trips does not grow with the number
of scopes or operations in the batch."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from .extraction import readable_sources
from .model import SCOPE_FIELDS, Scope
from .operations import Extract, Operation, Remember, derived_record_id
from .planner import Current, Plan, ScopeState, StoredReceipt
from .rows import REVISION_COLUMNS, record_from_row

Pairs = Sequence[tuple[ScopeState, Plan]]


def stored_receipts(conn: psycopg.Connection[Any], op_ids: list[str]) -> dict[str, StoredReceipt]:
    rows = conn.execute(
        "SELECT operation_id, request_digest, error FROM engram_receipts"
        " WHERE operation_id = ANY(%s)",
        (op_ids,),
    ).fetchall()
    return {r[0]: StoredReceipt(r[0], r[1], r[2]) for r in rows}


def referenced_ids(op: Operation) -> list[str]:
    """The record ids an operation may read or write."""
    r = op.request
    if isinstance(r, Remember):
        return [r.id or derived_record_id(op.operation_id, 0)]
    if isinstance(r, Extract):
        count = len(readable_sources(r.messages, r.trusted_tools, op.scope.chat_id))
        return [derived_record_id(op.operation_id, i) for i in range(count)]
    return [r.id]


@dataclass(frozen=True, slots=True)
class _Found:
    """Rows read for a batch, before they are split by scope."""

    records: dict[str, tuple[int, Current]]  # id -> (scope id, current revision)
    forgotten: dict[str, int]  # id -> scope id
    receipts: dict[str, StoredReceipt]


def load_states(
    conn: psycopg.Connection[Any], groups: dict[str, list[Operation]]
) -> list[ScopeState]:
    """Lock every scope of the batch (in key order) and read what its operations name."""
    keys = sorted(groups)
    locked = _lock_scopes(conn, [groups[k][0].scope for k in keys])
    ids = {k: sorted({rid for op in groups[k] for rid in referenced_ids(op)}) for k in keys}
    found = _read(
        conn,
        sorted({i for v in ids.values() for i in v}),
        [op.operation_id for k in keys for op in groups[k]],
    )
    states = []
    for key in keys:
        scope_id, revision = locked[key]
        mine = {
            i: row[1]
            for i in ids[key]
            if (row := found.records.get(i)) is not None and row[0] == scope_id
        }
        taken = {i for i in ids[key] if i in found.records and i not in mine}
        taken |= {i for i in ids[key] if found.forgotten.get(i, scope_id) != scope_id}
        states.append(
            ScopeState(
                scope_id=scope_id,
                scope=groups[key][0].scope,
                revision=revision,
                records=mine,
                taken=taken,
                forgotten={i for i in ids[key] if found.forgotten.get(i) == scope_id},
                # One dict for the whole batch: an id committed by one scope's plan
                # is seen by the next (a repeat in another scope is a conflict).
                receipts=found.receipts,
            )
        )
    return states


def _lock_scopes(conn: psycopg.Connection[Any], scopes: list[Scope]) -> dict[str, tuple[int, int]]:
    columns = [[s.key for s in scopes]] + [[getattr(s, f) for s in scopes] for f in SCOPE_FIELDS]
    rows = conn.execute(
        f"INSERT INTO engram_scopes (key, {', '.join(SCOPE_FIELDS)})"
        " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[],"
        " %s::text[]) ORDER BY 1"
        " ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key RETURNING key, id, revision",
        columns,
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def _read(conn: psycopg.Connection[Any], ids: list[str], op_ids: list[str]) -> _Found:
    with conn.pipeline():
        records = conn.execute(
            f"""
            SELECT r.scope_id, r.created_at, {REVISION_COLUMNS},
                   (SELECT array_agg(x.revision ORDER BY x.revision)
                    FROM engram_revisions x WHERE x.record_id = r.id)
            FROM engram_records r
            JOIN engram_revisions v ON v.record_id = r.id AND v.revision = r.revision
            JOIN engram_scopes s ON s.id = r.scope_id
            WHERE r.id = ANY(%s)
            """,
            (ids,),
        )
        forgotten = conn.execute(
            "SELECT record_id, scope_id FROM engram_forgotten WHERE record_id = ANY(%s)", (ids,)
        )
        receipts = conn.execute(
            "SELECT operation_id, request_digest, error FROM engram_receipts"
            " WHERE operation_id = ANY(%s)",
            (op_ids,),
        )
        return _Found(
            records={r[2]: (r[0], _current(r)) for r in records.fetchall()},
            forgotten={r[0]: r[1] for r in forgotten.fetchall()},
            receipts={r[0]: StoredReceipt(r[0], r[1], r[2]) for r in receipts.fetchall()},
        )


def _current(row: Sequence[Any]) -> Current:
    rec = record_from_row(row[2:17])
    return Current(
        id=rec.id,
        revision=rec.revision,
        status=rec.status,
        text=rec.text,
        kind=rec.kind,
        importance=rec.importance,
        metadata=rec.metadata,
        origin=rec.origin,
        sources=rec.sources,
        links=rec.links,
        digest=rec.digest,
        expires_at=rec.expires_at,
        created_at=row[1],
        revisions=tuple(row[17]),
    )


# -- writing ---------------------------------------------------------------------------

VECTOR_COLUMNS = (
    "generation_id",
    "record_id",
    "scope_id",
    "revision",
    "digest",
    "status",
    "kind",
    "expires_at",
    "embedding",
)
VECTOR_TYPES = ("int4", "text", "int8", "int4", "text", "text", "text", "timestamptz", "vector")
REVISION_INSERT = (
    "record_id",
    "revision",
    "scope_id",
    "text",
    "kind",
    "importance",
    "metadata",
    "origin",
    "sources",
    "links",
    "status",
    "digest",
    "operation_id",
    "recorded_at",
    "expires_at",
    "current",
)
RECEIPT_INSERT = (
    "operation_id",
    "scope_id",
    "kind",
    "request_digest",
    "scope_revision",
    "committed_at",
    "request",
    "redacted",
    "forgotten_revisions",
    "already_forgotten",
    "redaction",
    "stream_entry",
    "error",
)


def write_plans(
    conn: psycopg.Connection[Any],
    pairs: Pairs,
    now: datetime,
    gen_id: int | None,
    vectors: dict[str, np.ndarray],
) -> None:
    with conn.cursor() as cur:
        _forget(cur, [(s.scope_id, p) for s, p in pairs], now)
        _copy(
            cur,
            "engram_revisions",
            REVISION_INSERT,
            [
                (
                    c.id,
                    c.revision,
                    s.scope_id,
                    c.text,
                    c.kind,
                    c.importance,
                    Jsonb(c.metadata),
                    c.origin,
                    Jsonb([x.as_dict() for x in c.sources]),
                    Jsonb([link.as_dict() for link in c.links]),
                    c.status,
                    c.digest,
                    w.operation_id,
                    w.recorded_at,
                    c.expires_at,
                    p.final[c.id].revision == c.revision,
                )
                for s, p in pairs
                for w in p.revisions
                for c in (w.record,)
            ],
        )
        _executemany(
            cur,
            "UPDATE engram_revisions SET current = false"
            " WHERE record_id = %s AND revision < %s AND current",
            [(rid, c.revision) for s, p in pairs for rid, c in p.final.items() if rid in s.records],
        )
        _write_records(cur, pairs)
        _write_links(cur, pairs)
        _write_vectors(cur, pairs, gen_id, vectors)
        _copy(
            cur,
            "engram_receipts",
            RECEIPT_INSERT,
            [
                (
                    r.operation_id,
                    s.scope_id,
                    r.kind,
                    r.request_digest,
                    r.scope_revision,
                    r.committed_at,
                    Jsonb(r.request) if r.request is not None else None,
                    r.redacted,
                    r.forgotten_revisions,
                    r.already_forgotten,
                    r.redaction,
                    r.stream_entry,
                    Jsonb(r.error) if r.error is not None else None,
                )
                for s, p in pairs
                for r in p.receipts
            ],
        )
        _copy(
            cur,
            "engram_receipt_records",
            ("operation_id", "record_id", "revision", "status"),
            [
                (r.operation_id, ref.id, ref.revision, ref.status)
                for _, p in pairs
                for r in p.receipts
                for ref in r.refs
            ],
        )
        moved = [(p.scope_revision, s.scope_id) for s, p in pairs if p.scope_revision != s.revision]
        if moved:
            cur.execute(
                "UPDATE engram_scopes s SET revision = v.revision"
                " FROM unnest(%s::bigint[], %s::bigint[]) AS v(revision, id) WHERE s.id = v.id",
                ([m[0] for m in moved], [m[1] for m in moved]),
            )


def _forget(cur: psycopg.Cursor[Any], plans: list[tuple[int, Plan]], now: datetime) -> None:
    gone = [rid for _, p in plans for rid in p.forgotten_stored]
    if gone:
        cur.execute(
            "UPDATE engram_receipts SET request = NULL, redacted = true"
            " WHERE kind <> 'forget' AND operation_id IN"
            " (SELECT operation_id FROM engram_receipt_records WHERE record_id = ANY(%s))",
            (gone,),
        )
        for table, column in (
            ("engram_vectors", "record_id"),
            ("engram_links", "record_id"),
            ("engram_revisions", "record_id"),
            ("engram_records", "id"),
        ):
            cur.execute(f"DELETE FROM {table} WHERE {column} = ANY(%s)", (gone,))
    _copy(
        cur,
        "engram_forgotten",
        ("record_id", "scope_id", "forgotten_at", "operation_id"),
        [(rid, sid, now, op_id) for sid, p in plans for rid, op_id in p.tombstones],
    )


def _copy(
    cur: psycopg.Cursor[Any],
    table: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    binary_types: Sequence[str] | None = None,
) -> None:
    """Insert rows with COPY: one round trip and the cheapest path into PostgreSQL.

    Binary when the column types are given: a vector then travels as packed
    floats instead of being formatted and parsed as text.
    """
    if not rows:
        return
    binary = " WITH (FORMAT BINARY)" if binary_types else ""
    with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN{binary}") as copy:
        if binary_types:
            copy.set_types(list(binary_types))
        for row in rows:
            copy.write_row(row)


def _executemany(cur: psycopg.Cursor[Any], sql: str, rows: Iterable[Sequence[Any]]) -> None:
    params = list(rows)
    if params:
        cur.executemany(sql, params)


def _write_records(cur: psycopg.Cursor[Any], pairs: Pairs) -> None:
    _copy(
        cur,
        "engram_records",
        ("id", "scope_id", "revision", "status", "kind", "expires_at", "created_at", "updated_at"),
        [
            (
                c.id,
                s.scope_id,
                c.revision,
                c.status,
                c.kind,
                c.expires_at,
                c.created_at,
                c.created_at,
            )
            for s, p in pairs
            for rid, c in p.final.items()
            if rid not in s.records
        ],
    )
    _executemany(
        cur,
        "UPDATE engram_records SET revision = %s, status = %s, kind = %s, expires_at = %s,"
        " updated_at = clock_timestamp() WHERE id = %s AND scope_id = %s",
        [
            (c.revision, c.status, c.kind, c.expires_at, c.id, s.scope_id)
            for s, p in pairs
            for rid, c in p.final.items()
            if rid in s.records
        ],
    )


def _write_links(cur: psycopg.Cursor[Any], pairs: Pairs) -> None:
    changed = [rid for _, p in pairs for rid in p.links_changed]
    if not changed:
        return
    cur.execute("DELETE FROM engram_links WHERE record_id = ANY(%s)", (changed,))
    _copy(
        cur,
        "engram_links",
        ("scope_id", "record_id", "relation", "target_id"),
        [
            (s.scope_id, rid, link.relation, link.id)
            for s, p in pairs
            for rid in p.links_changed
            if (c := p.final.get(rid)) is not None
            for link in set(c.links)
        ],
    )


def _write_vectors(
    cur: psycopg.Cursor[Any], pairs: Pairs, gen_id: int | None, vectors: dict[str, np.ndarray]
) -> None:
    stale = [rid for s, p in pairs for rid in p.text_changed if rid in s.records]
    if stale:
        # A vector computed for an old text is never kept for a new one, in any generation.
        cur.execute("DELETE FROM engram_vectors WHERE record_id = ANY(%s)", (stale,))
    if gen_id is not None:
        _copy(
            cur,
            "engram_vectors",
            VECTOR_COLUMNS,
            [
                (
                    gen_id,
                    c.id,
                    s.scope_id,
                    c.revision,
                    c.digest,
                    c.status,
                    c.kind,
                    c.expires_at,
                    vectors[c.digest],
                )
                for s, p in pairs
                for rid in p.text_changed
                if (c := p.final.get(rid)) is not None and c.digest in vectors
            ],
            binary_types=VECTOR_TYPES,
        )
    # Same text, new revision (retract, metadata-only revise): the vector stays.
    _executemany(
        cur,
        "UPDATE engram_vectors SET revision = %s, status = %s, kind = %s, expires_at = %s"
        " WHERE record_id = %s AND digest = %s",
        [
            (c.revision, c.status, c.kind, c.expires_at, c.id, c.digest)
            for s, p in pairs
            for rid, c in p.final.items()
            if rid not in p.text_changed and rid in s.records
        ],
    )
