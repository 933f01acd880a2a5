"""The background jobs, read through RQ's own API: queues, registries, ``Job``.

Which queues to show is a parameter (the jobs define them). Each state of a
queue is a sorted set (RQ's registries) read by keyset on (score, job id),
newest first; the queued jobs are a list, shown from its head. Reads never
run RQ's registry clean-up (it writes): a started job whose worker died shows
as started until an RQ worker cleans it up.

Jobs are read with ``jobs.queues`` (JSON, never pickle): a job whose data does
not read as JSON shows as "unreadable" and is not retried.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.registry import BaseRegistry
from rq.results import Result

from jobs import queues as rq_queues
from jobs.queues import UnreadableJob
from store import cursors
from store.errors import InvalidRequestError, NotFoundError
from store.paging import Page, check_limit

UNREADABLE = "unreadable"
JOB_STATES = ("queued", "started", "failed", "finished", "scheduled", "deferred", "canceled")
_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # RQ's own pattern, bounded
_QUEUE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_BULK = 1000  # failed jobs a bulk retry takes at most


@dataclass(frozen=True, slots=True)
class QueueSummary:
    name: str
    counts: dict[str, int]


@dataclass(frozen=True, slots=True)
class JobRow:
    id: str
    queue: str
    state: str
    function: str
    created_at: datetime | None
    enqueued_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    error: str | None  # the exception's last line, for a failed job
    traceback: str | None
    arguments: str  # what the job was called with (engram's jobs pass ids only)
    readable: bool = True  # False: its data is not JSON; function and arguments "unreadable"


def check_job_id(value: str) -> str:
    if not isinstance(value, str) or not _JOB_ID.fullmatch(value):
        raise InvalidRequestError("a job id is 1 to 128 letters, digits, '_' or '-'")
    return value


def check_queue(value: str, queues: Sequence[str]) -> str:
    if not isinstance(value, str) or not _QUEUE.fullmatch(value) or value not in queues:
        raise InvalidRequestError(f"queue must be one of {', '.join(queues)}")
    return value


def summaries(conn: redis.Redis, queues: Sequence[str]) -> list[QueueSummary]:
    pipe = conn.pipeline(transaction=False)
    for name in queues:
        queue = rq_queues.queue(conn, name)
        pipe.llen(queue.key)
        for state in JOB_STATES[1:]:
            pipe.zcard(_registry(queue, state).key)
    counts = iter(pipe.execute())
    return [
        QueueSummary(name, {state: int(next(counts)) for state in JOB_STATES}) for name in queues
    ]


def page(
    conn: redis.Redis,
    queue_name: str,
    state: str,
    *,
    cursor: str | None,
    limit: int,
    signer: cursors.Cursors,
) -> Page[JobRow]:
    limit = check_limit(limit)
    if state not in JOB_STATES:
        raise InvalidRequestError(f"state must be one of {', '.join(JOB_STATES)}")
    queue = rq_queues.queue(conn, queue_name)
    if state == "queued":
        if cursor is not None:
            raise cursors.InvalidCursorError("queued jobs are shown from the queue's head only")
        ids = [_text(i) for i in conn.lrange(queue.key, 0, limit - 1)]
        return Page(_rows(conn, ids, queue_name, state), None)
    key = _registry(queue, state).key
    high: float | str = "+inf"
    after: tuple[float, str] | None = None
    if cursor is not None:
        held = signer.decode(cursor, f"jobs:{queue_name}:{state}", (str, str))
        after = (_score(str(held[0])), str(held[1]))
        high = after[0]
    found: list[tuple[str, float]] = []
    offset_in_ties = 0
    while len(found) <= limit:
        batch = conn.zrevrangebyscore(
            key, high, "-inf", start=offset_in_ties, num=limit + 1, withscores=True
        )
        if not batch:
            break
        for raw, score in cast(list[tuple[Any, float]], batch):
            member = _text(raw)
            if after is not None and (score, member) >= after:
                continue
            found.append((member, float(score)))
        if len(batch) < limit + 1:
            break
        offset_in_ties += len(batch)
    shown = found[:limit]
    rows = _rows(conn, [BaseRegistry.parse_job_id(m) for m, _ in shown], queue_name, state)
    next_cursor = None
    if len(found) > limit and shown:
        last_member, last_score = shown[-1]
        next_cursor = signer.encode(f"jobs:{queue_name}:{state}", (repr(last_score), last_member))
    return Page(rows, next_cursor)


def get(conn: redis.Redis, job_id: str) -> JobRow | None:
    job = rq_queues.read(conn, check_job_id(job_id))
    if job is None:
        return None
    if isinstance(job, UnreadableJob):
        return _unreadable(job, job.origin, job.status if job.status in JOB_STATES else "unknown")
    return _rows_of(conn, [job], job.origin, _state(job))[0]


def retry(conn: redis.Redis, job_id: str) -> JobRow:
    """Put a failed job back on its queue."""
    job = get(conn, job_id)
    if job is None:
        raise NotFoundError(f"no job {job_id}")
    if not job.readable:
        raise InvalidRequestError(f"job {job_id} is unreadable: it is not retried")
    if job.state != "failed":
        raise InvalidRequestError(f"job {job_id} is {job.state}: only a failed job is retried")
    queue = rq_queues.queue(conn, job.queue)
    try:
        queue.failed_job_registry.requeue(job_id)
    except (InvalidJobOperation, NoSuchJobError):
        raise InvalidRequestError(f"job {job_id} is no longer in the failed jobs") from None
    found = get(conn, job_id)
    assert found is not None
    return found


def failed(conn: redis.Redis, queue_name: str, *, limit: int = MAX_BULK + 1) -> list[JobRow]:
    """Up to ``limit`` of a queue's failed jobs, newest first (what a bulk retry takes)."""
    key = rq_queues.queue(conn, queue_name).failed_job_registry.key
    members = conn.zrevrange(key, 0, limit - 1)
    ids = [BaseRegistry.parse_job_id(_text(m)) for m in cast(list[Any], members)]
    return _rows(conn, ids, queue_name, "failed")


