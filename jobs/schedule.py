"""Schedules: retention and upkeep jobs every so often, once per period across all jobs workers.

Time is cut into slots of ``every_s`` seconds from the epoch; at each tick a
jobs worker claims the current slot of each schedule (``SET NX`` on
``engram:jobs:slot:<name>:<n>``, with a TTL) and only the one that claimed it
enqueues the job. So any number of jobs workers run a schedule once per slot,
a restarted worker does not run it twice in one slot, and one started mid-slot
runs it at once if no one has.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from . import indexes, keys, prune, queues, redaction
from .settings import Retention

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Schedule:
    name: str
    every_s: float
    func: Callable[..., Any]
    args: tuple[Any, ...]
    queue: str = keys.MAINTENANCE_QUEUE
    timeout_s: float = 3600


def retention_schedules(retention: Retention) -> list[Schedule]:
    """One schedule per retention that is on."""
    return [
        Schedule(f"prune-{what}", retention.every_s, prune.prune_job, (what,))
        for what in prune.WHAT
        if prune.window_s(retention, what) is not None
    ]


def upkeep_schedules() -> list[Schedule]:
    """What always runs: HNSW indexes for the scopes that grew large, the settling of
    the vectors written into them since, the deletion
    of what retired generations left, and the forget ledger's repair (the tombstones it
    lacks, appended: store.ledger)."""
    return [
        Schedule("index-large-scopes", indexes.INDEX_EVERY_S, indexes.index_large_scopes_job, ()),
        Schedule("settle-fresh-vectors", indexes.SETTLE_EVERY_S, indexes.settle_fresh_job, ()),
        Schedule("purge-retired-vectors", indexes.INDEX_EVERY_S, indexes.purge_retired_job, ()),
        Schedule(
            "repair-forget-ledger",
            redaction.LEDGER_REPAIR_EVERY_S,
            redaction.repair_ledger_job,
            (),
        ),
    ]


def slot_of(now_s: float, every_s: float) -> int:
    return math.floor(now_s / every_s)


def enqueue_due(client: redis.Redis, schedules: Sequence[Schedule], now_s: float) -> list[str]:
    """Enqueue the schedules whose current slot no jobs worker has claimed; their job ids."""
    enqueued = []
    for schedule in schedules:
        number = slot_of(now_s, schedule.every_s)
        claimed = client.set(
            keys.slot(schedule.name, number),
            "1",
            nx=True,
            ex=max(1, math.ceil(schedule.every_s * 2)),
        )
        if not claimed:
            continue
        job = queues.enqueue(
            client,
            schedule.queue,
            schedule.func,
            schedule.args,
            job_id=f"{schedule.name}-{number}",
            timeout_s=schedule.timeout_s,
            description=f"{schedule.name} (scheduled)",
        )
        log.info("scheduled job enqueued", extra={"schedule": schedule.name, "job_id": job.id})
        enqueued.append(str(job.id))
    return enqueued
