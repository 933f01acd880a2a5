"""Enqueueing engram's jobs on RQ, with the same options everywhere.

Job data is JSON (RQ's ``JSONSerializer``), so anyone can read a job's
arguments, and they are ids and numbers only: a job never needs redaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import redis
from rq import Queue, Retry
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

SERIALIZER = JSONSerializer
RESULT_TTL_S = 86_400
FAILURE_TTL_S = 7 * 86_400
# Statuses of a job that will still run (or is running, for ``started``).
LIVE = (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED, JobStatus.STARTED)


def queue(client: redis.Redis, name: str) -> Queue:
    return Queue(name, connection=client, serializer=SERIALIZER)


def enqueue(
    client: redis.Redis,
    queue_name: str,
    func: Callable[..., Any],
    args: Sequence[Any],
    *,
    job_id: str,
    timeout_s: float,
    retry_s: Sequence[int] = (),
    delay_s: float = 0.0,
    description: str | None = None,
) -> Job:
    """Enqueue ``func(*args)`` now, or after ``delay_s`` (RQ's scheduler moves it then);
    a failure is retried after each pause of ``retry_s``, then the job fails for good."""
    options: dict[str, Any] = {
        "job_id": job_id,
        "job_timeout": int(timeout_s),
        "result_ttl": RESULT_TTL_S,
        "failure_ttl": FAILURE_TTL_S,
        "description": description or job_id,
    }
    if retry_s:
        options["retry"] = Retry(max=len(retry_s), interval=list(retry_s))
    q = queue(client, queue_name)
    if delay_s > 0:
        return q.enqueue_in(timedelta(seconds=delay_s), func, *args, **options)
    return q.enqueue(func, *args, **options)


def fetch(client: redis.Redis, job_id: str) -> Job | None:
    try:
        return Job.fetch(job_id, connection=client, serializer=SERIALIZER)
    except Exception:  # rq.exceptions.NoSuchJobError, or data it cannot read
        return None


def status(client: redis.Redis, job_id: str) -> JobStatus | None:
    job = fetch(client, job_id)
    return job.get_status(refresh=False) if job is not None else None


def is_final_attempt(job: Job | None) -> bool:
    """True when a failure of this run is not retried (no retries, or none left)."""
    return job is None or not job.retries_left
