"""A jobs worker's stop does not wait out RQ's command channel: with redis-py 8 the
channel's thread, once it had read its own unsubscribe, waited its whole read (60 s in
RQ) before the stop could join it, and ``engram up`` took a minute to stop now and then."""

from __future__ import annotations

import time

from engram.jobs import keys, queues, runner
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
