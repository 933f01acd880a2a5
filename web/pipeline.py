"""The pipeline as Redis sees it, for the overview: streams, workers, what they did
per interval, dead letters and jobs. Read-only; ids and counts only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from engram.store.read.cursors import Cursors
from engram.worker.admin import deadletters, metrics
from engram.worker.admin.deadletters import DeadLetter
from engram.worker.admin.metrics import Interval, StreamState
from engram.worker.consuming.membership import live_workers

from . import rqjobs
from .rqjobs import JobRow, QueueSummary

CHART_WINDOW_S = 900
LATEST = 5


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    id: str
    host: str
    pid: str
    partitions: tuple[int, ...]
    last_beat: datetime | None
    started: datetime | None
    committed: int
    replayed: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    streams: list[StreamState]
    workers: list[WorkerInfo]
    intervals: list[Interval]
    dead_letters: int
    latest_dead: list[DeadLetter]
    queues: list[QueueSummary]
    running_jobs: list[JobRow]
    failed_jobs: list[JobRow]

    @property
    def pending(self) -> int:
        return sum(s.pending for s in self.streams)

    @property
    def lag(self) -> int:
        return sum(s.lag for s in self.streams)

    @property
    def unowned_partitions(self) -> list[int]:
        """The partitions of the epoch served (during a repartition, the old one: the
        new one's wait for it by design) that no live worker holds."""
        owned = {p for w in self.workers for p in w.partitions}
        served = min((s.epoch for s in self.streams), default=0)
        return [s.partition for s in self.streams if s.epoch == served and s.partition not in owned]


def snapshot(
    conn: redis.Redis,
    *,
    partitions: int,
    lease_ttl_ms: int,
    queues: Sequence[str],
    signer: Cursors,
    jobs: redis.Redis | None = None,
) -> Snapshot:
    """The streams as ``conn`` (``REDIS_URL``'s) sees them, the jobs as ``jobs`` (the
    jobs' Redis; None: ``conn``) does."""
    jobs = conn if jobs is None else jobs
    running: list[JobRow] = []
    failed: list[JobRow] = []
    for name in queues:
        for state, found in (("started", running), ("failed", failed)):
            found += rqjobs.page(jobs, name, state, cursor=None, limit=LATEST, signer=signer).items
    return Snapshot(
        streams=metrics.stream_states(conn, partitions),
        workers=[_worker(w) for w in live_workers(conn, lease_ttl_ms)],
        intervals=metrics.intervals(conn, window_s=CHART_WINDOW_S),
        dead_letters=deadletters.count(conn),
        latest_dead=deadletters.page(conn, count=LATEST),
        queues=rqjobs.summaries(jobs, queues),
        running_jobs=running,
        failed_jobs=sorted(failed, key=lambda j: j.ended_at or _EPOCH, reverse=True)[:LATEST],
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _worker(info: dict[str, Any]) -> WorkerInfo:
    return WorkerInfo(
        id=str(info.get("id", "")),
        host=str(info.get("host", "?")),
        pid=str(info.get("pid", "?")),
        partitions=tuple(int(p) for p in str(info.get("partitions", "")).split(",") if p.isdigit()),
        last_beat=_ms(info.get("last_beat_ms")),
        started=_ms(info.get("started_ms")),
        committed=_int(info.get("committed")),
        replayed=_int(info.get("replayed")),
    )


def _ms(value: object) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(str(value)) / 1000, UTC)
    except (TypeError, ValueError, OverflowError):
        return None


def _int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0
