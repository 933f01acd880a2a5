"""Turning database rows into the store's values, and the SELECT lists that feed them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from .values import Link, Proposal, Receipt, Record, RecordRef, Scope, Source

# Columns of a revision joined with its scope: alias v = engram_revisions, s = engram_scopes.
REVISION_COLUMNS = """
    v.record_id, v.revision, s.key, v.text, v.kind, v.importance, v.metadata, v.origin,
    v.sources, v.links, v.status, v.digest, v.operation_id, v.recorded_at, v.expires_at
"""

# Whether receipt c's requested_by is authenticated: the server that verified a scoped
# token vouched for the operation under that name in its scope (s, the receipt's:
# store.tokens); else it is claimed.
VOUCHED = """EXISTS (SELECT 1 FROM engram_vouched_operations vo
            WHERE vo.scope_key = s.key AND vo.operation_id = c.operation_id
            AND vo.requested_by = c.requested_by)"""

# How many columns RECEIPT_COLUMNS selects: a query may select more after them.
RECEIPT_WIDTH = 19  # the columns RECEIPT_COLUMNS names
RECEIPT_COLUMNS = f"""
    c.operation_id, c.kind, s.key, c.scope_revision, c.committed_at, c.redacted,
    c.forgotten_revisions, c.already_forgotten, c.redaction, c.stream_entry, c.error,
    c.model_calls, c.requested_by, c.replays, c.last_replayed_at, c.redaction_reason, c.proposed,
    coalesce((SELECT json_agg(json_build_array(rr.record_id, rr.revision, rr.status)
                              ORDER BY rr.record_id, rr.revision)
              FROM engram_receipt_records rr
              WHERE rr.scope_id = c.scope_id AND rr.operation_id = c.operation_id), '[]'),
    {VOUCHED}
"""

_scope_cache: dict[str, Scope] = {}


def scope_from_key(key: str) -> Scope:
    scope = _scope_cache.get(key)
    if scope is None:
        import json

        scope = Scope.of(json.loads(key))
        if len(_scope_cache) < 10_000:
            _scope_cache[key] = scope
    return scope


def sources_from_json(items: Sequence[dict[str, Any]]) -> tuple[Source, ...]:
    return tuple(Source(**item) for item in items)


def links_from_json(items: Sequence[dict[str, Any]]) -> tuple[Link, ...]:
    return tuple(Link(relation=i["relation"], id=i["id"]) for i in items)


def record_from_row(row: Sequence[Any], superseded_by: Sequence[str] = ()) -> Record:
    (
        rid,
        revision,
        key,
        text,
        kind,
        importance,
        metadata,
        origin,
        sources,
        links,
        status,
        digest,
        operation_id,
        recorded_at,
        expires_at,
    ) = row[:15]
    return Record(
        id=rid,
        revision=revision,
        scope=scope_from_key(key),
        text=text,
        kind=kind,
        importance=importance,
        metadata=metadata,
        origin=origin,
        sources=sources_from_json(sources),
        links=links_from_json(links),
        status=status,
        digest=digest,
        operation_id=operation_id,
        recorded_at=recorded_at,
        expires_at=expires_at,
        superseded_by=tuple(superseded_by),
    )


def receipt_from_row(row: Sequence[Any]) -> Receipt:
    (
        op_id,
        kind,
        key,
        scope_revision,
        committed_at,
        redacted,
        forgotten_revisions,
        already_forgotten,
        redaction,
        stream_entry,
        error,
        model_calls,
        requested_by,
        replays,
        last_replayed_at,
        redaction_reason,
        proposed,
        refs,
        authenticated,
    ) = row[:RECEIPT_WIDTH]
    return Receipt(
        operation_id=op_id,
        kind=kind,
        scope=scope_from_key(key),
        scope_revision=scope_revision,
        committed_at=committed_at,
        redacted=redacted,
        records=tuple(RecordRef(r[0], r[1], r[2]) for r in refs),
        forgotten_revisions=tuple(forgotten_revisions) if forgotten_revisions is not None else None,
        already_forgotten=already_forgotten,
        redaction=redaction,
        redaction_reason=redaction_reason,
        stream_entry=stream_entry,
        error=error,
        model_calls=model_calls,
        requested_by=requested_by,
        proposed=tuple(Proposal.from_dict(p) for p in proposed or ()),
        replays=replays,
        last_replayed_at=last_replayed_at,
        authenticated=authenticated,
    )


def superseded_by(
    conn: psycopg.Connection[Any], scope_ids: Sequence[int], record_ids: Sequence[str]
) -> dict[str, list[str]]:
    """Ids of the live records in the same scope whose links supersede each of ``record_ids``.

    One query for a whole page of records (seed 003).
    """
    if not record_ids:
        return {}
    rows = conn.execute(
        """
        SELECT l.target_id, l.record_id
        FROM engram_links l
        JOIN engram_records r ON r.scope_id = l.scope_id AND r.id = l.record_id
        WHERE l.scope_id = ANY(%s) AND l.target_id = ANY(%s) AND l.relation = 'supersedes'
          AND r.status = 'active' AND (r.expires_at IS NULL OR r.expires_at > now())
        ORDER BY l.record_id
        """,
        (list(set(scope_ids)), list(record_ids)),
    ).fetchall()
    out: dict[str, list[str]] = {}
    for target, source in rows:
        out.setdefault(target, []).append(source)
    return out
