"""engram's own jobs, made to fail or finish on a plain RQ worker in the tests (a jobs
worker runs no other function: ``jobs.queues.FUNCTIONS``), and a planted job's bait."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from rq import Queue, SimpleWorker
from rq.job import Job

from engram.jobs import prune
from engram.jobs.context import install
from engram.jobs.queues import SERIALIZER
from engram.store import Store
from tests.jobs_fixtures import context


def enqueue_failing(queue: Queue, label: str) -> Job:
    """A prune of ``label``, which is none of the prunes: it fails when it runs
    (``JobFailedError: prune failed: InvalidRequestError: prune one of ...``), and
    names ``label`` in its arguments."""
    return queue.enqueue(prune.prune_job, label)


def enqueue_finishing(queue: Queue) -> Job:
    """A prune of the dead letters older than an hour: it finishes when it runs."""
    return queue.enqueue(prune.prune_job, "dead-letters", 3600)


class PlainWorker(SimpleWorker):
    """RQ's plain worker, but for the wait of its command channel's reads. RQ's thread
    waits 60 s at a time, and the worker's stop joins it: with redis-py 8 it waits the
    whole 60 s when it reads its own unsubscribe first, so a burst ended a minute late
    now and then (as the jobs worker's stop did: ``jobs.runner.JobsWorker.subscribe``)."""

    def subscribe(self) -> None:
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=0.1, daemon=True, exception_handler=self._pubsub_exception_handler
        )


def work(
    store: Store, redis_url: str, client: redis.Redis, queue: Queue, max_jobs: int | None = None
) -> None:
    """Run ``queue``'s jobs on a plain RQ worker in this process, with a job context on
    ``store`` installed (as the jobs worker does), until it is empty (or ``max_jobs``)."""
    install(context(store, redis_url))
    PlainWorker([queue], connection=client, serializer=SERIALIZER).work(
        burst=True, max_jobs=max_jobs
    )


def make_dir(job: Any, *_: Any) -> None:
    """A callback's bait: makes the directory named by the job's ``meta["bait"]`` (a
    planted job naming this as its callback must never get here)."""
    Path(job.meta["bait"]).mkdir()
