"""The JSON shapes of the HTTP API (``openapi.py`` describes exactly these)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from engram.jobs.progress import progress_of
from engram.store import (
    AuditEntry,
    GenerationItem,
    Hit,
    Page,
    ReceiptItem,
    Record,
    RecordItem,
    ScopeRow,
    Tombstone,
)
from engram.store.read.find import Findings, Found

from ..rqjobs import JobRow, QueueSummary

T = TypeVar("T")


def page_json(page: Page[T], item: Callable[[T], dict[str, Any]]) -> dict[str, Any]:
    return {"items": [item(i) for i in page.items], "next": page.next}


def time_json(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def revision_json(r: Record) -> dict[str, Any]:
    return r.as_dict()


def record_json(item: RecordItem) -> dict[str, Any]:
    return {
        **revision_json(item.record),
        "scope_id": item.scope_id,
        "expired": item.expired,
        "superseded_by": list(item.record.superseded_by),
    }


def hit_json(hit: Hit, rank: int) -> dict[str, Any]:
    return {
        "record": revision_json(hit.record),
        "score": hit.score,
        "match": hit.match,
        "superseded_by": list(hit.record.superseded_by),
        "rank": rank,
        "relevance": hit.relevance,
        "vector_rank": hit.vector_rank,
        "lexical_rank": hit.lexical_rank,
    }


def findings_json(findings: Findings) -> dict[str, Any]:
    return {"hits": [found_json(f) for f in findings.hits], "more": findings.more}


def found_json(found: Found) -> dict[str, Any]:
    return {
        "record_id": found.record_id,
        "scope_id": found.scope_id,
        "scope": found.scope.as_dict(),
        "status": found.status,
        "expired": found.expired,
        "snippet": found.snippet_text,
    }


def receipt_json(item: ReceiptItem) -> dict[str, Any]:
    r = item.receipt
    forget = r.kind == "forget"
    return {
        "operation_id": r.operation_id,
        "kind": r.kind,
        "scope": r.scope.as_dict(),
        "scope_id": item.scope_id,
        "scope_revision": r.scope_revision,
        "committed_at": time_json(r.committed_at),
        "records": [ref.as_dict() for ref in r.records],
        "redacted": r.redacted,
        "revisions": list(r.forgotten_revisions or ()) if forget else None,
        "already_forgotten": bool(r.already_forgotten) if forget else None,
        "redaction": r.redaction if forget else None,
        "redaction_reason": r.redaction_reason if forget else None,
        "model_calls": r.model_calls,
        "proposed": [p.as_dict() for p in r.proposed],
        "requested_by": r.requested_by,
        "authenticated": r.authenticated,
        "replays": r.replays,
        "last_replayed_at": time_json(r.last_replayed_at),
        "stream_entry": r.stream_entry,
        "error": r.error,
    }


def scope_json(row: ScopeRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "scope": row.scope.as_dict(),
        "revision": row.revision,
        "records": row.records,
        "forgotten": row.forgotten,
        "last_write": time_json(row.last_write),
    }


def tombstone_json(t: Tombstone) -> dict[str, Any]:
    return {
        "record_id": t.record_id,
        "scope_id": t.scope_id,
        "forgotten_at": time_json(t.forgotten_at),
        "operation_id": t.operation_id,
        "requested_by": t.requested_by,
    }


def generation_json(item: GenerationItem) -> dict[str, Any]:
    g = item.generation
    progress = progress_of(g.progress)
    return {
        "id": g.id,
        "model_id": g.model_id,
        "dims": g.dims,
        "status": g.status,
        "created_at": time_json(g.created_at),
        "activated_at": time_json(g.activated_at),
        "vectors": item.vectors,
        "progress": progress.as_dict() if progress is not None else None,
    }


def job_json(job: JobRow) -> dict[str, Any]:
    return {
        "id": job.id,
        "queue": job.queue,
        "state": job.state,
        "function": job.function,
        "created_at": time_json(job.created_at),
        "enqueued_at": time_json(job.enqueued_at),
        "started_at": time_json(job.started_at),
        "ended_at": time_json(job.ended_at),
        "error": job.error,
        "traceback": job.traceback,
        "arguments": job.arguments,
    }


def queue_json(summary: QueueSummary) -> dict[str, Any]:
    return {"name": summary.name, "counts": summary.counts}


def audit_json(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "at": time_json(entry.at),
        "requested_by": entry.requested_by,
        "action": entry.action,
        "target": entry.target,
        "detail": entry.detail,
    }


def listed(items: Iterable[T], item: Callable[[T], dict[str, Any]]) -> list[dict[str, Any]]:
    return [item(i) for i in items]