def digest(ids: Sequence[str]) -> str:
    """A stable name of a set of jobs: a bulk retry confirms the set its dry run saw."""
    return hashlib.sha256(" ".join(sorted(ids)).encode()).hexdigest()[:32]


def _registry(queue: Queue, state: str) -> BaseRegistry:
    registries: dict[str, BaseRegistry] = {
        "started": queue.started_job_registry,
        "failed": queue.failed_job_registry,
        "finished": queue.finished_job_registry,
        "scheduled": queue.scheduled_job_registry,
        "deferred": queue.deferred_job_registry,
        "canceled": queue.canceled_job_registry,
    }
    return registries[state]


def _rows(conn: redis.Redis, ids: list[str], queue: str, state: str) -> list[JobRow]:
    found = rq_queues.read_many(conn, ids)
    readable = iter(_rows_of(conn, [j for j in found if isinstance(j, Job)], queue, state))
    return [
        next(readable) if isinstance(job, Job) else _unreadable(job, queue, state)
        for job in found
        if job is not None
    ]


def _rows_of(conn: redis.Redis, jobs: list[Job], queue: str, state: str) -> list[JobRow]:
    """The rows of these jobs, with each one's latest result read in one round trip for
    all (RQ reads a job's result with a call of its own)."""
    pipe = conn.pipeline(transaction=False)
    for job in jobs:
        pipe.xrevrange(Result.get_key(job.id), "+", "-", count=1)
    return [
        _row(job, queue, state, _traceback(conn, job, latest))
        for job, latest in zip(jobs, pipe.execute() if jobs else [], strict=True)
    ]


def _traceback(conn: redis.Redis, job: Job, latest: list[Any]) -> str | None:
    """The traceback of a job whose latest result (an entry of its results stream, as
    ``Result.fetch_latest`` reads it) is a failure."""
    if not latest:
        return None
    result_id, payload = latest[0]
    result = _safely(
        lambda: Result.restore(
            job.id, _text(result_id), payload, connection=conn, serializer=job.serializer
        )
    )
    if result is None or result.type != Result.Type.FAILED:
        return None
    return cast(str | None, result.exc_string)


def _row(job: Job, queue: str, state: str, traceback: str | None) -> JobRow:
    return JobRow(
        id=job.id,
        queue=queue,
        state=state,
        function=_safely(lambda: job.func_name) or "?",
        created_at=job.created_at,
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        ended_at=job.ended_at,
        error=traceback.strip().splitlines()[-1][:300] if traceback else None,
        traceback=traceback,
        arguments=_safely(lambda: _call_text(job.args, job.kwargs)) or "?",
    )


def _unreadable(job: UnreadableJob, queue: str, state: str) -> JobRow:
    return JobRow(
        id=job.id,
        queue=queue,
        state=state,
        function=UNREADABLE,
        created_at=None,
        enqueued_at=None,
        started_at=None,
        ended_at=None,
        error=None,
        traceback=None,
        arguments=UNREADABLE,
        readable=False,
    )


def _state(job: Job) -> str:
    status = _safely(lambda: job.get_status(refresh=False))
    value = getattr(status, "value", status)
    return str(value) if value else "unknown"


def _call_text(args: Any, kwargs: Any) -> str:
    parts = [repr(a) for a in args or ()] + [f"{k}={v!r}" for k, v in (kwargs or {}).items()]
    text = ", ".join(parts)
    return text if len(text) <= 500 else text[:499] + "…"


def _safely(read: Any) -> Any:
    """A job's field, or None if it cannot be read (its data may name code not here)."""
    try:
        return read()
    except Exception:
        return None


def _score(value: str) -> float:
    try:
        score = float(value)
    except ValueError:
        score = math.nan
    if math.isnan(score):
        raise cursors.InvalidCursorError("the cursor holds a malformed score")
    return score


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
