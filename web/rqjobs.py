"""The background jobs, read through RQ's own API: queues, registries, ``Job``.

Which queues to show is a parameter (the jobs define them). Each state of a
queue is a sorted set (RQ's registries) read by keyset on (score, job id),
newest first; the queued jobs are a list, shown from its head. Reads never
run RQ's registry clean-up (it writes): a started job whose worker died shows
as started until an RQ worker cleans it up.

Jobs are read with ``jobs.queues`` (JSON, never pickle): a job whose data does
not read as JSON, or that is not a call of one of engram's job functions, shows
as "unreadable" and is not retried.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any, cast

import redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.registry import BaseRegistry
from rq.results import Result

from engram.jobs import queues as rq_queues
from engram.jobs import schedule
from engram.jobs.keys import QUEUES
from engram.jobs.queues import UnreadableJob
from engram.jobs.settings import Retention
from engram.store.errors import InvalidRequestError, NotFoundError
from engram.store.read import cursors
from engram.store.read.paging import Page, check_limit

UNREADABLE = "unreadable"
JOB_STATES = ("queued", "started", "failed", "finished", "scheduled", "deferred", "canceled")
_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # RQ's own pattern, bounded
_QUEUE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_BULK = 1000  # failed jobs a bulk retry takes at most
# A filtered page reads at most this many of a registry's ids, or job hashes when it
# filters by function: the rest is the next page's to search.
MAX_SCAN_IDS = 5_000
MAX_SCAN_JOBS = 1_000


# Every schedule there can be (each retention on), for their job ids.
_SCHEDULES = (
    schedule.retention_schedules(
        Retention(history_s=1, receipts_s=1, dead_letters_s=1, token_reads_s=1)
    )
    + schedule.upkeep_schedules()
)
# The functions engram enqueues: the ones a list can be filtered by (any other job is
# unreadable).
JOB_FUNCTIONS = rq_queues.FUNCTIONS
# A scheduled run's job id is its schedule's name and slot number (``schedule.enqueue_due``);
# a prune asked for by hand has 16 hex digits there (``keys.new_job_id``).
_TICK = re.compile("(?:" + "|".join(re.escape(s.name) for s in _SCHEDULES) + r")-[0-9]{1,15}")


def is_tick(job_id: str) -> bool:
    """Whether a job is a scheduled maintenance tick (a prune, an index, a purge that a
    jobs worker enqueued on its own, every so often)."""
    return _TICK.fullmatch(job_id) is not None


@dataclass(frozen=True, slots=True)
class JobFilter:
    function: str | None = None  # one of JOB_FUNCTIONS
    ticks: bool = True  # False: scheduled maintenance ticks are hidden

    def __post_init__(self) -> None:
        if self.function is not None and self.function not in JOB_FUNCTIONS:
            raise InvalidRequestError(f"function must be one of {', '.join(JOB_FUNCTIONS)}")

    @property
    def filters(self) -> bool:
        return self.function is not None or not self.ticks


@dataclass(frozen=True, slots=True)
class JobPage:
    page: Page[JobRow]
    hidden_ticks: int  # maintenance ticks passed over on the way to this page's jobs
    cut_after: int | None  # ids read when the search stopped at its bound, else None


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
    result: Any = None  # what a finished job returned (engram's jobs return counts and ids)


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
    """A page of a queue's jobs in a state, newest first, every one of them."""
    return find(
        conn, queue_name, state, JobFilter(), cursor=cursor, limit=limit, signer=signer
    ).page


def find(
    conn: redis.Redis,
    queue_name: str,
    state: str,
    where: JobFilter,
    *,
    cursor: str | None,
    limit: int,
    signer: cursors.Cursors,
) -> JobPage:
    """A page of the jobs ``where`` keeps. Filtered, it reads at most ``MAX_SCAN_IDS``
    ids (``MAX_SCAN_JOBS`` job hashes with a function): a page may then hold fewer jobs
    than ``limit``, and its next cursor goes on from the last one read."""
    limit = check_limit(limit)
    if state not in JOB_STATES:
        raise InvalidRequestError(f"state must be one of {', '.join(JOB_STATES)}")
    queue = rq_queues.queue(conn, queue_name)
    kind = f"jobs:{queue_name}:{state}"
    if state == "queued":
        if cursor is not None:
            raise cursors.InvalidCursorError("queued jobs are shown from the queue's head only")
        members: Iterator[tuple[str, float]] = _queued(conn, queue.key)
    else:
        after = None
        if cursor is not None:
            held = signer.decode(cursor, kind, (str, str))
            after = (_score(str(held[0])), str(held[1]))
        members = _registered(conn, _registry(queue, state).key, after, limit + 1)
    if not where.filters:
        found, hidden, last_read = list(islice(members, limit + 1)), 0, None
    else:
        found, hidden, last_read = _search(conn, members, where, limit)
    shown = found[:limit]
    rows = _rows(conn, [BaseRegistry.parse_job_id(m) for m, _ in shown], queue_name, state)
    resume = last_read if last_read is not None else (shown[-1] if len(found) > limit else None)
    next_cursor = None
    if resume is not None and state != "queued":
        next_cursor = signer.encode(kind, (repr(resume[1]), resume[0]))
    read = _budget(where) if last_read is not None else None
    return JobPage(Page(rows, next_cursor), hidden, read)


