"""Applying plans: load the state a batch names, then write every scope's plan.

Runs inside the writer's transaction. The writes of a batch are one statement
(a data-modifying CTE per table, each fed by arrays sent as binary
parameters), preceded only by the deletes a forget, a new text or new links
need. So neither the number of statements nor of round trips grows with the
number of scopes or operations in the batch."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import psycopg

from ..rows import REVISION_COLUMNS, record_from_row
from ..values import SCOPE_FIELDS
from . import wire
from .extraction import readable_sources
from .operations import Extract, Operation, OpKey, Remember
from .planner import Current, Plan, ScopeState, StoredReceipt
from .reconcile import Decision

Pairs = Sequence[tuple[ScopeState, Plan]]


# A stored receipt as the planner needs it, with the records it wrote or named (read
# for repeats only: a batch of first deliveries finds no receipt). Found by what
# identifies an operation: its scope and its id.
STORED_RECEIPTS = """
SELECT s.key, c.operation_id, c.request_digest, c.error, c.redacted,
       ARRAY(SELECT rr.record_id FROM engram_receipt_records rr
             WHERE rr.scope_id = c.scope_id AND rr.operation_id = c.operation_id
             UNION SELECT n.record_id FROM engram_receipt_named n
             WHERE n.scope_id = c.scope_id AND n.operation_id = c.operation_id)
