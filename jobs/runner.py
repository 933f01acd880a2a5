"""``engram jobs``: an RQ worker for engram's queues, with its scheduler and watchdogs.

The worker (RQ's ``SimpleWorker``: jobs run in this process, so nothing it
starts outlives it) takes jobs from the redaction, maintenance and re-embedding
queues, in that order. Beside it, two threads:

- the ticker, every ``ENGRAM_JOBS_TICK`` (5 s): RQ's scheduler (moves delayed
  jobs and retries due to their queue; one jobs worker at a time holds its
  locks), the retention schedules, and every few ticks the watchdogs: the
  next slice of a re-embedding whose slice died, the forgets whose redaction
  was lost. Its Redis commands (a look at each queue's scheduled jobs, the
  locks' heartbeat) were most of an idle jobs worker's CPU at a tick a second;
- the feeder: forget events handed over by the stream workers become
  redaction jobs.

SIGTERM or Ctrl-C: the job in hand finishes (a re-embedding slice stops at its
next batch and enqueues the next slice), then the worker exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import redis
from rq import SimpleWorker, Worker
from rq.scheduler import RQScheduler
from rq.suspension import is_suspended
from rq.worker import BaseWorker, WorkerStatus

from engram.worker.admin import pause

from . import keys, queues, redaction, reembed, schedule
from .context import JobContext, install

log = logging.getLogger(__name__)

# How often the watchdogs look, in ticks.
_RESUME_EVERY_TICKS = 5
_SWEEP_EVERY_TICKS = 30
# An RQ worker beats this often (its registration lives a little longer).
WORKER_TTL_S = 60
# The longest an idle jobs worker waits for a job before it looks again at whether
# the jobs are paused.
DEQUEUE_WAIT_S = 5
# How often a paused jobs worker looks whether the jobs were resumed.
SUSPENSION_CHECK_S = 0.5
# The longest RQ's command channel thread waits in one read: a stop waits for it.
PUBSUB_WAIT_S = 1.0


class JobsWorker(SimpleWorker):
    """RQ's in-process worker; a stop request also reaches a long job (``stopping``).

    A pause of the jobs (RQ's suspension, ``worker.pause``) is looked at right before
    each job starts, and acknowledged in the worker's hash while it is held."""

    stopping: threading.Event | None = None
    _reported: int | None = None  # the at_ms of the pause last reported held

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> Any:
        """RQ looks at its suspension only before it waits for a job, and an idle
        worker's wait lasts until a job comes: it would take the first job enqueued
        after a pause. So the wait is taken in turns of ``DEQUEUE_WAIT_S``, with the
        suspension looked at between them, and a job taken once the jobs are paused
        (the pause came during the wait) goes back to the front of its queue, not run."""
        waits = timeout is not None and max_idle_time is None  # not burst, no idle limit
        while not self._stop_requested:
            if waits:
                self.check_for_suspension(burst=False)
                found = super().dequeue_job_and_maintain_ttl(DEQUEUE_WAIT_S, DEQUEUE_WAIT_S)
                if found is None:
                    continue
            else:
                found = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            if found is None or not self._put_back_if_paused(*found):
                return found
            if not waits:
                return None  # burst: the queues are left as they are until resumed
        return None

    def _put_back_if_paused(self, job: Any, queue: Any) -> bool:
        if not is_suspended(self.connection):
            return False
        queue.push_job_id(job.id, at_front=True)
        log.info("job put back: the jobs are paused", extra={"job_id": job.id})
        return True

    def check_for_suspension(self, burst: bool) -> None:
        """RQ's wait while the jobs are paused, which also says so in the worker's
        hash (``pause.report_jobs``): from then on it starts no job until resumed."""
        held = pause.jobs_paused(self.connection)
        if held is None or burst:
            self._report(None)
            super().check_for_suspension(burst)
            return
        before = self.get_state()
        self.set_state(WorkerStatus.SUSPENDED)
        while held is not None and not self._stop_requested:
            self._report(held)
            self.heartbeat()
            if self.stopping is not None:
                self.stopping.wait(SUSPENSION_CHECK_S)
            else:
                time.sleep(SUSPENSION_CHECK_S)
            held = pause.jobs_paused(self.connection)
        self._report(None)
        self.set_state(before)

    def _report(self, held: pause.Pause | None) -> None:
        """Held: said at each look (the hash may have been written anew meanwhile);
        none: the field deleted once."""
        at = None if held is None else held.at_ms
        if held is not None or at != self._reported:
            pause.report_jobs(self.connection, self.key, held)
            self._reported = at

    def subscribe(self) -> None:
        """RQ's command channel (``rq.command``), read by a thread that waits up to 60 s
        at a time; the worker's stop joins that thread. With redis-py 8 the wait is the
        whole 60 s when the thread reads its own unsubscribe first (it then waits to be
        subscribed again), so a stop took a minute now and then. Here a read waits
        ``PUBSUB_WAIT_S``."""
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]
            sleep_time=PUBSUB_WAIT_S,
            daemon=True,
            exception_handler=self._pubsub_exception_handler,
        )

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """RQ's warm stop, kept as a flag too. Idle, RQ raises ``StopRequested`` from
        this handler to break out of its wait, wherever the main thread is: an ``except
        Exception`` there swallowed it (reading a job's hash, ``queues.unreadable``), and
        the worker went on waiting for jobs until ``engram up`` killed it 120 s later.
        The dequeue loop reads the flag between its waits (``DEQUEUE_WAIT_S``)."""
        if self.stopping is not None:
            self.stopping.set()
        self._stop_requested = True
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]