def _budget(where: JobFilter) -> int:
    return MAX_SCAN_JOBS if where.function is not None else MAX_SCAN_IDS


def _search(
    conn: redis.Redis, members: Iterator[tuple[str, float]], where: JobFilter, limit: int
) -> tuple[list[tuple[str, float]], int, tuple[str, float] | None]:
    """Up to ``limit + 1`` of ``members`` that ``where`` keeps, the ticks it hid before
    the page was full, and the last member read if the search stopped at its bound."""
    found: list[tuple[str, float]] = []
    hidden = read = 0
    budget = _budget(where)
    while read < budget:
        batch = list(islice(members, min(_SCAN_BATCH, budget - read)))
        if not batch:
            return found, hidden, None
        read += len(batch)
        for (member, score), verdict in zip(batch, _verdicts(conn, batch, where), strict=True):
            if verdict == "kept":
                found.append((member, score))
                if len(found) > limit:
                    return found, hidden, None
            elif verdict == "tick" and len(found) < limit:
                hidden += 1
    return found, hidden, batch[-1]


_SCAN_BATCH = 250


def _verdicts(conn: redis.Redis, batch: list[tuple[str, float]], where: JobFilter) -> list[str]:
    """For each member: kept, tick (a maintenance tick, hidden) or other (another
    function's). The function is read from the job's hash (RQ keeps it nowhere else)."""
    ids = [BaseRegistry.parse_job_id(m) for m, _ in batch]
    functions: list[str | None] = [None] * len(ids)
    if where.function is not None:
        functions = [_function_of(j) for j in rq_queues.read_many(conn, ids)]
    verdicts = []
    for job_id, function in zip(ids, functions, strict=True):
        if where.function is not None and function != where.function:
            verdicts.append("other")
        elif not where.ticks and is_tick(job_id):
            verdicts.append("tick")
        else:
            verdicts.append("kept")
    return verdicts


def _function_of(job: Job | UnreadableJob | None) -> str | None:
    return _safely(lambda: job.func_name) if isinstance(job, Job) else None


def _queued(conn: redis.Redis, key: str) -> Iterator[tuple[str, float]]:
    """A queue's jobs from its head, in turns (the list is read once per turn)."""
    start = 0
    while True:
        ids = [_text(i) for i in cast(list[Any], conn.lrange(key, start, start + _SCAN_BATCH - 1))]
        yield from ((i, 0.0) for i in ids)
        if len(ids) < _SCAN_BATCH:
            return
        start += len(ids)


def _registered(
    conn: redis.Redis, key: str, after: tuple[float, str] | None, first: int
) -> Iterator[tuple[str, float]]:
    """A registry's members and scores newest first, past ``after`` (the keyset of the
    last one shown): ``first`` on the first read, then in turns."""
    high: float | str = "+inf" if after is None else after[0]
    offset_in_ties, num = 0, first
    while True:
        batch = conn.zrevrangebyscore(
            key, high, "-inf", start=offset_in_ties, num=num, withscores=True
        )
        for raw, score in cast(list[tuple[Any, float]], batch):
            member = _text(raw)
            if after is None or (score, member) < after:
                yield member, float(score)
        if len(batch) < num:
            return
        offset_in_ties += len(batch)
        num = max(num, _SCAN_BATCH)


def get(conn: redis.Redis, job_id: str) -> JobRow | None:
    job = rq_queues.read(conn, check_job_id(job_id))
    if job is None:
        return None
    if isinstance(job, UnreadableJob):
        return _unreadable(job, job.origin, _unreadable_state(conn, job))
    return _rows_of(conn, [job], job.origin, None)[0]


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


