"""Enqueueing engram's jobs on RQ, with the same options everywhere.

Job data is JSON (RQ's ``JSONSerializer``), so anyone can read a job's
arguments, and they are ids and numbers only: a job never needs redaction.

Every read of a job goes through here, with ``SERIALIZER``: RQ's default is
pickle, and unpickling what anyone who can write one Redis key put there runs
their code. A job this side cannot read (not JSON, garbled, planted) is an
``UnreadableJob``: shown as such, never run, and it stops no list.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis
from rq import Queue, Retry
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from . import keys

log = logging.getLogger(__name__)

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


@dataclass(frozen=True, slots=True)
class UnreadableJob:
    """A job whose hash is there but does not read as one of engram's (JSON) jobs."""

    id: str
    origin: str  # the queue its hash names, or "" (it is untrusted text either way)
    status: str  # what its hash says, or "unknown"


def fetch(client: redis.Redis, job_id: str) -> Job | None:
    found = read(client, job_id)
    return found if isinstance(found, Job) else None


def read(client: redis.Redis, job_id: str) -> Job | UnreadableJob | None:
    """A job, or ``UnreadableJob``, or None when there is no such job."""
    return read_many(client, [job_id])[0]


def read_many(client: redis.Redis, job_ids: Sequence[str]) -> list[Job | UnreadableJob | None]:
    """``Job.fetch_many`` that never unpickles and never raises on one job's data."""
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hgetall(Job.key_for(job_id))
    found = pipe.execute() if job_ids else []
    return [_restore(client, job_id, raw) for job_id, raw in zip(job_ids, found, strict=True)]


def _restore(client: redis.Redis, job_id: str, raw: dict[Any, Any]) -> Job | UnreadableJob | None:
    if not raw:
        return None
    job = Job(job_id, connection=client, serializer=SERIALIZER)
    try:
        job.restore(raw)
        job.func_name  # noqa: B018 -- reads the call (JSON) now, so a bad one is caught here
    except Exception:  # RQ raises whatever its parsers raise on garbage
        return UnreadableJob(job_id, _field(raw, "origin"), _field(raw, "status") or "unknown")
    return job


def _field(raw: dict[Any, Any], name: str) -> str:
    value = raw.get(name.encode(), raw.get(name))
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")[:128]
    return str(value)[:128] if value is not None else ""


class CheckedJob(Job):
    """The jobs worker's job class. RQ lets any exception of a job's restore out of
    its dequeue, and the worker quits: one planted or damaged job would stop the
    jobs for good. Such a job is set aside instead, as RQ skips a job that is gone:
    into its queue's failed jobs (where the dashboard shows it as unreadable) when
    it names one of engram's queues, never run."""

    def restore(self, raw: dict[Any, Any]) -> None:
        try:
            super().restore(raw)
            self.func_name  # noqa: B018 -- reads the call (JSON) now, so a bad one is caught here
        except Exception:
            set_aside(self.connection, self.id, _field(raw, "origin"))
            raise NoSuchJobError(f"job {self.id[:128]!r} is unreadable") from None


def set_aside(client: redis.Redis, job_id: str, origin: str) -> None:
    """List an unreadable job among its queue's failed jobs; log its id, nothing else."""
    if origin in keys.QUEUES:
        client.zadd(f"rq:failed:{origin}", {job_id: time.time() + FAILURE_TTL_S})
    log.warning("an unreadable job was set aside, never run", extra={"job_id": job_id[:128]})


def status(client: redis.Redis, job_id: str) -> JobStatus | None:
    job = fetch(client, job_id)
    return job.get_status(refresh=False) if job is not None else None


def is_final_attempt(job: Job | None) -> bool:
    """True when a failure of this run is not retried (no retries, or none left)."""
    return job is None or not job.retries_left
