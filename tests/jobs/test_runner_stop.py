"""A jobs worker's stop does not wait out RQ's command channel: with redis-py 8 the
channel's thread, once it had read its own unsubscribe, waited its whole read (60 s in
RQ) before the stop could join it, and ``engram up`` took a minute to stop now and then."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import pytest
import redis
from rq.exceptions import StopRequested
from rq.job import Job
from rq.worker import WorkerStatus

from engram.jobs import keys, prune, queues, runner
from engram.worker.embedded.runtime import connect_redis
from tests.redis_fixtures import wait_until


def test_the_command_channel_lets_a_stop_through_at_once(redis_url: str) -> None:
    client = connect_redis(redis_url)
    worker = runner.JobsWorker(
        [queues.queue(client, name, queues.CheckedJob) for name in keys.QUEUES],
        connection=client,
        serializer=queues.SERIALIZER,
        job_class=queues.CheckedJob,
        name=f"engram-jobs-stop-test-{time.monotonic_ns()}",
    )
    worker.subscribe()
    wait_until(lambda: worker.pubsub.subscribed, timeout=10, what="the subscription")
    # The thread reads its own unsubscribe first, and waits to be subscribed again.
    worker.pubsub.unsubscribe()
    wait_until(lambda: not worker.pubsub.subscribed, timeout=10, what="the unsubscribe")
    time.sleep(0.2)  # into its next read
    started = time.monotonic()
    worker.unsubscribe()  # what RQ's teardown calls
    took = time.monotonic() - started
    assert not worker.pubsub_thread.is_alive()
    assert took < 2 * runner.PUBSUB_WAIT_S + 5, f"the stop waited {took:.1f} s"


def _worker(client: redis.Redis) -> runner.JobsWorker:
    return runner.JobsWorker(
        [queues.queue(client, name, queues.CheckedJob) for name in keys.QUEUES],
        connection=client,
        serializer=queues.SERIALIZER,
        job_class=queues.CheckedJob,
        name=f"engram-jobs-stop-test-{time.monotonic_ns()}",
    )


def test_a_stop_swallowed_where_it_landed_still_stops_the_idle_worker(redis_url: str) -> None:
    """RQ stops an idle worker by raising ``StopRequested`` from its signal handler,
    wherever the main thread is; an ``except Exception`` there swallowed it, and the
    worker went on waiting for jobs (``engram up`` killed it after 120 s)."""
    client = connect_redis(redis_url)
    worker = _worker(client)
    worker.set_state(WorkerStatus.IDLE)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with contextlib.suppress(StopRequested):  # swallowed, as by a catch-all
            worker.request_stop(signal.SIGTERM, None)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    found: list[object] = []
    waiting = threading.Thread(
        target=lambda: found.append(worker.dequeue_job_and_maintain_ttl(45, None)), daemon=True
    )
    waiting.start()
    waiting.join(timeout=3 * runner.DEQUEUE_WAIT_S)
    assert not waiting.is_alive(), "the worker went on waiting for jobs"
    assert found == [None]


def test_a_stop_landing_while_a_job_is_read_is_not_taken_for_the_job(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal handler's ``StopRequested`` raised while a job's hash is restored is
    the worker's stop, not an unreadable job: it goes on up, and the job stays as it
    was (it was set aside as "not JSON", never to run)."""
    job = queues.queue(redis_client, keys.MAINTENANCE_QUEUE).enqueue(prune.prune_job, "history")

    def stop_arrives(self: Job, raw: dict[bytes, bytes]) -> None:
        raise StopRequested()

    monkeypatch.setattr(Job, "restore", stop_arrives)
    with pytest.raises(StopRequested):
        queues.read(redis_client, job.id)
    monkeypatch.undo()
    failed = f"rq:failed:{keys.MAINTENANCE_QUEUE}"
    assert redis_client.zscore(failed, job.id) is None
    again = queues.read(redis_client, job.id)
    assert isinstance(again, Job) and again.func_name == "engram.jobs.prune.prune_job"
