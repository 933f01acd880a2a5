"""Re-embedding with real processes: a jobs worker killed halfway, two jobs workers
competing, and stream workers writing all along."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from engram.demo_reembed import SteadyWriter
from engram.jobs import keys, reembed
from engram.jobs.progress import Progress
from engram.jobs.settings import Reembed
from engram.store import HashingEmbedder, Operation, Store
from engram.worker import Producer
from engram.worker.embedded.runtime import connect_redis
from tests.jobs_fixtures import PLUGINS, JobsProcess, marks, registry
from tests.redis_fixtures import FAST, WorkerProcess, wait_until

StartJobs = Callable[..., JobsProcess]
SLOW = {"ENGRAM_REEMBED_BATCH_SIZE": "50", "ENGRAM_TEST_EMBED_DELAY_S": "0.03"}


def fill(store: Store, count: int, scopes: int = 10) -> None:
    ops = [
        Operation.build("remember", {"user_id": f"u{i % scopes}"}, {"text": f"note {i} on tea"})
        for i in range(count)
    ]
    for start in range(0, count, 500):
        for result in store.execute(ops[start : start + 500], HashingEmbedder(64)):
            assert not isinstance(result, Exception), result


def state(store: Store, generation_id: int) -> Progress:
    generation = store.embeddings.get(generation_id)
    assert generation is not None
    progress = Progress.from_dict(generation.progress)
    assert progress is not None
    return progress


@pytest.mark.slow
def test_a_jobs_worker_killed_halfway_leaves_a_reembed_that_resumes_without_redoing_batches(
    fresh_store: Store, fresh_dsn: str, redis_url: str, jobs_processes: StartJobs, tmp_path: Path
) -> None:
    total = 3000
    fill(fresh_store, total)
    mark = tmp_path / "embedded"
    env = {**SLOW, "ENGRAM_TEST_EMBED_MARK": str(mark)}
    client = connect_redis(redis_url)
    started = reembed.start(
        fresh_store, client, registry(), "slow", requested_by="t", settings=Reembed(retry_s=(1,))
    )
    gen = started.generation_id
    first = jobs_processes(database_url=fresh_dsn, redis_url=redis_url, env=env)
    wait_until(
        lambda: fresh_store.embeddings.counts(gen)[0] >= total // 3, timeout=60, what="a third"
    )
    first.kill()
    done_at_kill = fresh_store.embeddings.counts(gen)[0]
    assert done_at_kill < total
    assert state(fresh_store, gen).state == "running"
    # The dead holder's lease runs out: it cannot keep the re-embedding for ever.
    ttl_ms = client.pttl(keys.REEMBED_LEASE)
    assert 0 < ttl_ms <= 2000

    second = jobs_processes(database_url=fresh_dsn, redis_url=redis_url, env=env)
    wait_until(
        lambda: state(fresh_store, gen).state == "activated", timeout=90, what="the activation"
    )
    assert fresh_store.embeddings.active().id == gen  # type: ignore[union-attr]
    assert fresh_store.embeddings.counts(gen) == (total, total)
    by_pid = Counter[int]()
    for pid, _, _, texts in marks(mark):
        by_pid[pid] += texts
    # The second worker embedded what was left, and the one batch in flight at the kill.
    assert total - done_at_kill <= by_pid[second.pid] <= total - done_at_kill + 50
    assert by_pid[first.pid] + by_pid[second.pid] <= total + 50
    final = state(fresh_store, gen)
    assert (final.done, final.total, final.requested_by) == (total, total, "t")
    assert client.get(keys.REEMBED_LEASE) is None, "released once done"


@pytest.mark.slow
def test_two_jobs_workers_never_run_two_slices_at_once(
    fresh_store: Store, fresh_dsn: str, redis_url: str, jobs_processes: StartJobs, tmp_path: Path
) -> None:
    total = 2000
    fill(fresh_store, total)
    mark = tmp_path / "embedded"
    # Short slices, so that the chain passes from one worker to the other.
    env = {**SLOW, "ENGRAM_TEST_EMBED_MARK": str(mark), "ENGRAM_REEMBED_SLICE": "0.3s"}
    client = connect_redis(redis_url)
    started = reembed.start(fresh_store, client, registry(), "slow", requested_by="t")
    gen = started.generation_id
    workers = [jobs_processes(database_url=fresh_dsn, redis_url=redis_url, env=env) for _ in "ab"]

    # And a meddler that keeps enqueueing competing slices, as a watchdog that thought
    # the running slice dead would.
    stop = threading.Event()

    def meddle() -> None:
        for n in itertools.count():
            if stop.wait(0.25):
                return
            generation = fresh_store.embeddings.get(gen)
            known = Progress.from_dict(generation.progress) if generation else None
            if known is None or known.finished:
                return
            job_id = f"reembed-meddler{n}"
            if fresh_store.embeddings.set_progress(
                gen, {**known.as_dict(), "job_id": job_id}, if_pending=True
            ):
                reembed._enqueue(client, gen, job_id, Reembed())

    meddler = threading.Thread(target=meddle)
    meddler.start()
    try:
        wait_until(
            lambda: state(fresh_store, gen).state == "activated", timeout=120, what="activation"
        )
    finally:
        stop.set()
        meddler.join()
    calls = marks(mark)
    pids = {pid for pid, *_ in calls}
    assert pids == {w.pid for w in workers}, "both workers carried slices"
    spans = sorted((start, end, pid) for pid, start, end, _ in calls)
    for (_, end, pid), (start, _, other) in itertools.pairwise(spans):
        assert start >= end or pid == other, "two workers embedded at the same time"
    assert sum(n for *_, n in calls) <= total + 50 * len(pids)
    assert fresh_store.embeddings.counts(gen) == (total, total)


@pytest.mark.slow
def test_a_reembed_under_stream_writes_commits_every_write_and_covers_them_all(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    worker_processes: Callable[..., WorkerProcess],
    jobs_processes: StartJobs,
) -> None:
    fill(fresh_store, 3000)
    workers = [
        worker_processes(
            database_url=fresh_dsn, redis_url=redis_url, env={"ENGRAM_EMBEDDERS": PLUGINS}
        )
        for _ in range(2)
    ]
    producer = Producer.from_url(redis_url, partitions=FAST.partitions)
    writers = [
        SteadyWriter(producer, 40.0, {"user_id": f"writer-{i}"}, f"w{i}").start() for i in range(2)
    ]
    time.sleep(1.0)  # writes under way before the re-embedding starts
    client = connect_redis(redis_url)
    started = reembed.start(fresh_store, client, registry(), "slow", requested_by="t")
    jobs_processes(
        database_url=fresh_dsn,
        redis_url=redis_url,
        env={"ENGRAM_REEMBED_BATCH_SIZE": "64", "ENGRAM_TEST_EMBED_DELAY_S": "0.01"},
    )
    gen = started.generation_id
    wait_until(lambda: state(fresh_store, gen).state == "activated", timeout=120, what="activation")
    written_before_switch = sum(len(w.sent) for w in writers)
    time.sleep(2.0)  # writes go on after the switch: the workers now embed with its model
    outcomes = Counter[str]()
    for writer in writers:
        outcomes += writer.stop()
    sent = sum(len(w.sent) for w in writers)
    assert outcomes == Counter(committed=sent), "every write committed, none refused"
    assert sent > written_before_switch > 40
    assert client.xlen("engram:dead") == 0
    active = fresh_store.embeddings.active()
    assert active is not None and active.id == gen and active.model_id == "slow-hashing-32"
    done, total = fresh_store.embeddings.counts(gen)
    assert done == total == 3000 + sent
    assert all(psutil.pid_exists(w.pid) and w.process.poll() is None for w in workers), (
        "the workers followed the switch without a restart"
    )
    producer.close()
