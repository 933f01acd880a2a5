"""Enqueueing engram's jobs on RQ, with the same options everywhere.

Job data is JSON (RQ's ``JSONSerializer``), so anyone can read a job's
arguments, and they are ids and numbers only: a job never needs redaction.

Every read of a job goes through here, with ``SERIALIZER``: RQ's default is
pickle, and unpickling what anyone who can write one Redis key put there runs
their code. Nor does a JSON job run just any function: RQ imports the one it
names, by name. Only the functions of ``FUNCTIONS`` run, checked by name before
anything is imported. A job this side cannot read (not JSON, garbled, planted)
or that is not one of engram's (another function, a callback, a webhook) is an
``UnreadableJob``: shown as such, never run nor retried, and it stops no list.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis
from rq import Queue, Retry
from rq.exceptions import NoSuchJobError, StopRequested
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from . import keys

log = logging.getLogger(__name__)

SERIALIZER = JSONSerializer
RESULT_TTL_S = 86_400
FAILURE_TTL_S = 7 * 86_400
# Statuses of a job that will still run (or is running, for ``started``).
LIVE = (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED, JobStatus.STARTED)

# The functions engram enqueues, as RQ names a job's function (module and qualified
# name): the only ones a jobs worker runs and the dashboard retries. Names, not the
# functions: a job is checked against them before RQ imports anything it names.
# ``enqueue`` takes no other, so a new job function that is not here fails at once.
FUNCTIONS = (
    "engram.jobs.redaction.redact",
    "engram.jobs.redaction.repair_ledger_job",
    "engram.jobs.reembed.run_slice",
    "engram.jobs.prune.prune_job",
    "engram.jobs.indexes.index_large_scopes_job",
    "engram.jobs.indexes.purge_retired_job",
    "engram.jobs.indexes.settle_fresh_job",
)
# The same functions as named before engram installed under one namespace (``jobs.prune
# .prune_job``): a job queued by an older engram still runs, as the function's new name.
RENAMED = {name.removeprefix("engram."): name for name in FUNCTIONS}
# Fields of a job's hash that RQ acts on by name or address (it imports a callback by
# its name, it posts to a webhook's URL). engram sets none of them.
_FOREIGN_FIELDS = (
    "success_callback_name",
    "failure_callback_name",
    "stopped_callback_name",
    "webhooks",
)


def queue(client: redis.Redis, name: str, job_class: type[Job] | None = None) -> Queue:
    return Queue(name, connection=client, serializer=SERIALIZER, job_class=job_class)


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
    a failure is retried after each pause of ``retry_s``, then the job fails for good.
    ``func`` is one of ``FUNCTIONS``: a job of any other would never run."""
    name = f"{func.__module__}.{func.__qualname__}"
    if name not in FUNCTIONS:
        raise ValueError(f"{name} is not one of engram's job functions (jobs.queues.FUNCTIONS)")
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


# Why a job is unreadable (``UnreadableJob.reason``, the worker's log line).
NOT_JSON = "not JSON"
FOREIGN = "not one of engram's jobs"  # JSON, but no call of one of engram's job functions


@dataclass(frozen=True, slots=True)
class UnreadableJob:
    """A job whose hash is there but does not read as one of engram's (JSON) jobs."""

    id: str
    origin: str  # the queue its hash names, or "" (it is untrusted text either way)
    status: str  # what its hash says, or "unknown"
    reason: str = NOT_JSON  # or FOREIGN


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
    reason = unreadable(job, raw)
    if reason is not None:
        return UnreadableJob(
            job_id, _field(raw, "origin"), _field(raw, "status") or "unknown", reason
        )
    return job


def unreadable(job: Job, raw: dict[Any, Any]) -> str | None:
    """Restore ``job`` from its hash ``raw``; why it is not one of engram's jobs, or None.

    One of engram's jobs reads as JSON and calls one of ``FUNCTIONS`` by name (or by
    its name before the namespace, ``RENAMED``), on no instance, with a list of
    arguments, and has no callback and no webhook. Only names are compared: nothing a
    job names is imported."""
    try:
        Job.restore(job, raw)  # RQ's own (``CheckedJob.restore`` calls this)
        call = (job.func_name, job.instance, job.args, job.kwargs)  # reads the JSON now
    except StopRequested:  # the worker's stop, raised by its signal handler: not the job's
        raise
    except Exception:  # RQ raises whatever its parsers raise on garbage
        return NOT_JSON
    name, instance, args, kwargs = call
    if name in RENAMED:
        name = job.func_name = RENAMED[name]  # compared by name, no import either way
    if name not in FUNCTIONS or instance is not None:
        return FOREIGN
    if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
        return FOREIGN
    if any(_field(raw, field) for field in _FOREIGN_FIELDS):
        return FOREIGN
    return None


def _field(raw: dict[Any, Any], name: str) -> str:
    value = raw.get(name.encode(), raw.get(name))
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")[:128]
    return str(value)[:128] if value is not None else ""


class CheckedJob(Job):
    """The jobs worker's job class: every job the worker takes (and every one its
    registries' clean-up reads) is restored here, before RQ imports anything it names.

    A job that is not one of engram's (``unreadable``) never runs: it is set aside as
    RQ skips a job that is gone, into its queue's failed jobs (where the dashboard
    shows it as unreadable) when it names one of engram's queues. Raising anything
    else out of a restore would make RQ's worker quit: one planted or damaged job
    would stop the jobs for good."""

    def restore(self, raw: dict[Any, Any]) -> None:
        reason = unreadable(self, raw)
        if reason is not None:
            set_aside(self.connection, self.id, _field(raw, "origin"), reason)
            raise NoSuchJobError(f"job {self.id[:128]!r} is unreadable")

    @classmethod
    def fetch_many(
        cls, job_ids: Iterable[str], connection: redis.Redis, serializer: Any = None
    ) -> list[Job | None]:
        """RQ's, but a job that is not one of engram's is None, as one that is gone: RQ's
        callers of it (a finished job's dependents, the ready jobs) expect no error."""
        found: list[Job | None] = []
        for job_id in job_ids:
            try:
                found.append(cls.fetch(job_id, connection=connection, serializer=serializer))
            except NoSuchJobError:
                found.append(None)
        return found


def set_aside(client: redis.Redis, job_id: str, origin: str, reason: str = NOT_JSON) -> None:
    """List an unreadable job among its queue's failed jobs; log its id and why
    (``NOT_JSON`` or ``FOREIGN``), nothing else of it."""
    if origin in keys.QUEUES:
        client.zadd(f"rq:failed:{origin}", {job_id: time.time() + FAILURE_TTL_S})
    log.warning(
        "an unreadable job was set aside, never run",
        extra={"job_id": job_id[:128], "reason": reason},
    )


def status(client: redis.Redis, job_id: str) -> JobStatus | None:
    job = fetch(client, job_id)
    return job.get_status(refresh=False) if job is not None else None


def is_final_attempt(job: Job | None) -> bool:
    """True when a failure of this run is not retried (no retries, or none left)."""
    return job is None or not job.retries_left


def retry_note(job: Job | None) -> str:
    """``retrying in 30 s (2 retries left)``: when a failure of this run is tried again
    (RQ's count, before it takes this retry off)."""
    if job is None or not job.retries_left:
        return "not retried"
    left = job.retries_left - 1
    return (
        f"retrying in {job.get_retry_interval()} s "
        f"({left} more {'retry' if left == 1 else 'retries'} after that)"
    )
