"""Applying plans: load the state a batch names, then write every scope's plan
with one set-based statement per table (COPY for the inserts). Runs inside the
writer's transaction; the number of round trips does not grow with the number
of scopes or operations in the batch."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import psycopg

from .extraction import readable_sources
from .model import SCOPE_FIELDS
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


class Loading:
    """The reads of a batch, sent at once (one round trip in pipeline mode): lock
    every scope of the batch in key order, then read what its operations name."""

    def __init__(self, conn: psycopg.Connection[Any], groups: dict[str, list[Operation]]) -> None:
        self.groups = groups
        self.keys = sorted(groups)
        scopes = [groups[k][0].scope for k in self.keys]
        self.ids = {
            k: sorted({rid for op in groups[k] for rid in referenced_ids(op)}) for k in self.keys
        }
        every_id = sorted({i for v in self.ids.values() for i in v})
        self._locked = conn.execute(
            f"INSERT INTO engram_scopes (key, {', '.join(SCOPE_FIELDS)})"
            " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[],"
            " %s::text[]) ORDER BY 1"
            " ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key RETURNING key, id, revision",
            [[sc.key for sc in scopes]] + [[getattr(sc, f) for sc in scopes] for f in SCOPE_FIELDS],
        )
        self._records = conn.execute(
            f"""
            SELECT r.scope_id, r.created_at, {REVISION_COLUMNS},
                   (SELECT array_agg(x.revision ORDER BY x.revision)
                    FROM engram_revisions x WHERE x.record_id = r.id)
            FROM engram_records r
            JOIN engram_revisions v ON v.record_id = r.id AND v.revision = r.revision
            JOIN engram_scopes s ON s.id = r.scope_id
            WHERE r.id = ANY(%s)
            """,
            (every_id,),
        )
        self._forgotten = conn.execute(
            "SELECT record_id, scope_id FROM engram_forgotten WHERE record_id = ANY(%s)",
            (every_id,),
        )
        self._receipts = conn.execute(
            "SELECT operation_id, request_digest, error FROM engram_receipts"
            " WHERE operation_id = ANY(%s)",
            ([op.operation_id for k in self.keys for op in groups[k]],),
        )

    def states(self) -> list[ScopeState]:
        locked = {r[0]: (r[1], r[2]) for r in self._locked.fetchall()}
        records = {r[2]: (r[0], _current(r)) for r in self._records.fetchall()}
        forgotten = {r[0]: r[1] for r in self._forgotten.fetchall()}
        # One dict for the whole batch: an id committed by one scope's plan is seen
        # by the next (a repeat in another scope is a conflict).
        receipts = {r[0]: StoredReceipt(r[0], r[1], r[2]) for r in self._receipts.fetchall()}
        states = []
        for key in self.keys:
            scope_id, revision = locked[key]
            ids = self.ids[key]
            mine = {
                i: row[1] for i in ids if (row := records.get(i)) is not None and row[0] == scope_id
            }
            taken = {i for i in ids if i in records and i not in mine}
            taken |= {i for i in ids if forgotten.get(i, scope_id) != scope_id}
            states.append(
                ScopeState(
                    scope_id=scope_id,
                    scope=self.groups[key][0].scope,
                    revision=revision,
                    records=mine,
                    taken=taken,
                    forgotten={i for i in ids if forgotten.get(i) == scope_id},
                    receipts=receipts,
                )
            )
        return states


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

# Each table's insert: (column, PostgreSQL type) in the order rows are built.
REVISION_INSERT = (
    ("record_id", "text"),
    ("revision", "int4"),
    ("scope_id", "int8"),
    ("text", "text"),
    ("kind", "text"),
    ("importance", "float4"),
    ("metadata", "jsonb"),
    ("origin", "text"),
    ("sources", "jsonb"),
    ("links", "jsonb"),
    ("status", "text"),
    ("digest", "text"),
    ("operation_id", "text"),
    ("recorded_at", "timestamptz"),
    ("expires_at", "timestamptz"),
    ("current", "bool"),
)
RECORD_INSERT = (
    ("id", "text"),
    ("scope_id", "int8"),
    ("revision", "int4"),
    ("status", "text"),
    ("kind", "text"),
    ("expires_at", "timestamptz"),
    ("created_at", "timestamptz"),
    ("updated_at", "timestamptz"),
)
VECTOR_INSERT = (
    ("generation_id", "int4"),
    ("record_id", "text"),
    ("scope_id", "int8"),
    ("revision", "int4"),
    ("digest", "text"),
    ("status", "text"),
    ("kind", "text"),
    ("expires_at", "timestamptz"),
    ("embedding", "vector"),
)
RECEIPT_INSERT = (
    ("operation_id", "text"),
    ("scope_id", "int8"),
    ("kind", "text"),
    ("request_digest", "text"),
    ("scope_revision", "int8"),
    ("committed_at", "timestamptz"),
    ("request", "jsonb"),
    ("redacted", "bool"),
    ("forgotten_revisions", "int4[]"),
    ("already_forgotten", "bool"),
    ("redaction", "text"),
    ("stream_entry", "text"),
    ("error", "jsonb"),
)
RECEIPT_RECORD_INSERT = (
    ("operation_id", "text"),
    ("record_id", "text"),
    ("revision", "int4"),
    ("status", "text"),
)
TOMBSTONE_INSERT = (
    ("record_id", "text"),
    ("scope_id", "int8"),
    ("forgotten_at", "timestamptz"),
    ("operation_id", "text"),
)
LINK_INSERT = (
    ("scope_id", "int8"),
    ("record_id", "text"),
    ("relation", "text"),
    ("target_id", "text"),
)


def write_plans(
    conn: psycopg.Connection[Any],
    pairs: Pairs,
    now: datetime,
    gen_id: int | None,
    vectors: dict[str, np.ndarray],
    *,
    copy: bool,
) -> None:
    """Write every scope's plan: with ``copy``, inserts go by COPY (fastest for many
    rows); without, as statements a pipeline sends in one round trip (fastest for few)."""
    with conn.cursor() as cur:
        _insert = _copy_rows if copy else _insert_rows
        _forget(cur, [(s.scope_id, p) for s, p in pairs], now, _insert)
        _insert(
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
                    _json(c.metadata),
                    c.origin,
                    _json([x.as_dict() for x in c.sources]),
                    _json([link.as_dict() for link in c.links]),
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
        _write_records(cur, pairs, _insert)
        _write_links(cur, pairs, _insert)
        _write_vectors(cur, pairs, gen_id, vectors, _insert)
        _insert(
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
                    _json(r.request) if r.request is not None else None,
                    r.redacted,
                    _int_array(r.forgotten_revisions),
                    r.already_forgotten,
                    r.redaction,
                    r.stream_entry,
                    _json(r.error) if r.error is not None else None,
                )
                for s, p in pairs
                for r in p.receipts
            ],
        )
        _insert(
            cur,
            "engram_receipt_records",
            RECEIPT_RECORD_INSERT,
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


def _forget(
    cur: psycopg.Cursor[Any], plans: list[tuple[int, Plan]], now: datetime, _insert: Inserter
) -> None:
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
    _insert(
        cur,
        "engram_forgotten",
        TOMBSTONE_INSERT,
        [(rid, sid, now, op_id) for sid, p in plans for rid, op_id in p.tombstones],
    )


Inserter = Callable[
    [psycopg.Cursor[Any], str, Sequence[tuple[str, str]], Sequence[Sequence[Any]]], None
]


def _copy_rows(
    cur: psycopg.Cursor[Any],
    table: str,
    columns: Sequence[tuple[str, str]],
    rows: Sequence[Sequence[Any]],
) -> None:
    """Insert rows with COPY (not allowed in pipeline mode). Binary for vectors, which
    then travel as packed floats; text otherwise (JSON strings go in as they are)."""
    if not rows:
        return
    names = ", ".join(name for name, _ in columns)
    binary = any(kind == "vector" for _, kind in columns)
    options = " WITH (FORMAT BINARY)" if binary else ""
    with cur.copy(f"COPY {table} ({names}) FROM STDIN{options}") as copy:
        if binary:
            copy.set_types([kind for _, kind in columns])
        for row in rows:
            copy.write_row(row)


def _insert_rows(
    cur: psycopg.Cursor[Any],
    table: str,
    columns: Sequence[tuple[str, str]],
    rows: Sequence[Sequence[Any]],
) -> None:
    """Insert rows as one statement over arrays, one per column: a single round trip
    (none of its own in pipeline mode) whatever the number of rows."""
    if not rows:
        return
    names = ", ".join(name for name, _ in columns)
    # Binary parameters: vectors travel as packed floats and texts as they are, with
    # no formatting or escaping of each element. An int4[] column travels as text
    # literals (unnest would flatten a 2-D array); JSON as text, cast on the server.
    arrays = ", ".join(
        "%b::text[]"
        if kind.endswith("[]") or kind == "jsonb"
        else "%b"
        if kind == "vector"
        else f"%b::{kind}[]"
        for _, kind in columns
    )
    casts = ", ".join(
        f"c{i}::{kind}" if kind.endswith("[]") or kind == "jsonb" else f"c{i}"
        for i, (_, kind) in enumerate(columns)
    )
    aliases = ", ".join(f"c{i}" for i in range(len(columns)))
    cur.execute(
        f"INSERT INTO {table} ({names}) SELECT {casts} FROM unnest({arrays}) AS t({aliases})",
        [list(column) for column in zip(*rows, strict=True)],
    )


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _int_array(values: Sequence[int] | None) -> str | None:
    return None if values is None else "{" + ",".join(str(int(v)) for v in values) + "}"


def _executemany(cur: psycopg.Cursor[Any], sql: str, rows: Iterable[Sequence[Any]]) -> None:
    params = list(rows)
    if params:
        cur.executemany(sql, params)


def _write_records(cur: psycopg.Cursor[Any], pairs: Pairs, _insert: Inserter) -> None:
    _insert(
        cur,
        "engram_records",
        RECORD_INSERT,
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


def _write_links(cur: psycopg.Cursor[Any], pairs: Pairs, _insert: Inserter) -> None:
    changed = [rid for _, p in pairs for rid in p.links_changed]
    if not changed:
        return
    cur.execute("DELETE FROM engram_links WHERE record_id = ANY(%s)", (changed,))
    _insert(
        cur,
        "engram_links",
        LINK_INSERT,
        [
            (s.scope_id, rid, link.relation, link.id)
            for s, p in pairs
            for rid in p.links_changed
            if (c := p.final.get(rid)) is not None
            for link in set(c.links)
        ],
    )


def _write_vectors(
    cur: psycopg.Cursor[Any],
    pairs: Pairs,
    gen_id: int | None,
    vectors: dict[str, np.ndarray],
    _insert: Inserter,
) -> None:
    stale = [rid for s, p in pairs for rid in p.text_changed if rid in s.records]
    if stale:
        # A vector computed for an old text is never kept for a new one, in any generation.
        cur.execute("DELETE FROM engram_vectors WHERE record_id = ANY(%s)", (stale,))
    if gen_id is not None:
        _insert(
            cur,
            "engram_vectors",
            VECTOR_INSERT,
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
