"""Pausing a partition and the jobs queues (``worker.pause``), with real workers: a paused
partition's operations wait in its stream (pending ones too) and commit in order once it
is resumed; paused jobs are not run until resumed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue, Worker
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker

from engram.cli import main
from engram.jobs import keys as jobs_keys
from engram.jobs import prune, queues
from engram.store import HashingEmbedder, Store
from engram.worker import Producer, keys
from engram.worker.admin import pause
from engram.worker.consuming.consumer import Consumer, Shared
from engram.worker.embedded.runtime import connect_redis
from engram.worker.protocol import partition_of
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.jobs_fixtures import JobsProcess, context, jobs_processes, run_burst  # noqa: F401
from tests.redis_fixtures import FAST, WorkerProcess, wait_until

PAUSED = 1


def scope_on(partition: int, name: str) -> dict[str, str]:
    """A scope of ``name``'s whose operations go to ``partition``."""
    for i in range(1000):
        scope = {"user_id": f"{name}-{i}"}
        if partition_of(scope, FAST.partitions) == partition:
            return scope
    raise AssertionError("no scope found")


def worker_field(client: redis.Redis, name: str) -> str | None:
    worker_id: Any
    for worker_id in client.zrange(keys.WORKERS, 0, -1):
        value: Any = client.hget(keys.worker(bytes(worker_id).decode()), name)
        if value is not None:
            return bytes(value).decode()
    return None


def receipts_of(store: Store, scope: dict[str, str]) -> list[Any]:
    return list(store.receipts(scope=scope))


def test_the_watch_reads_again_once_due_and_tells_a_change() -> None:
    watch = pause.PauseWatch(every_s=1.0)
    assert watch.due(0.0)
    assert watch.update(frozenset(), 0.0)  # the first look is always told
    assert not watch.due(0.5) and watch.due(1.0)
    assert not watch.update(frozenset(), 1.0)
    assert watch.update(frozenset({2}), 2.0) and watch.paused == {2}


def test_a_pause_is_in_effect_once_every_live_worker_reports_it() -> None:
    workers = [
        {"id": "w1", "paused": "3,12"},
        {"id": "w2", "paused": "13"},  # 13 is not 3
        {"id": "w3"},  # not reported yet
    ]
    assert pause.not_yet_seen(3, workers) == ["w2", "w3"]
    assert pause.not_yet_seen(13, workers) == ["w1", "w3"]
    assert pause.not_yet_seen(3, [{"id": "w1", "paused": "3"}]) == []


def test_a_consumer_takes_the_pauses_its_worker_read_and_never_an_older_read(
    store: Store, redis_client: redis.Redis
) -> None:
    """The worker's own thread reads the paused partitions each tick and offers them to
    its consumer (so a cycle pays no round trip for them); a read sent before the
    consumer's own last look would undo a pause that look saw, and is passed over."""
    consumer = Consumer(Shared(redis_client, store, HashingEmbedder(64), FAST, "w-pause"))
    stale_sent = time.monotonic()  # a tick's read, sent before the pause below
    pause.pause_partition(redis_client, 2, pause.Pause.now("tester"))
    assert consumer._paused() == {2}  # nothing offered yet: the consumer looks itself
    assert redis_client.hget(keys.worker("w-pause"), "paused") == b"2"

    consumer.offer_pauses(frozenset(), stale_sent)  # what the tick saw before the pause
    assert consumer._paused() == {2}
    assert redis_client.hget(keys.worker("w-pause"), "paused") == b"2"

    pause.pause_partition(redis_client, 3, pause.Pause.now("tester"))
    consumer.offer_pauses(pause.paused_numbers(redis_client), time.monotonic())
    assert consumer._paused() == {2, 3}  # taken from the offer, before any look was due
    assert redis_client.hget(keys.worker("w-pause"), "paused") == b"2,3"


def test_a_pause_is_stored_with_who_when_and_why(redis_client: redis.Redis) -> None:
    pause.pause_partition(redis_client, 3, pause.Pause.now("ada", "  reindexing  "))
    redis_client.hset(keys.PAUSED, "junk", "x")  # not a partition: ignored
    [(number, found)] = pause.paused_partitions(redis_client).items()
    assert (number, found.by, found.reason) == (3, "ada", "reindexing") and found.at is not None
    assert pause.resume_partition(redis_client, 3)
    assert not pause.resume_partition(redis_client, 3)
    assert pause.paused_partitions(redis_client) == {}
    with pytest.raises(ValueError, match="no partition 4"):
        pause.check_partition(4, FAST.partitions)


def test_a_paused_partition_waits_then_commits_in_order(
    store: Store,
    dsn: str,
    redis_url: str,
    worker_processes: Callable[..., WorkerProcess],
) -> None:
    client = connect_redis(redis_url)
    producer = Producer(client, partitions=FAST.partitions)
    held, other = scope_on(PAUSED, "held"), scope_on(PAUSED + 1, "other")
    stream = keys.stream(PAUSED)
    # Two operations read by a worker that died before committing: pending on the stream.
    client.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
    first = [producer.remember(held, f"fact {i}", operation_id=f"held:{i}") for i in range(2)]
    client.xreadgroup(keys.GROUP, "gone", {stream: ">"})
    pause.pause_partition(client, PAUSED, pause.Pause.now("tester", "maintenance"))

    worker_processes(database_url=dsn, redis_url=redis_url)
    wait_until(lambda: worker_field(client, "paused") == str(PAUSED), what="the pause seen")
    wait_until(lambda: worker_field(client, "partitions") == "0,1,2,3", what="all partitions")
    later = [producer.remember(held, f"fact {i}", operation_id=f"held:{i}") for i in range(2, 7)]
    # Sent after them, on another partition: once it is committed, the worker has read
    # every partition it would read since they were sent.
    producer.remember(other, "probe", operation_id="probe").wait(15)
    assert receipts_of(store, held) == []
    assert client.xlen(stream) == 7  # the producers were not held back
    pending = client.xpending_range(stream, keys.GROUP, min="-", max="+", count=10)
    assert [(p["consumer"], p["times_delivered"]) for p in pending] == [(b"gone", 1)] * 2

    assert pause.resume_partition(client, PAUSED)
    receipts = [p.wait(15) for p in first + later]
    assert [r.operation_id for r in receipts] == [f"held:{i}" for i in range(7)]
    assert [r.scope_revision for r in receipts] == list(range(1, 8))
    wait_until(lambda: worker_field(client, "paused") == "", what="the resume seen")
    assert client.xlen(stream) == 0
    client.close()