def discard(conn: redis.Redis, job_id: str) -> JobRow:
    """Delete a failed job for good: out of its queue's failed jobs, with its data and
    its results. An unreadable one too (it can never be retried: this is its way out)."""
    job = get(conn, job_id)
    if job is None:
        raise NotFoundError(f"no job {job_id}")
    failed_jobs = rq_queues.queue(conn, job.queue).failed_job_registry.key
    if conn.zscore(failed_jobs, job_id) is None:  # what the failed jobs' list shows
        raise InvalidRequestError(f"job {job_id} is {job.state}: only a failed job is discarded")
    pipe = conn.pipeline(transaction=True)
    pipe.zrem(failed_jobs, job_id)
    pipe.delete(Job.key_for(job_id), Result.get_key(job_id))
    pipe.execute()
    return job


def failed(conn: redis.Redis, queue_name: str, *, limit: int = MAX_BULK + 1) -> list[JobRow]:
    """Up to ``limit`` of the jobs in a queue's failed jobs, newest first (what a bulk
    action looks at), each in the state its own hash says: one listed there may be
    another (put back on its queue elsewhere, planted, set aside while queued)."""
    key = rq_queues.queue(conn, queue_name).failed_job_registry.key
    members = conn.zrevrange(key, 0, limit - 1)
    ids = [BaseRegistry.parse_job_id(_text(m)) for m in cast(list[Any], members)]
    return _rows(conn, ids, queue_name, None)


def not_retried(job: JobRow) -> str | None:
    """Why ``retry`` refuses this job, or None (the jobs a bulk retry leaves, and why)."""
    if not job.readable:
        return "unreadable"
    if job.state != "failed":
        return f"{job.state}, not failed"
    return None


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


def _rows(conn: redis.Redis, ids: list[str], queue: str, state: str | None) -> list[JobRow]:
    """The rows of these jobs, in ``state`` (the registry they were read from), or with
    ``None``, each in the state its hash says."""
    found = rq_queues.read_many(conn, ids)
    readable = iter(_rows_of(conn, [j for j in found if isinstance(j, Job)], queue, state))
    return [
        next(readable)
        if isinstance(job, Job)
        else _unreadable(job, queue, state or _unreadable_state(conn, job))
        for job in found
        if job is not None
    ]


def _rows_of(conn: redis.Redis, jobs: list[Job], queue: str, state: str | None) -> list[JobRow]:
    """The rows of these jobs, with each one's latest result read in one round trip for
    all (RQ reads a job's result with a call of its own)."""
    pipe = conn.pipeline(transaction=False)
    for job in jobs:
        pipe.xrevrange(Result.get_key(job.id), "+", "-", count=1)
    return [
        _row(job, queue, state or _state(job), _latest(conn, job, latest))
        for job, latest in zip(jobs, pipe.execute() if jobs else [], strict=True)
    ]


def _latest(conn: redis.Redis, job: Job, latest: list[Any]) -> Result | None:
    """A job's latest result, from the latest entry of its results stream (as
    ``Result.fetch_latest`` reads it); None if it has none this side can read."""
    if not latest:
        return None
    result_id, payload = latest[0]
    return cast(
        Result | None,
        _safely(
            lambda: Result.restore(
                job.id, _text(result_id), payload, connection=conn, serializer=job.serializer
            )
        ),
    )


def _row(job: Job, queue: str, state: str, latest: Result | None) -> JobRow:
    traceback = _traceback(latest)
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
        result=_returned(latest),
    )


def _traceback(latest: Result | None) -> str | None:
    if latest is None or latest.type != Result.Type.FAILED:
        return None
    return latest.exc_string


def _returned(latest: Result | None) -> Any:
    if latest is None or latest.type != Result.Type.SUCCESSFUL:
        return None
    return latest.return_value


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


def _unreadable_state(conn: redis.Redis, job: UnreadableJob) -> str:
    """An unreadable job listed among its queue's failed jobs (the jobs worker set it
    aside there, never run) is failed, whatever its hash says (it may say ``queued``: it
    is untrusted, and nothing runs it); else what its hash says, if it is a state."""
    if job.origin in QUEUES:
        failed_jobs = rq_queues.queue(conn, job.origin).failed_job_registry.key
        if conn.zscore(failed_jobs, job.id) is not None:
            return "failed"
    return job.status if job.status in JOB_STATES else "unknown"


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
