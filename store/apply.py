"""Applying a plan: load the state a batch names, then write the plan with a few
set-based statements (COPY for the inserts). Runs inside the writer's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from .extraction import readable_sources
from .operations import Extract, Operation, Remember, derived_record_id
from .planner import Current, Plan, ScopeState, StoredReceipt
from .rows import REVISION_COLUMNS, record_from_row


def stored_receipts(conn: psycopg.Connection[Any], op_ids: list[str]) -> dict[str, StoredReceipt]:
    rows = conn.execute(
        "SELECT operation_id, request_digest FROM engram_receipts WHERE operation_id = ANY(%s)",
        (op_ids,),
    ).fetchall()
    return {r[0]: StoredReceipt(r[0], r[1]) for r in rows}


def _referenced_ids(op: Operation) -> list[str]:
    r = op.request
    if isinstance(r, Remember):
        return [r.id or derived_record_id(op.operation_id, 0)]
    if isinstance(r, Extract):
        count = len(readable_sources(r.messages, r.trusted_tools, op.scope.chat_id))
        return [derived_record_id(op.operation_id, i) for i in range(count)]
    return [r.id]


def load_state(conn: psycopg.Connection[Any], ops: list[Operation]) -> ScopeState:
    scope = ops[0].scope
    fields = scope.as_dict()
    row = conn.execute(
        "INSERT INTO engram_scopes (key, user_id, agent_id, run_id, actor_id, chat_id)"
        " VALUES (%s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key RETURNING id, revision",
        (
            scope.key,
            fields.get("user_id"),
            fields.get("agent_id"),
            fields.get("run_id"),
            fields.get("actor_id"),
            fields.get("chat_id"),
        ),
    ).fetchone()
    assert row is not None
    scope_id, revision = row
    ids = sorted({rid for op in ops for rid in _referenced_ids(op)})
    records: dict[str, Current] = {}
    taken: set[str] = set()
    for r in conn.execute(
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
    ).fetchall():
        if r[0] != scope_id:
            taken.add(r[2])
            continue
        rec = record_from_row(r[2:17])
        records[rec.id] = Current(
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
            created_at=r[1],
            revisions=tuple(r[17]),
        )
    forgotten: set[str] = set()
    for rid, owner in conn.execute(
        "SELECT record_id, scope_id FROM engram_forgotten WHERE record_id = ANY(%s)", (ids,)
    ).fetchall():
        (forgotten if owner == scope_id else taken).add(rid)
    receipts = stored_receipts(conn, [op.operation_id for op in ops])
    return ScopeState(
        scope_id=scope_id,
        scope=scope,
        revision=revision,
        records=records,
        taken=taken,
        forgotten=forgotten,
        receipts=receipts,
    )


def write_plan(
    conn: psycopg.Connection[Any],
    state: ScopeState,
    plan: Plan,
    now: datetime,
    gen_id: int | None,
    vectors: dict[str, np.ndarray],
) -> None:
    sid = state.scope_id
    with conn.cursor() as cur:
        if plan.forgotten_stored:
            gone = plan.forgotten_stored
            cur.execute(
                "UPDATE engram_receipts SET request = NULL, redacted = true"
                " WHERE kind <> 'forget' AND operation_id IN"
                " (SELECT operation_id FROM engram_receipt_records WHERE record_id = ANY(%s))",
                (gone,),
            )
            cur.execute("DELETE FROM engram_vectors WHERE record_id = ANY(%s)", (gone,))
            cur.execute("DELETE FROM engram_links WHERE record_id = ANY(%s)", (gone,))
            cur.execute("DELETE FROM engram_revisions WHERE record_id = ANY(%s)", (gone,))
            cur.execute("DELETE FROM engram_records WHERE id = ANY(%s)", (gone,))
        if plan.tombstones:
            _copy(
                cur,
                "engram_forgotten",
                ("record_id", "scope_id", "forgotten_at", "operation_id"),
                [(rid, sid, now, op_id) for rid, op_id in plan.tombstones],
            )
        if plan.revisions:
            _write_revisions(cur, state, plan)
        _write_records(cur, state, plan)
        _write_links(cur, sid, plan)
        _write_vectors(cur, state, plan, gen_id, vectors)
        _copy(
            cur,
            "engram_receipts",
            (
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
            ),
            [
                (
                    r.operation_id,
                    sid,
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
                )
                for r in plan.receipts
            ],
        )
        refs = [
            (r.operation_id, ref.id, ref.revision, ref.status)
            for r in plan.receipts
            for ref in r.refs
        ]
        _copy(
            cur, "engram_receipt_records", ("operation_id", "record_id", "revision", "status"), refs
        )
        cur.execute(
            "UPDATE engram_scopes SET revision = %s WHERE id = %s", (plan.scope_revision, sid)
        )


VECTOR_COPY_TYPES = (
    "int4",
    "text",
    "int8",
    "int4",
    "text",
    "text",
    "text",
    "timestamptz",
    "vector",
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


def _write_revisions(cur: psycopg.Cursor[Any], state: ScopeState, plan: Plan) -> None:
    sid = state.scope_id
    _copy(
        cur,
        "engram_revisions",
        (
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
        ),
        [
            (
                c.id,
                c.revision,
                sid,
                c.text,
                c.kind,
                c.importance,
                Jsonb(c.metadata),
                c.origin,
                Jsonb([s.as_dict() for s in c.sources]),
                Jsonb([link.as_dict() for link in c.links]),
                c.status,
                c.digest,
                w.operation_id,
                w.recorded_at,
                c.expires_at,
                plan.final[c.id].revision == c.revision,
            )
            for w in plan.revisions
            for c in (w.record,)
        ],
    )
    superseded = [(rid, c.revision) for rid, c in plan.final.items() if rid in state.records]
    if superseded:
        cur.executemany(
            "UPDATE engram_revisions SET current = false"
            " WHERE record_id = %s AND revision < %s AND current",
            superseded,
        )


def _write_records(cur: psycopg.Cursor[Any], state: ScopeState, plan: Plan) -> None:
    new = [c for rid, c in plan.final.items() if rid not in state.records]
    old = [c for rid, c in plan.final.items() if rid in state.records]
    if new:
        _copy(
            cur,
            "engram_records",
            (
                "id",
                "scope_id",
                "revision",
                "status",
                "kind",
                "expires_at",
                "created_at",
                "updated_at",
            ),
            [
                (
                    c.id,
                    state.scope_id,
                    c.revision,
                    c.status,
                    c.kind,
                    c.expires_at,
                    c.created_at,
                    c.created_at,
                )
                for c in new
            ],
        )
    if old:
        cur.executemany(
            "UPDATE engram_records SET revision = %s, status = %s, kind = %s, expires_at = %s,"
            " updated_at = clock_timestamp() WHERE id = %s AND scope_id = %s",
            [(c.revision, c.status, c.kind, c.expires_at, c.id, state.scope_id) for c in old],
        )


def _write_links(cur: psycopg.Cursor[Any], scope_id: int, plan: Plan) -> None:
    if not plan.links_changed:
        return
    cur.execute("DELETE FROM engram_links WHERE record_id = ANY(%s)", (list(plan.links_changed),))
    rows = [
        (scope_id, rid, link.relation, link.id)
        for rid in plan.links_changed
        if (c := plan.final.get(rid)) is not None
        for link in set(c.links)
    ]
    _copy(cur, "engram_links", ("scope_id", "record_id", "relation", "target_id"), rows)


def _write_vectors(
    cur: psycopg.Cursor[Any],
    state: ScopeState,
    plan: Plan,
    gen_id: int | None,
    vectors: dict[str, np.ndarray],
) -> None:
    stale = [rid for rid in plan.text_changed if rid in state.records]
    if stale:
        # A vector computed for an old text is never kept for a new one, in any generation.
        cur.execute("DELETE FROM engram_vectors WHERE record_id = ANY(%s)", (stale,))
    fresh = [
        (
            gen_id,
            c.id,
            state.scope_id,
            c.revision,
            c.digest,
            c.status,
            c.kind,
            c.expires_at,
            vectors[c.digest],
        )
        for rid in plan.text_changed
        if (c := plan.final.get(rid)) is not None and c.digest in vectors
    ]
    if gen_id is not None:
        _copy(
            cur,
            "engram_vectors",
            (
                "generation_id",
                "record_id",
                "scope_id",
                "revision",
                "digest",
                "status",
                "kind",
                "expires_at",
                "embedding",
            ),
            fresh,
            binary_types=VECTOR_COPY_TYPES,
        )
    moved = [
        (c.revision, c.status, c.kind, c.expires_at, c.id, c.digest)
        for rid, c in plan.final.items()
        if rid not in plan.text_changed and rid in state.records
    ]
    if moved:
        # Same text, new revision (retract, metadata-only revise): the vector stays.
        cur.executemany(
            "UPDATE engram_vectors SET revision = %s, status = %s, kind = %s, expires_at = %s"
            " WHERE record_id = %s AND digest = %s",
            moved,
        )
