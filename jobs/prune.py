"""Retention: history, receipts and dead letters older than their windows go.

- ``history``: non-current revisions of retracted or expired records
  (``Store.prune_history``);
- ``receipts``: receipts of committed operations (``Store.prune_operations``).
  Off by default: an operation whose receipt is gone no longer deduplicates (a
  redelivery is applied again), and the store logs a warning saying so;
- ``dead-letters``: entries of ``engram:dead`` (``XTRIM MINID``);
- ``token-reads``: the scoped tokens' read log (``Store.tokens.prune_reads``).

``run`` prunes now and reports counts (the CLI, the dashboard); ``enqueue``
hands the same work to a jobs worker; ``prune_job`` is the RQ job the
schedules (``schedule``) enqueue. Windows come from ``Retention``; a run may
name its own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from engram.store import Store
from engram.store.errors import InvalidRequestError
from engram.worker import keys as stream_keys

from . import keys, queues
from .context import current
from .errors import content_free
from .settings import Retention

log = logging.getLogger(__name__)

WHAT = ("history", "receipts", "dead-letters", "token-reads")


@dataclass(frozen=True, slots=True)
class Pruned:
    what: str
    removed: int
    older_than: datetime | None  # None: no retention window, nothing was pruned

    def as_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "removed": self.removed,
            "older_than": self.older_than.isoformat() if self.older_than else None,
        }


def window_s(retention: Retention, what: str) -> float | None:
    check(what)
    return {
        "history": retention.history_s,
        "receipts": retention.receipts_s,
        "dead-letters": retention.dead_letters_s,
        "token-reads": retention.token_reads_s,
    }[what]


def enabled(retention: Retention) -> list[str]:
    """What a prune with no target prunes: each whose retention window is on."""
    return [name for name in WHAT if window_s(retention, name) is not None]


def check(what: str) -> str:
    if what not in WHAT:
        raise InvalidRequestError(f"prune one of {', '.join(WHAT)}, not {what!r}")
    return what


def run(
    store: Store,
    client: redis.Redis,
    retention: Retention,
    what: Sequence[str] | None = None,
    *,
    older_than_s: float | None = None,
) -> list[Pruned]:
    """Prune each of ``what`` now, older than its retention window, or than
    ``older_than_s`` instead (``client``: the streams' Redis, for the dead letters).

    ``what`` left out means all of them, but then a window that is off stays off,
    ``older_than_s`` or not: receipts are the store's dedupe memory, and pruning
    them is something to ask for by name."""
    report = []
    for name in what or WHAT:
        window = window_s(retention, check(name))
        if older_than_s is not None and (window is not None or what):
            window = older_than_s
        if window is None:
            report.append(Pruned(name, 0, None))
            continue
        cutoff = datetime.now(UTC) - timedelta(seconds=window)
        report.append(Pruned(name, _prune(store, client, name, cutoff), cutoff))
    return report


def _prune(store: Store, client: redis.Redis, what: str, cutoff: datetime) -> int:
    if what == "history":
        return store.prune_history(cutoff)
    if what == "receipts":
        return store.prune_operations(cutoff)
    if what == "token-reads":
        removed = store.tokens.prune_reads(cutoff)
        log.info("pruned the read log", extra={"count": removed, "older_than": cutoff.isoformat()})
        return removed
    removed = int(
        client.xtrim(
            stream_keys.DEAD_LETTERS, minid=f"{int(cutoff.timestamp() * 1000)}-0", approximate=False
        )
    )
    log.info("trimmed dead letters", extra={"count": removed, "older_than": cutoff.isoformat()})
    return removed


def enqueue(client: redis.Redis, what: str, *, older_than_s: float | None = None) -> str:
    """Hand a prune to a jobs worker; the RQ job's id (its result is the report)."""
    job = queues.enqueue(
        client,
        keys.MAINTENANCE_QUEUE,
        prune_job,
        (check(what), older_than_s),
        job_id=keys.new_job_id(f"prune-{what}"),
        timeout_s=3600,
        description=f"prune {what}",
    )
    return str(job.id)


@content_free("prune")
def prune_job(what: str, older_than_s: float | None = None) -> list[dict[str, Any]]:
    ctx = current()
    report = run(
        ctx.store, ctx.streams_client, ctx.settings.retention, [what], older_than_s=older_than_s
    )
    return [p.as_dict() for p in report]