def state_of(rq_worker: BaseWorker) -> str:
    rq_worker.refresh()
    return str(rq_worker.get_state())


def idle(client: redis.Redis, rq_worker: BaseWorker) -> bool:
    """Waiting for a job, every queue empty (the jobs it enqueues at start are done)."""
    queued = sum(len(Queue(q, connection=client)) for q in jobs_keys.QUEUES)
    return state_of(rq_worker) == "idle" and queued == 0


def _prune_job(client: redis.Redis) -> str:
    return prune.enqueue(client, "dead-letters", older_than_s=3600)


def test_a_burst_jobs_worker_runs_no_job_while_paused(store: Store, redis_url: str) -> None:
    ctx = context(store, redis_url)
    client = ctx.client
    pause.pause_jobs(client, pause.Pause.now("tester", "upgrade"))
    assert pause.paused(client).jobs is not None
    job_id = _prune_job(client)
    run_burst(ctx, redis_url)
    assert queues.status(client, job_id) == "queued"
    assert pause.resume_jobs(client)
    run_burst(ctx, redis_url)
    assert queues.status(client, job_id) == "finished"
    assert pause.jobs_paused(client) is None


def test_an_idle_jobs_worker_stops_taking_jobs_when_paused(
    store: Store,
    dsn: str,
    redis_url: str,
    jobs_processes: Callable[..., JobsProcess],  # noqa: F811
) -> None:
    client = connect_redis(redis_url)
    jobs_processes(database_url=dsn, redis_url=redis_url)
    [rq_worker] = wait_until(lambda: Worker.all(connection=client), what="the jobs worker")
    wait_until(lambda: idle(client, rq_worker), what="the jobs worker idle")
    # Idle, it is waiting for the next job; RQ looks at the suspension between two
    # waits, and the jobs worker's waits are short: it sees the pause within them.
    pause.pause_jobs(client, pause.Pause.now("tester"))
    wait_until(lambda: state_of(rq_worker) == "suspended", what="the worker suspended")
    job_id = _prune_job(client)
    # It looks at the suspension each second, beating as it does: two beats later it is
    # still suspended, and the job is still queued.
    beats: list[Any] = []

    def beat_seen() -> bool:
        rq_worker.refresh()
        if rq_worker.last_heartbeat not in beats:
            beats.append(rq_worker.last_heartbeat)
        return len(beats) >= 3

    wait_until(beat_seen, what="the worker's beats")
    assert queues.status(client, job_id) == "queued"
    assert state_of(rq_worker) == "suspended"
    assert len(Queue(jobs_keys.MAINTENANCE_QUEUE, connection=client, serializer=JSONSerializer))

    pause.resume_jobs(client)
    wait_until(lambda: queues.status(client, job_id) == "finished", what="the job run")
    client.close()


# -- the command line ------------------------------------------------------------------


def test_the_cli_pauses_lists_and_resumes(
    monkeypatch: pytest.MonkeyPatch,
    redis_client: redis.Redis,
    redis_url: str,
    fresh_store: Store,
    fresh_dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    assert main(["pause", "partition", "2", "--reason", "reindex", "--by", "ada"]) == 0
    assert main(["pause", "jobs"]) == 0
    capsys.readouterr()
    assert main(["paused", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(p["partition"], p["by"], p["reason"]) for p in listed["partitions"]] == [
        (2, "ada", "reindex")
    ]
    assert listed["jobs"]["paused"] is True and listed["jobs"]["by"].startswith("cli:")
    assert main(["paused"]) == 0
    out = capsys.readouterr().out
    assert "partition 2" in out and "reindex" in out and "jobs" in out

    assert main(["pause", "partition", str(FAST.partitions)]) == 2
    assert "no partition 4: they are numbered 0 to 3" in capsys.readouterr().err
    assert main(["resume", "partition", "7"]) == 2
    assert pause.paused_numbers(redis_client) == {2}

    assert main(["resume", "partition", "2"]) == 0
    assert main(["resume", "jobs"]) == 0
    assert capsys.readouterr().out.splitlines() == ["partition 2 resumed", "jobs resumed"]
    assert main(["paused"]) == 0
    assert capsys.readouterr().out == "nothing is paused\n"
    # Who did what, and why, is in the audit trail as from the dashboard; the refused
    # pause wrote nothing.
    trail = [(e.requested_by, e.action, e.target, e.detail) for e in fresh_store.audit.page().items]
    me = listed["jobs"]["by"]
    assert sorted(trail) == sorted(
        [
            ("ada", "partition.pause", "2", {"reason": "reindex"}),
            (me, "jobs.pause", "jobs", {}),
            (me, "partition.resume", "2", {"was_paused": True}),
            (me, "jobs.resume", "jobs", {"was_paused": True}),
        ]
    )
