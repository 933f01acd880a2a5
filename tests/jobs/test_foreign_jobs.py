"""A jobs worker runs engram's own job functions only (``jobs.queues.FUNCTIONS``): a JSON
job naming any other (``os.makedirs``), or one of engram's with a callback or a webhook,
is set aside as unreadable before RQ imports anything it names, on every queue, by a
real ``engram jobs`` process; a real job queued beside them still runs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from rq import Callback, Queue
from rq.job import Job

from engram.jobs import keys, prune, queues
from engram.jobs.queues import FOREIGN, SERIALIZER, UnreadableJob
from engram.store import Store
from engram.worker.embedded.runtime import connect_redis
from tests.jobs_fixtures import JobsProcess, context, run_burst
from tests.redis_fixtures import wait_until

StartJobs = Callable[..., JobsProcess]


def _done(client: redis.Redis, queue_name: str, job_id: str) -> bool:
    """The worker is through with this job: run (finished, failed) or set aside."""
    queue = queues.queue(client, queue_name)
    return job_id not in queue.get_job_ids() and any(
        client.zscore(registry.key, job_id) is not None
        for registry in (queue.failed_job_registry, queue.finished_job_registry)
    )


def test_a_job_naming_another_function_is_set_aside_unrun_on_every_queue(
    fresh_store: Store, fresh_dsn: str, redis_url: str, jobs_processes: StartJobs, tmp_path: Path
) -> None:
    client = connect_redis(redis_url)
    bait = {name: tmp_path / f"made-on-{name}" for name in keys.QUEUES}
    planted = {
        name: Queue(name, connection=client, serializer=SERIALIZER).enqueue(
            "os.makedirs", str(path)
        )
        for name, path in bait.items()
    }
    # One of engram's functions, with a success callback: RQ would import and call it.
    called = tmp_path / "callback-called"
    hooked = Queue(keys.MAINTENANCE_QUEUE, connection=client, serializer=SERIALIZER).enqueue(
        prune.prune_job, "history", on_success=Callback("tests.rq_jobs.make_dir"),
        meta={"bait": str(called)},
    )  # fmt: skip
    # A job left "started" by a worker that died, with a failure callback: the worker's
    # clean-up of its started jobs would import and call that.
    abandoned = tmp_path / "abandoned-callback-called"
    _plant_abandoned(client, "planted-abandoned", abandoned)
    real = prune.enqueue(client, "history")

    jobs_processes(database_url=fresh_dsn, redis_url=redis_url)

    wait_until(
        lambda: (
            all(_done(client, name, job.id) for name, job in planted.items())
            and _done(client, keys.MAINTENANCE_QUEUE, hooked.id)
            and _done(client, keys.MAINTENANCE_QUEUE, real)
            and client.zcard(f"rq:wip:{keys.MAINTENANCE_QUEUE}") == 0
        ),
        timeout=30,
        what="the jobs worker through with every job",
    )
    assert [p for p in [*bait.values(), called, abandoned] if p.exists()] == []
    job = queues.fetch(client, real)
    assert job is not None and job.get_status() == "finished"  # the real one ran
    for name, job in planted.items():
        failed = queues.queue(client, name).failed_job_registry
        assert client.zscore(failed.key, job.id) is not None, name  # set aside, shown
        assert queues.read(client, job.id) == UnreadableJob(job.id, name, "queued", FOREIGN)
    maintenance_failed = f"rq:failed:{keys.MAINTENANCE_QUEUE}"
    assert client.zscore(maintenance_failed, hooked.id) is not None
    assert client.zscore(maintenance_failed, "planted-abandoned") is not None


def _plant_abandoned(client: redis.Redis, job_id: str, bait: Path) -> None:
    """A JSON job of engram's function, "started" by a worker long gone, that names a
    failure callback; its entry in the started jobs expired a while ago."""
    data = json.dumps(["engram.jobs.prune.prune_job", None, ["history"], {}])
    client.hset(
        f"rq:job:{job_id}",
        mapping={
            "data": data,
            "origin": keys.MAINTENANCE_QUEUE,
            "status": "started",
            "created_at": "2024-01-01T00:00:00.000000Z",
            "failure_callback_name": "tests.rq_jobs.make_dir",
            "meta": json.dumps({"bait": str(bait)}),
        },
    )
    client.zadd(f"rq:wip:{keys.MAINTENANCE_QUEUE}", {f"{job_id}:gone": time.time() - 60})


@pytest.mark.parametrize(
    "fields",
    [
        {"data": json.dumps(["os.makedirs", None, ["/tmp/x"], {}])},
        {"data": json.dumps(["engram.jobs.prune.prune_job.__globals__", None, [], {}])},
        {"data": json.dumps(["format", "{0}", ["x"], {}])},  # a method of an instance
        {"data": json.dumps(["engram.jobs.prune.prune_job", None, "history", {}])},
        {"data": json.dumps(["engram.jobs.prune.prune_job", None, ["history"], []])},
        {"success_callback_name": "os.makedirs"},
        {"failure_callback_name": "os.makedirs"},
        {"stopped_callback_name": "os.makedirs"},
        {"webhooks": json.dumps([{"url": "http://127.0.0.1:1/", "events": ["finished"]}])},
    ],
    ids=[
        "function",
        "attribute",
        "instance",
        "args",
        "kwargs",
        "success",
        "failure",
        "stopped",
        "webhook",
    ],
)
def test_only_a_call_of_engrams_functions_reads_as_a_job(
    redis_client: redis.Redis, fields: dict[str, str]
) -> None:
    """Read by the dashboard, the API and the worker alike (nothing is imported)."""
    own = {
        "data": json.dumps(["engram.jobs.prune.prune_job", None, ["history"], {}]),
        "origin": keys.MAINTENANCE_QUEUE,
        "status": "failed",
    }
    redis_client.hset("rq:job:own", mapping=own)
    redis_client.hset("rq:job:foreign", mapping={**own, **fields})
    found = queues.read_many(redis_client, ["own", "foreign"])
    assert isinstance(found[0], Job) and found[0].func_name == "engram.jobs.prune.prune_job"
    assert found[1] == UnreadableJob("foreign", keys.MAINTENANCE_QUEUE, "failed", FOREIGN)


def test_a_job_queued_before_the_namespace_still_runs(
    store: Store, redis_url: str, redis_client: redis.Redis
) -> None:
    """An older engram named its functions without the namespace (``jobs.prune
    .prune_job``): such a job is still one of engram's, and runs."""
    redis_client.hset(
        "rq:job:before",
        mapping={
            "data": json.dumps(["jobs.prune.prune_job", None, ["history"], {}]),
            "origin": keys.MAINTENANCE_QUEUE,
            "status": "queued",
            "created_at": "2026-01-01T00:00:00.000000Z",
            "description": "prune before",
        },
    )
    [found] = queues.read_many(redis_client, ["before"])
    assert isinstance(found, Job) and found.func_name == "engram.jobs.prune.prune_job"
    redis_client.rpush(f"rq:queue:{keys.MAINTENANCE_QUEUE}", "before")

    run_burst(context(store, redis_url), redis_url)

    assert queues.status(redis_client, "before") == "finished"
    ran = queues.fetch(redis_client, "before")
    assert ran is not None
    assert ran.return_value() == [{"what": "history", "removed": 0, "older_than": None}]


def test_engram_enqueues_only_its_job_functions(redis_client: redis.Redis) -> None:
    """Each name of ``FUNCTIONS`` is a job function engram has; no other is enqueued."""
    for name in queues.FUNCTIONS:
        module, _, attribute = name.rpartition(".")
        function = getattr(__import__(module, fromlist=[attribute]), attribute)
        assert f"{function.__module__}.{function.__qualname__}" == name
    with pytest.raises(ValueError, match="not one of engram's job functions"):
        queues.enqueue(redis_client, keys.MAINTENANCE_QUEUE, json.dumps, ("x",), job_id="x-1",
                       timeout_s=1)  # fmt: skip
    assert redis_client.exists("rq:job:x-1") == 0
