"""engram's jobs as the dashboard and the API show them, read with RQ's own API.

Every queue of ``keys.QUEUES`` and its registries (queued, started, scheduled
for later or for a retry, finished, failed, canceled), newest first. A job's
arguments are ids and numbers; its error is the content-free message the job
raised (``errors.content_free``). A job whose data is not JSON is listed with
kind and status ``unreadable`` (``queues.read_many``: never unpickled).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
from rq.job import Job
from rq.registry import (
    BaseRegistry,
    CanceledJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)

from . import keys, queues


@dataclass(frozen=True, slots=True)
class JobInfo:
    id: str
    kind: str  # reembed | redact | prune-history | prune-receipts | prune-dead-letters
    queue: str
    status: str  # queued | started | scheduled | finished | failed | canceled | ...
    description: str
    args: list[Any]
    created_at: datetime | None
    enqueued_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    retries_left: int | None
    error: str | None  # the last line of a failure: content-free
    result: Any  # what a finished job returned (counts and ids)

    def as_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__}
        for k in ("created_at", "enqueued_at", "started_at", "ended_at"):
            out[k] = out[k].isoformat() if out[k] else None
        return out


def list_jobs(
    client: redis.Redis, *, statuses: Iterable[str] | None = None, limit: int = 100
) -> list[JobInfo]:
    """engram's jobs, newest first (by when they were enqueued or created)."""
    wanted = set(statuses) if statuses is not None else None
    ids: list[str] = []
    for name in keys.QUEUES:
        queue = queues.queue(client, name)
        if wanted is None or "queued" in wanted:
            ids += queue.get_job_ids()
        for status, registry in _registries(queue):
            if wanted is None or status in wanted:
                ids += registry.get_job_ids()
    found = queues.read_many(client, list(dict.fromkeys(ids)))
    infos = [info(job) if isinstance(job, Job) else unreadable(job) for job in found if job]
    infos.sort(key=_newest_first, reverse=True)
    return infos[:limit]


def get_job(client: redis.Redis, job_id: str) -> JobInfo | None:
    job = queues.fetch(client, job_id)
    return info(job) if job is not None else None


def requeue(client: redis.Redis, job_id: str) -> bool:
    """Run a failed job again; False when there is no such failed job."""
    job = queues.fetch(client, job_id)
    if job is None or job.origin not in keys.QUEUES:
        return False
    registry = FailedJobRegistry(queue=queues.queue(client, job.origin))
    if job_id not in registry:
        return False
    registry.requeue(job_id)
    return True


def unreadable(job: queues.UnreadableJob) -> JobInfo:
    return JobInfo(
        id=job.id,
        kind="unreadable",
        queue=job.origin,
        status="unreadable",
        description="unreadable",
        args=[],
        created_at=None,
        enqueued_at=None,
        started_at=None,
        ended_at=None,
        retries_left=None,
        error=None,
        result=None,
    )


def info(job: Job) -> JobInfo:
    try:
        result = job.latest_result()
    except Exception:  # a result this side cannot read (JSON only) is no result
        result = None
    error = None
    if result is not None and result.exc_string:
        lines = [line for line in result.exc_string.strip().splitlines() if line.strip()]
        error = lines[-1] if lines else None
    return JobInfo(
        id=job.id,
        kind=job.id.rsplit("-", 1)[0],
        queue=job.origin,
        status=_status(job),
        description=job.description or job.id,
        args=list(job.args),
        created_at=job.created_at,
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        ended_at=job.ended_at,
        retries_left=job.retries_left,
        error=error,
        result=result.return_value
        if result is not None and result.type == result.Type.SUCCESSFUL
        else None,
    )


def _newest_first(job: JobInfo) -> float:
    when = job.enqueued_at or job.created_at
    return when.timestamp() if when is not None else 0.0  # an unreadable job: last


def _status(job: Job) -> str:
    status = job.get_status(refresh=False)
    return status.value if status is not None else "unknown"


def _registries(queue: Any) -> list[tuple[str, BaseRegistry]]:
    return [
        ("started", StartedJobRegistry(queue=queue)),
        ("scheduled", ScheduledJobRegistry(queue=queue)),
        ("finished", FinishedJobRegistry(queue=queue)),
        ("failed", FailedJobRegistry(queue=queue)),
        ("canceled", CanceledJobRegistry(queue=queue)),
    ]
