"""Leases, fencing and rebalancing against a real valkey-server (and PostgreSQL)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from engram.store import Fence, HashingEmbedder, Store, WriteOptions
from engram.worker import Producer, keys
from engram.worker.admin import metrics
from engram.worker.consuming.consumer import Consumer, Shared
from engram.worker.consuming.leases import Lease, Leases
from engram.worker.consuming.partition import Partition
from engram.worker.protocol import partition_of
from engram.worker.settings import WorkerConfig
from tests.redis_fixtures import FAST, InProcessWorker, wait_until

StartWorker = Callable[..., InProcessWorker]


def test_a_lease_has_one_holder_and_a_new_token_each_time(redis_client: redis.Redis) -> None:
    leases = Leases(redis_client, ttl_ms=300)
    a = leases.acquire(0, "a")
    assert a is not None and leases.acquire(0, "b") is None
    assert leases.holders([0, 1]) == {0: ("a", a.token), 1: None}
    assert leases.renew([a, Lease(0, "b", a.token)]) == [True, False]
    leases.release([Lease(0, "b", a.token)])  # not b's to release
    assert leases.holders([0])[0] == ("a", a.token)
    leases.release([a])
    b = leases.acquire(0, "b")
    assert b is not None and b.token > a.token
    time.sleep(0.4)  # not renewed: it runs out
    assert leases.renew([b]) == [False]
    c = leases.acquire(0, "c")
    assert c is not None and c.token > b.token


def test_tokens_keep_growing_when_the_counter_is_lost(redis_client: redis.Redis) -> None:
    leases = Leases(redis_client, ttl_ms=1000)
    first = leases.acquire(3, "a")
    assert first is not None
    leases.release([first])
    redis_client.delete(keys.fence_counter(3))  # a rebuilt Redis
    second = leases.acquire(3, "a")
    assert second is not None and second.token > first.token


def test_holders_drawn_within_one_millisecond_after_a_loss_get_distinct_tokens(
    redis_client: redis.Redis,
) -> None:
    """The counter is lost, the partition changes hands twice in a row, all in one
    pipeline (microseconds apart): the tokens still differ and grow."""
    leases = Leases(redis_client, ttl_ms=1000)
    lease, counter = keys.lease(3), keys.fence_counter(3)
    pipe = redis_client.pipeline(transaction=False)
    for holder in ("a", "b", "c"):
        pipe.delete(lease, counter)
        leases._acquire(keys=[lease, counter], args=[holder, 1000], client=pipe)
    tokens = [int(t) for t in pipe.execute()[1::2]]
    assert tokens == sorted(set(tokens)), tokens
    assert leases.holders([3])[3] == ("c", tokens[-1])


def _consume(
    store: Store,
    client: redis.Redis,
    token: int,
    embedder: Any,
    config: WorkerConfig,
    valid_for_s: float = 60,
) -> tuple[Consumer, Partition]:
    """A consumer serving partition 0 under ``token``, started."""
    consumer = Consumer(Shared(client, store, embedder, config, f"worker-{token}"))
    partition = Partition(
        Lease(0, f"worker-{token}", token), time.monotonic() + valid_for_s, config.partitions
    )
    consumer.add(partition)
    consumer.start()
    return consumer, partition


def _stop(consumer: Consumer) -> None:
    consumer.stop()
    consumer.join(timeout=10)
    assert not consumer.is_alive()


def test_a_worker_with_an_older_token_commits_nothing(
    fresh_store: Store, redis_client: redis.Redis
) -> None:
    """The partition moved to a newer token while this worker held a batch: the store
    refuses its commit, it acknowledges nothing, and the entries wait for the new owner."""
    config = WorkerConfig(partitions=1, block_ms=50, lease_ttl_ms=1000, lease_margin_ms=200)
    producer = Producer(redis_client, partitions=1)
    pending = [producer.remember({"user_id": "ada"}, f"fact {i}") for i in range(3)]

    class TakenOverWhileEmbedding(HashingEmbedder):
        def embed(self, texts: Any) -> Any:
            # Another worker takes the partition (token 20) while this one embeds.
            fresh_store.execute(
                [], None, options=WriteOptions(fences=(Fence(keys.fence_name(0), 20),))
            )
            return super().embed(texts)

    consumer, partition = _consume(
        fresh_store, redis_client, 10, TakenOverWhileEmbedding(64), config
    )
    assert partition.done.wait(10) and partition.lost == "fenced"
    _stop(consumer)
    assert fresh_store.scope_revision({"user_id": "ada"}) == 0
    stream = keys.stream(0)
    assert redis_client.xpending(stream, keys.GROUP)["pending"] == 3  # not acknowledged
    assert metrics.read_counters(redis_client)["commits_fenced_total"] == 1
    assert all(producer.results(p.scope, [p.operation_id]) == {} for p in pending)

    # An even older holder is refused as soon as it starts.
    stale, stale_partition = _consume(fresh_store, redis_client, 5, HashingEmbedder(64), config)
    assert stale_partition.done.wait(10) and stale_partition.lost == "fenced"
    _stop(stale)

    # The new owner claims the pending entries and commits them, in order.
    owner, _ = _consume(fresh_store, redis_client, 20, HashingEmbedder(64), config)
    try:
        receipts = [p.wait(10) for p in pending]
    finally:
        _stop(owner)
    assert [r.scope_revision for r in receipts] == [1, 2, 3]
    assert redis_client.xpending(stream, keys.GROUP)["pending"] == 0


def test_a_partition_past_its_lease_commits_nothing(
    fresh_store: Store, redis_client: redis.Redis
) -> None:
    config = WorkerConfig(partitions=1, block_ms=50, lease_ttl_ms=1000, lease_margin_ms=200)
    Producer(redis_client, partitions=1).remember({"user_id": "ada"}, "fact")
    consumer, partition = _consume(
        fresh_store, redis_client, 7, HashingEmbedder(64), config, valid_for_s=-1
    )
    assert partition.done.wait(10) and partition.lost == "lease_expired"
    _stop(consumer)
    assert fresh_store.scope_revision({"user_id": "ada"}) == 0


def test_workers_share_the_partitions_and_take_over_a_stopped_one(
    store: Store, start_worker: StartWorker, redis_url: str
) -> None:
    producer = Producer.from_url(redis_url, partitions=FAST.partitions)
    with start_worker(store, worker_id="a") as a:
        second = start_worker(store, worker_id="b")
        with second as b:
            wait_until(
                lambda: len(a.partitions) == 2 and len(b.partitions) == 2,
                what="two partitions each",
            )
            assert set(a.partitions) | set(b.partitions) == set(range(FAST.partitions))
            owned_by_b = b.partitions
        # b stopped (released its leases): a takes everything.
        wait_until(
            lambda: len(a.partitions) == FAST.partitions, timeout=5, what="a to take b's partitions"
        )
        scope = next(
            {"user_id": f"s{i}"}
            for i in range(100)
            if partition_of({"user_id": f"s{i}"}, FAST.partitions) in owned_by_b
        )
        assert producer.remember(scope, "after the handover").wait(10).scope_revision >= 1
