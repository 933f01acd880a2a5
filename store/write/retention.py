"""Retention: pruning history and receipts. Both cutoffs are exclusive."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from ..values import Scope

log = logging.getLogger(__name__)


def prune_history(pool: Any, older_than: datetime, scope: Scope | None = None) -> int:
    """Delete the non-current revisions, recorded before ``older_than``, of records whose
    current revision is retracted or expired. Current revisions and receipts stay."""
    with pool.connection() as conn:
        cur = conn.execute(
            """
            DELETE FROM engram_revisions v USING engram_records r
            WHERE v.scope_id = r.scope_id AND v.record_id = r.id AND v.revision < r.revision
              AND v.recorded_at < %(cut)s
              AND (r.status = 'retracted' OR (r.expires_at IS NOT NULL AND r.expires_at <= now()))
              AND (%(key)s::text IS NULL
                   OR r.scope_id = (SELECT id FROM engram_scopes WHERE key = %(key)s))
            """,
            {"cut": older_than, "key": scope.key if scope else None},
        )
        count: int = cur.rowcount
    log.info("pruned history", extra={"count": count, "older_than": older_than.isoformat()})
    return count


def prune_operations(pool: Any, older_than: datetime) -> int:
    """Delete receipts committed before ``older_than``. Their operation ids no longer
    deduplicate; tombstones are not receipts and stay."""
    with pool.connection() as conn:
        cur = conn.execute("DELETE FROM engram_receipts WHERE committed_at < %s", (older_than,))
        count: int = cur.rowcount
        # What vouched for those operations' requesters goes with them.
        conn.execute("DELETE FROM engram_vouched_operations WHERE at < %s", (older_than,))
    log.warning(
        "pruned receipts: these operation ids no longer deduplicate",
        extra={"count": count, "older_than": older_than.isoformat()},
    )
    return count
