"""A jobs worker reads its queues as untrusted input: a planted job (a pickle that
would create a file, a hash of garbage) is never unpickled nor run, and the worker
goes on to the real jobs queued after it."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import redis

from engram.jobs import keys, prune, queues
from engram.store import Store
from engram.worker.embedded.runtime import connect_redis
from tests.helpers import Planted
from tests.jobs_fixtures import context, run_burst

QUEUE = keys.MAINTENANCE_QUEUE


def _plant(client: redis.Redis, job_id: str, **fields: Any) -> None:
    client.hset(f"rq:job:{job_id}", mapping={"origin": QUEUE, "status": "queued", **fields})
    client.rpush(f"rq:queue:{QUEUE}", job_id)


def test_planted_jobs_are_never_run_and_do_not_stop_the_jobs_worker(
    fresh_store: Store, redis_url: str, tmp_path: Path
) -> None:
    client = connect_redis(redis_url)
    pwned = tmp_path / "pwned"
    payload = pickle.dumps(Planted(pwned))
    _plant(client, "planted-pickle", data=payload, meta=payload, description="x")
    _plant(client, "planted-garbled", data=b"\xff\x00", created_at="\xff?", description="y")
    real = prune.enqueue(client, "history")

    run_burst(context(fresh_store, redis_url), redis_url)

    assert not pwned.exists()
    job = queues.fetch(client, real)
    assert job is not None and job.get_status() == "finished"
    # Off the queue (an upkeep job the ticker enqueued as the burst ended may be there).
    queued = set(client.lrange(f"rq:queue:{QUEUE}", 0, -1))
    assert not {b"planted-pickle", b"planted-garbled", real.encode()} & queued
    # Set aside where an operator sees them: among the queue's failed jobs.
    failed = client.zrange(f"rq:failed:{QUEUE}", 0, -1)
    assert {b"planted-pickle", b"planted-garbled"} <= set(failed)