def rq_connection(url: str) -> redis.Redis:
    """RQ's worker blocks on its queues for up to ``WORKER_TTL_S``: no socket timeout."""
    return redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)


def run(ctx: JobContext, rq_client: redis.Redis, *, burst: bool = False) -> int:
    """Run the jobs until stopped (or, with ``burst``, until the queues are empty)."""
    install(ctx)
    # Every job the worker reads, to run it or to clean up after it, is a CheckedJob:
    # its queues read with that class too (RQ's clean-up of a job whose worker died
    # would otherwise import the failure callback a planted job names).
    worker = JobsWorker(
        [queues.queue(rq_client, name, queues.CheckedJob) for name in keys.QUEUES],
        connection=rq_client,
        serializer=queues.SERIALIZER,
        job_class=queues.CheckedJob,
        name=f"engram-jobs-{socket.gethostname()}-{os.getpid()}",
        worker_ttl=WORKER_TTL_S,
    )
    worker.stopping = ctx.stopping
    ticker = _Ticker(ctx)
    threads = [
        _Loop("engram-jobs-ticker", ticker.tick, ctx.settings.tick_s, ctx.stopping),
        _Loop("engram-jobs-feeder", lambda: redaction.feed(ctx), 0.05, ctx.stopping),
    ]
    for thread in threads:
        thread.start()
    log.info(
        "jobs worker started",
        extra={
            "worker": worker.name,
            "queues": ",".join(keys.QUEUES),
            "listeners": ",".join(ctx.settings.redaction.listeners) or "none",
            "schedules": ",".join(s.name for s in ticker.schedules) or "none",
        },
    )
    try:
        worker.work(burst=burst, logging_level="WARNING", with_scheduler=False)
    finally:
        ctx.stopping.set()
        for thread in threads:
            thread.join(timeout=10)
        ticker.close()
    return 0


def pause_reports(client: redis.Redis) -> list[dict[str, str | None]]:
    """Each live jobs worker's name, the pause of the jobs it holds (``paused``: the
    pause's ``at_ms``, as ``worker.pause.report_jobs`` writes it) and the job in its
    hands (``job``), for ``worker.pause.jobs_not_yet_seen``."""
    found = []
    for w in live_workers(client):
        seen = client.hget(w.key, pause.JOBS_SEEN_FIELD)
        paused = seen.decode(errors="replace") if isinstance(seen, bytes) else seen
        found.append({"name": w.name, "paused": paused, "job": w.get_current_job_id()})
    return found


def live_workers(client: redis.Redis, *, here_only: bool = False) -> list[BaseWorker]:
    """The RQ workers serving engram's queues (on this host, whose process is alive)."""
    found = Worker.all(queue=queues.queue(client, keys.REDACTION_QUEUE))
    if not here_only:
        return found
    return [w for w in found if w.hostname == socket.gethostname() and _alive(w.pid)]


class _Ticker:
    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.ticks = 0
        # RQ's scheduler sets up its own log handler, at INFO unless told otherwise.
        self.scheduler = RQScheduler(
            keys.QUEUES,
            connection=ctx.client,
            interval=1,
            logging_level=logging.getLogger().getEffectiveLevel(),
            serializer=queues.SERIALIZER,  # RQ's default unpickles the scheduled jobs
        )
        self.schedules = (
            schedule.retention_schedules(ctx.settings.retention) + schedule.upkeep_schedules()
        )

    def tick(self) -> None:
        self.ticks += 1
        self._move_scheduled_jobs()
        schedule.enqueue_due(self.ctx.client, self.schedules, time.time())
        if self.ticks % _RESUME_EVERY_TICKS == 1:
            reembed.resume_stalled(self.ctx)
        if self.ticks % _SWEEP_EVERY_TICKS == 1:
            redaction.sweep(self.ctx)

    def _move_scheduled_jobs(self) -> None:
        """RQ's scheduler, a step at a time: jobs due (delayed, retried) go to their queue."""
        held = self.scheduler.acquired_locks
        if len(held) < len(keys.QUEUES) and self.ticks % _RESUME_EVERY_TICKS == 1:
            self.scheduler.acquire_locks()
        if self.scheduler.acquired_locks:
            self.scheduler.heartbeat()
            self.scheduler.enqueue_scheduled_jobs()

    def close(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self.scheduler.release_locks()


class _Loop(threading.Thread):
    """Call ``step`` every ``every_s`` until ``stopping``; a failure is logged, not fatal."""

    def __init__(
        self, name: str, step: Callable[[], Any], every_s: float, stopping: threading.Event
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.step = step
        self.every_s = every_s
        self.stopping = stopping

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.step()
            except Exception as exc:  # Redis or PostgreSQL away for a moment: next time
                log.warning(
                    "jobs loop failed", extra={"loop": self.name, "error": type(exc).__name__}
                )
                self.stopping.wait(min(5.0, self.every_s * 10))
            self.stopping.wait(self.every_s)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