FROM unnest(%b::text[], %b::text[]) AS k(scope_key, operation_id)
JOIN engram_scopes s ON s.key = k.scope_key
JOIN engram_receipts c ON c.scope_id = s.id AND c.operation_id = k.operation_id
"""


def _keys_param(keys: Sequence[OpKey]) -> tuple[list[str], list[str]]:
    return [k[0] for k in keys], [k[1] for k in keys]


def stored_receipts(
    conn: psycopg.Connection[Any], keys: Sequence[OpKey]
) -> dict[OpKey, StoredReceipt]:
    return _stored(conn.execute(STORED_RECEIPTS, _keys_param(keys)).fetchall())


def _stored(rows: Sequence[Sequence[Any]]) -> dict[OpKey, StoredReceipt]:
    return {(r[0], r[1]): StoredReceipt(r[1], r[2], r[3], r[4], frozenset(r[5])) for r in rows}


def referenced_ids(op: Operation, decision: Decision | None = None) -> list[str]:
    """The record ids an operation may read or write."""
    if decision is not None:
        created = [op.derived_id(i) for i in range(decision.creates)]
        return created + decision.targets
    r = op.request
    if isinstance(r, Remember):
        return [r.id or op.derived_id(0)]
    if isinstance(r, Extract):
        count = len(readable_sources(r.messages, r.trusted_tools, op.scope.chat_id))
        return [op.derived_id(i) for i in range(count)]
    return [r.id]


class Loading:
    """The reads of a batch, sent at once (one round trip in pipeline mode): lock
    every scope of the batch in key order, then read what its operations name."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        groups: dict[str, list[Operation]],
        decisions: Mapping[OpKey, Decision],
    ) -> None:
        self.groups = groups
        self.keys = sorted(groups)
        scopes = [groups[k][0].scope for k in self.keys]
        self.ids = {
            k: sorted(
                {rid for op in groups[k] for rid in referenced_ids(op, decisions.get(op.key))}
            )
            for k in self.keys
        }
        # A record id is its scope's: each is read in the scope that names it.
        named = [(k, i) for k in self.keys for i in self.ids[k]]
        named_keys, named_ids = [n[0] for n in named], [n[1] for n in named]
        self._locked = conn.execute(
            f"INSERT INTO engram_scopes (key, {', '.join(SCOPE_FIELDS)})"
            " SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[],"
            " %b::text[]) ORDER BY 1"
            " ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key RETURNING key, id, revision",
            [[sc.key for sc in scopes]] + [[getattr(sc, f) for sc in scopes] for f in SCOPE_FIELDS],
        )
        self._records = conn.execute(
            f"""
            SELECT r.scope_id, r.created_at, {REVISION_COLUMNS},
                   (SELECT array_agg(x.revision ORDER BY x.revision) FROM engram_revisions x
                    WHERE x.scope_id = r.scope_id AND x.record_id = r.id)
            FROM unnest(%b::text[], %b::text[]) AS k(scope_key, id)
            JOIN engram_scopes s ON s.key = k.scope_key
            JOIN engram_records r ON r.scope_id = s.id AND r.id = k.id
            JOIN engram_revisions v
              ON v.scope_id = r.scope_id AND v.record_id = r.id AND v.revision = r.revision
            """,
            (named_keys, named_ids),
        )
        self._forgotten = conn.execute(
            "SELECT s.key, f.record_id FROM unnest(%b::text[], %b::text[]) AS k(scope_key, id)"
            " JOIN engram_scopes s ON s.key = k.scope_key"
            " JOIN engram_forgotten f ON f.scope_id = s.id AND f.record_id = k.id",
            (named_keys, named_ids),
        )
        self._receipts = conn.execute(
            STORED_RECEIPTS, _keys_param([op.key for k in self.keys for op in groups[k]])
        )

    def states(self) -> list[ScopeState]:
        locked = {r[0]: (r[1], r[2]) for r in self._locked.fetchall()}
        records: dict[int, dict[str, Current]] = {}
        for r in self._records.fetchall():
            records.setdefault(r[0], {})[r[2]] = _current(r)
        forgotten: dict[str, set[str]] = {k: set() for k in self.keys}
        for key, record_id in self._forgotten.fetchall():
            forgotten[key].add(record_id)
        # Each scope's own: the same operation id in another scope is another operation.
        receipts: dict[str, dict[str, StoredReceipt]] = {k: {} for k in self.keys}
        for (key, op_id), stored in _stored(self._receipts.fetchall()).items():
            receipts[key][op_id] = stored
        states = []
        for key in self.keys:
            scope_id, revision = locked[key]
            states.append(
                ScopeState(
                    scope_id=scope_id,
                    scope=self.groups[key][0].scope,
                    revision=revision,
                    records=records.get(scope_id, {}),
                    forgotten=forgotten[key],
                    receipts=receipts[key],
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

Columns = tuple[tuple[str, str], ...]

# Each table's rows: (column, PostgreSQL type) in the order rows are built.
REVISION_INSERT: Columns = (
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
    ("context", "text"),
    ("context_of", "text"),
)
RECORD_INSERT: Columns = (
    ("id", "text"),
    ("scope_id", "int8"),
    ("revision", "int4"),
    ("status", "text"),
    ("kind", "text"),
    ("expires_at", "timestamptz"),
    ("created_at", "timestamptz"),
    ("updated_at", "timestamptz"),
)
VECTOR_INSERT: Columns = (
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
RECEIPT_INSERT: Columns = (
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
    ("model_calls", "int4"),
    ("requested_by", "text"),
    ("proposed", "jsonb"),
)
RECEIPT_RECORD_INSERT: Columns = (
    ("scope_id", "int8"),
    ("operation_id", "text"),
    ("record_id", "text"),
    ("revision", "int4"),
    ("status", "text"),
)
RECEIPT_NAMED_INSERT: Columns = (
    ("scope_id", "int8"),
    ("operation_id", "text"),
    ("record_id", "text"),
)
TOMBSTONE_INSERT: Columns = (
    ("record_id", "text"),
    ("scope_id", "int8"),
    ("forgotten_at", "timestamptz"),
    ("operation_id", "text"),
)
LINK_INSERT: Columns = (
    ("scope_id", "int8"),
    ("record_id", "text"),
    ("relation", "text"),
    ("target_id", "text"),
)
# The updates: the new values first, then the columns that find the row.
RECORD_UPDATE: Columns = (
    ("revision", "int4"),
    ("status", "text"),
    ("kind", "text"),
    ("expires_at", "timestamptz"),
    ("id", "text"),
    ("scope_id", "int8"),
)
SUPERSEDED: Columns = (("scope_id", "int8"), ("record_id", "text"), ("revision", "int4"))
VECTOR_UPDATE: Columns = (
    ("revision", "int4"),
    ("status", "text"),
    ("kind", "text"),
    ("expires_at", "timestamptz"),
    ("scope_id", "int8"),
    ("record_id", "text"),
    ("digest", "text"),
)
SCOPE_UPDATE: Columns = (("revision", "int8"), ("id", "int8"))


def _rows_of(columns: Columns) -> str:
    """``unnest`` over one array parameter per column, as rows with those names.

    Parameters are binary (``wire``): vectors travel as packed floats and texts
    as they are, with no formatting or escaping of each element. JSON travels
    as text and an int4[] column as text literals (unnest would flatten a 2-D
    array); both are cast back here."""
    arrays = ", ".join(f"%b::{_sent_as(kind)}[]" for _, kind in columns)
    aliases = ", ".join(f"c{i}" for i in range(len(columns)))
    values = ", ".join(
        f"c{i}::{kind} AS {name}" if _sent_as(kind) != kind else f"c{i} AS {name}"
        for i, (name, kind) in enumerate(columns)
    )
    return f"(SELECT {values} FROM unnest({arrays}) AS t({aliases}))"


def _sent_as(kind: str) -> str:
    """The element type a column of ``kind`` travels as (``wire`` encodes it)."""
    return "text" if kind == "jsonb" or kind.endswith("[]") else kind


def _insert(table: str, columns: Columns) -> str:
    names = ", ".join(name for name, _ in columns)
    return f"INSERT INTO {table} ({names}) SELECT {names} FROM {_rows_of(columns)} AS v"


# One statement: every CTE runs on the same snapshot, so each touches rows no
# other one does (the deletes that would clash run before it).
WRITE = f"""
WITH revisions AS ({_insert("engram_revisions", REVISION_INSERT)}),
superseded AS (
    UPDATE engram_revisions r SET current = false FROM {_rows_of(SUPERSEDED)} AS v
    WHERE r.scope_id = v.scope_id AND r.record_id = v.record_id AND r.revision < v.revision
        AND r.current
),
new_records AS ({_insert("engram_records", RECORD_INSERT)}),
records AS (
    UPDATE engram_records r SET revision = v.revision, status = v.status, kind = v.kind,
        expires_at = v.expires_at, updated_at = clock_timestamp()
    FROM {_rows_of(RECORD_UPDATE)} AS v WHERE r.id = v.id AND r.scope_id = v.scope_id
),
links AS ({_insert("engram_links", LINK_INSERT)}),
vectors AS ({_insert("engram_vectors", VECTOR_INSERT)}),
-- A kept vector's new row version is fresh again: settled, it would be inserted into its
-- scope's HNSW graph here, on the write path (store/vectors/vector_indexes.py).
kept_vectors AS (
    UPDATE engram_vectors x SET revision = v.revision, status = v.status, kind = v.kind,
        expires_at = v.expires_at, settled = false
    FROM {_rows_of(VECTOR_UPDATE)} AS v
    WHERE x.scope_id = v.scope_id AND x.record_id = v.record_id AND x.digest = v.digest
),
receipts AS ({_insert("engram_receipts", RECEIPT_INSERT)}),
receipt_records AS ({_insert("engram_receipt_records", RECEIPT_RECORD_INSERT)}),
receipt_named AS ({_insert("engram_receipt_named", RECEIPT_NAMED_INSERT)}),
tombstones AS ({_insert("engram_forgotten", TOMBSTONE_INSERT)}),
scopes AS (
    UPDATE engram_scopes s SET revision = v.revision FROM {_rows_of(SCOPE_UPDATE)} AS v
    WHERE s.id = v.id
)
SELECT 1
"""


def _numbered(query: str) -> str:
    """``%b`` placeholders as ``$1``, ``$2``...: a raw cursor parses no placeholders
    (psycopg would parse a statement this long, with this many, at every execution)."""
    parts = query.split("%b")
    return "".join(f"{part}${i}" for i, part in enumerate(parts[:-1], 1)) + parts[-1]


WRITE_NUMBERED = _numbered(WRITE)


def write_plans(
    conn: psycopg.Connection[Any],
    pairs: Pairs,
    now: datetime,
    gen_id: int | None,
    vectors: dict[str, np.ndarray],
) -> None:
    """Write every scope's plan (in pipeline mode, with no round trip of its own)."""
    with conn.cursor() as cur:
        _delete_replaced(cur, pairs)
    tables: list[tuple[Columns, list[tuple[Any, ...]]]] = [
        (REVISION_INSERT, _revisions(pairs)),
        (
            SUPERSEDED,
            [
                (s.scope_id, rid, c.revision)
                for s, p in pairs
                for rid, c in p.final.items()
                if rid in s.records
            ],
        ),
        *_records(pairs),
        (LINK_INSERT, _links(pairs)),
        *_vectors(pairs, gen_id, vectors),
        (RECEIPT_INSERT, _receipts(pairs)),
        (
            RECEIPT_RECORD_INSERT,
            [
                (s.scope_id, r.operation_id, ref.id, ref.revision, ref.status)
                for s, p in pairs
                for r in p.receipts
                for ref in r.refs
            ],
        ),
        (
            RECEIPT_NAMED_INSERT,
            [
                (s.scope_id, r.operation_id, rid)
                for s, p in pairs
                for r in p.receipts
                for rid in r.named
            ],
        ),
        (
            TOMBSTONE_INSERT,
            [(rid, s.scope_id, now, op_id) for s, p in pairs for rid, op_id in p.tombstones],
        ),
        (
            SCOPE_UPDATE,
            [(p.scope_revision, s.scope_id) for s, p in pairs if p.scope_revision != s.revision],
        ),
    ]
    params: list[wire.Column] = []
    for columns, rows in tables:
        values = list(zip(*rows, strict=True)) if rows else [() for _ in columns]
        params += [
            wire.column(_sent_as(kind), column)
            for (_, kind), column in zip(columns, values, strict=True)
        ]
    with psycopg.RawCursor(conn) as raw:
        raw.execute(WRITE_NUMBERED, params)


def _delete_replaced(cur: psycopg.Cursor[Any], pairs: Pairs) -> None:
    """What the batch replaces: a forgotten record everywhere in its scope (the receipts
    that wrote or named it redacted: request and digest erased), the vectors of a changed
    text, the links of changed links. Each row is found by its scope and record id: the
    same id in another scope is another record, untouched."""
    gone = _keyed([(s.scope_id, rid) for s, p in pairs for rid in p.forgotten_stored])
    if gone[0]:
        cur.execute(
            "UPDATE engram_receipts SET request = NULL, request_digest = '', redacted = true"
            " WHERE kind <> 'forget' AND (scope_id, operation_id) IN"
            " (SELECT rr.scope_id, rr.operation_id FROM engram_receipt_records rr"
            f" JOIN {_KEYS} ON rr.scope_id = k.scope_id AND rr.record_id = k.record_id"
            " UNION ALL"
            " SELECT n.scope_id, n.operation_id FROM engram_receipt_named n"
            f" JOIN {_KEYS} ON n.scope_id = k.scope_id AND n.record_id = k.record_id)",
            (*gone, *gone),
        )
        # No other record's index entry keeps a forgotten text's words (migration 018).
        cur.execute(
            "UPDATE engram_revisions x SET context = NULL, context_of = NULL"
            f" FROM {_KEYS} WHERE x.scope_id = k.scope_id AND x.context_of = k.record_id",
            gone,
        )
        for table, column in (
            ("engram_vectors", "record_id"),
            ("engram_links", "record_id"),
            ("engram_revisions", "record_id"),
            ("engram_records", "id"),
        ):
            cur.execute(
                f"DELETE FROM {table} x USING {_KEYS}"
                f" WHERE x.scope_id = k.scope_id AND x.{column} = k.record_id",
                gone,
            )
    stale = _keyed(
        [(s.scope_id, rid) for s, p in pairs for rid in p.text_changed if rid in s.records]
    )
    if stale[0]:
        # A vector computed for an old text is never kept for a new one, in any generation.
        cur.execute(
            f"DELETE FROM engram_vectors x USING {_KEYS}"
            " WHERE x.scope_id = k.scope_id AND x.record_id = k.record_id",
            stale,
        )
    relinked = _keyed([(s.scope_id, rid) for s, p in pairs for rid in p.links_changed])
    if relinked[0]:
        cur.execute(
            f"DELETE FROM engram_links x USING {_KEYS}"
            " WHERE x.scope_id = k.scope_id AND x.record_id = k.record_id",
            relinked,
        )


# Records named by (scope id, record id), sent as two arrays.
_KEYS = "unnest(%b::int8[], %b::text[]) AS k(scope_id, record_id)"


def _keyed(keys: Sequence[tuple[int, str]]) -> tuple[list[int], list[str]]:
    return [k[0] for k in keys], [k[1] for k in keys]


def _revisions(pairs: Pairs) -> list[tuple[Any, ...]]:
    return [
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
            w.context,
            w.context_of,
        )
        for s, p in pairs
        for w in p.revisions
        for c in (w.record,)
    ]


def _records(pairs: Pairs) -> list[tuple[Columns, list[tuple[Any, ...]]]]:
    new, changed = [], []
    for s, p in pairs:
        for rid, c in p.final.items():
            if rid in s.records:
                changed.append((c.revision, c.status, c.kind, c.expires_at, c.id, s.scope_id))
            else:
                new.append(
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
                )
    return [(RECORD_INSERT, new), (RECORD_UPDATE, changed)]


def _links(pairs: Pairs) -> list[tuple[Any, ...]]:
    return [
        (s.scope_id, rid, link.relation, link.id)
        for s, p in pairs
        for rid in p.links_changed
        if (c := p.final.get(rid)) is not None
        for link in set(c.links)
    ]


def _vectors(
    pairs: Pairs, gen_id: int | None, vectors: dict[str, np.ndarray]
) -> list[tuple[Columns, list[tuple[Any, ...]]]]:
    new = [
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
    ]
    # Same text, new revision (retract, metadata-only revise): the vector stays.
    kept = [
        (c.revision, c.status, c.kind, c.expires_at, s.scope_id, c.id, c.digest)
        for s, p in pairs
        for rid, c in p.final.items()
        if rid not in p.text_changed and rid in s.records
    ]
    return [(VECTOR_INSERT, new if gen_id is not None else []), (VECTOR_UPDATE, kept)]


def _receipts(pairs: Pairs) -> list[tuple[Any, ...]]:
    return [
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
            r.model_calls,
            r.requested_by,
            _json([x.as_dict() for x in r.proposed]) if r.proposed else None,
        )
        for s, p in pairs
        for r in p.receipts
    ]


def note_replays(conn: psycopg.Connection[Any], pairs: Pairs, now: datetime) -> None:
    """Count the operations this batch answered from their stored receipts, on those
    receipts (so replays can be found later). A batch of first deliveries sends nothing."""
    replayed = [(s.scope_id, op_id) for s, p in pairs for op_id in p.replayed]
    if replayed:
        conn.execute(
            "UPDATE engram_receipts c SET replays = replays + 1, last_replayed_at = %b"
            " FROM unnest(%b::int8[], %b::text[]) AS k(scope_id, operation_id)"
            " WHERE c.scope_id = k.scope_id AND c.operation_id = k.operation_id",
            (now, [k[0] for k in replayed], [k[1] for k in replayed]),
        )


# One encoder for every call: json.dumps with options builds a new one each time.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _json(value: Any) -> str:
    if type(value) in (dict, list) and not value:  # most metadata, sources and links
        return "{}" if type(value) is dict else "[]"
    return _ENCODER.encode(value)


def _int_array(values: Sequence[int] | None) -> str | None:
    return None if values is None else "{" + ",".join(str(int(v)) for v in values) + "}"
