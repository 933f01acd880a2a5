"""One consumer serves all of a worker's partitions: what one cycle reads from
several partitions is one commit, and a refused fence fails only its partition."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

from engram.store import Fence, HashingEmbedder, Store, WriteOptions
from engram.worker import Operation, Producer, keys
from engram.worker.admin import metrics
from engram.worker.consuming.consumer import Consumer, Shared
from engram.worker.consuming.leases import Lease
from engram.worker.consuming.partition import Partition
from engram.worker.protocol import encode_entry, partition_of
from engram.worker.settings import WorkerConfig
from tests.helpers import CountingEmbedder
from tests.redis_fixtures import not_acknowledged, wait_until

CONFIG = WorkerConfig(partitions=3, block_ms=50, lease_ttl_ms=1000, lease_margin_ms=200)


def _scope_in(partition: int) -> dict[str, str]:
    return next(
        {"user_id": f"u{i}"}
        for i in range(1000)
        if partition_of({"user_id": f"u{i}"}, CONFIG.partitions) == partition
    )


def _consumer(
    store: Store,
    client: redis.Redis,
    embedder: Any,
    tokens: dict[int, int],
    config: WorkerConfig = CONFIG,
) -> tuple[Consumer, dict[int, Partition]]:
    consumer = Consumer(Shared(client, store, embedder, config, "w"))
    held = {
        n: Partition(Lease(n, "w", t), time.monotonic() + 60, config.partitions)
        for n, t in tokens.items()
    }
    for p in held.values():
        consumer.add(p)
    return consumer, held


def _enqueue(producer: Producer, counts: dict[int, int]) -> dict[int, list[Any]]:
    return {
        n: [producer.remember(_scope_in(n), f"fact {n}.{i}") for i in range(k)]
        for n, k in counts.items()
    }


def test_partitions_read_in_one_cycle_share_one_commit(
    fresh_store: Store, redis_client: redis.Redis
) -> None:
    producer = Producer(redis_client, partitions=CONFIG.partitions)
    pending = _enqueue(producer, {0: 2, 1: 3, 2: 1})
    embedder = CountingEmbedder(HashingEmbedder(32))
    consumer, _ = _consumer(fresh_store, redis_client, embedder, {0: 1, 1: 1, 2: 1})
    consumer.start()
    try:
        for waits in pending.values():
            assert [w.wait(10).scope_revision for w in waits] == list(range(1, len(waits) + 1))
    finally:
        consumer.stop()
        consumer.join(10)
    # One embedding call, so one store.execute, for the six operations of three streams.
    assert embedder.calls == 1 and len(embedder.texts) == 6
    counters = metrics.read_counters(redis_client)
    assert counters["batch_size_count"] == 1 and counters["batch_size_sum"] == 6
    assert not consumer.is_alive()


def test_a_lingering_consumer_commits_what_arrives_meanwhile_in_the_same_cycle(
    fresh_store: Store, redis_client: redis.Redis
) -> None:
    """With ``linger_ms``, a read that found a few entries waits that long and reads
    again: operations enqueued meanwhile commit with them, in their scopes' order."""
    config = WorkerConfig(
        partitions=3, block_ms=50, lease_ttl_ms=5000, lease_margin_ms=200, linger_ms=4000
    )
    producer = Producer(redis_client, partitions=config.partitions)
    embedder = CountingEmbedder(HashingEmbedder(32))
    consumer, _ = _consumer(fresh_store, redis_client, embedder, {0: 1, 1: 1, 2: 1}, config)
    consumer.start()
    try:
        first = producer.remember(_scope_in(0), "the first fact")
        wait_until(
            lambda: not_acknowledged(redis_client, 0) == 1,
            timeout=5,
            what="the first entry read (the consumer lingers now)",
        )
        later = _enqueue(producer, {0: 2, 1: 1})
        assert first.wait(10).scope_revision == 1
        assert [w.wait(10).scope_revision for w in later[0]] == [2, 3]
        assert later[1][0].wait(10).scope_revision == 1
    finally:
        consumer.stop()
        consumer.join(10)
    # One cycle, one commit: the four operations were embedded in one call.
    assert embedder.calls == 1 and len(embedder.texts) == 4


def test_a_stale_fence_at_the_start_fails_only_its_partition(
    fresh_store: Store, redis_client: redis.Redis
) -> None:
    newer = WriteOptions(fences=(Fence(keys.fence_name(2), 10),))  # a newer holder of 2
    fresh_store.execute([], options=newer)
    producer = Producer(redis_client, partitions=CONFIG.partitions)
    pending = _enqueue(producer, {0: 1, 1: 2, 2: 2})
    consumer, held = _consumer(fresh_store, redis_client, HashingEmbedder(32), {0: 1, 1: 1, 2: 5})
    consumer.start()
    try:
        assert held[2].done.wait(10) and held[2].lost == "fenced"
        assert [w.wait(10).scope_revision for w in pending[1]] == [1, 2]
        assert pending[0][0].wait(10).scope_revision == 1
    finally:
        consumer.stop()
        consumer.join(10)
    assert fresh_store.scope_revision(_scope_in(2)) == 0
    # Partition 2's entries were never read: they wait for its owner.
    assert redis_client.xlen(keys.stream(2)) == 2
    assert all(producer.results(w.scope, [w.operation_id]) == {} for w in pending[2])
    assert held[0].lost is None and held[1].lost is None


def test_a_fence_raised_during_a_commit_fails_only_its_partition(
    fresh_store: Store, redis_client: redis.Redis
) -> None:
    """Partition 1 is taken over while the merged batch is being embedded: the commit
    is refused, partition 1's entries stay pending and the others commit without it."""

    class TakenOverWhileEmbedding(HashingEmbedder):
        calls = 0

        def embed(self, texts: Sequence[str]) -> Any:
            self.calls += 1
            if self.calls == 1:
                fresh_store.execute(
                    [], options=WriteOptions(fences=(Fence(keys.fence_name(1), 20),))
                )
            return super().embed(texts)

    producer = Producer(redis_client, partitions=CONFIG.partitions)
    pending = _enqueue(producer, {0: 2, 1: 2})
    embedder = TakenOverWhileEmbedding(32)
    consumer, held = _consumer(fresh_store, redis_client, embedder, {0: 1, 1: 1})
    consumer.start()
    try:
        assert [w.wait(10).scope_revision for w in pending[0]] == [1, 2]
        assert held[1].done.wait(10) and held[1].lost == "fenced"
    finally:
        consumer.stop()
        consumer.join(10)
    assert embedder.calls == 2  # the merged batch, then partition 0's alone
    assert fresh_store.scope_revision(_scope_in(1)) == 0
    assert redis_client.xpending(keys.stream(1), keys.GROUP)["pending"] == 2
    assert redis_client.xpending(keys.stream(0), keys.GROUP)["pending"] == 0
    assert metrics.read_counters(redis_client)["commits_fenced_total"] == 1


def test_a_released_partition_is_let_go_between_cycles(
    fresh_store: Store, redis_client: redis.Redis
) -> None:
    producer = Producer(redis_client, partitions=CONFIG.partitions)
    consumer, held = _consumer(fresh_store, redis_client, HashingEmbedder(32), {0: 1, 1: 1})
    consumer.start()
    try:
        assert _enqueue(producer, {1: 1})[1][0].wait(10).scope_revision == 1
        held[1].release_requested = True
        assert held[1].done.wait(10) and held[1].lost is None
        late = _enqueue(producer, {0: 1, 1: 1})
        assert late[0][0].wait(10).scope_revision == 1
        time.sleep(0.3)  # a few cycles: partition 1 is not read any more
        assert redis_client.xlen(keys.stream(1)) == 1
    finally:
        consumer.stop()
        consumer.join(10)
    wait_until(lambda: held[0].done.is_set(), what="partition 0 let go on stop")


class _HeldEmbedder(HashingEmbedder):
    """Holds the first cycle in its embedding call until the test lets it go."""

    def __init__(self, dims: int) -> None:
        super().__init__(dims)
        self.entered = threading.Event()
        self.go_on = threading.Event()

    def embed(self, texts: Sequence[str]) -> Any:
        self.entered.set()
        assert self.go_on.wait(10)
        return super().embed(texts)


def test_a_consumer_asked_to_stop_answers_and_acknowledges_the_cycle_in_hand(
    fresh_store: Store, redis_client: redis.Redis
) -> None:
    """A cycle's replies and acknowledgements ride with the next read; a stop has
    no next read, so they go on their own before the consumer returns."""
    [pending] = _enqueue(Producer(redis_client, partitions=CONFIG.partitions), {0: 1})[0]
    embedder = _HeldEmbedder(32)
    consumer, _ = _consumer(fresh_store, redis_client, embedder, {0: 1})
    consumer.start()
    assert embedder.entered.wait(10)
    consumer.stop()
    embedder.go_on.set()
    consumer.join(10)
    assert not consumer.is_alive()
    assert pending.wait(0.1).scope_revision == 1
    assert redis_client.xpending(keys.stream(0), keys.GROUP)["pending"] == 0


def test_a_released_partition_is_acknowledged_before_it_is_let_go(
    fresh_store: Store, redis_client: redis.Redis
) -> None:
    [pending] = _enqueue(Producer(redis_client, partitions=CONFIG.partitions), {0: 1})[0]
    embedder = _HeldEmbedder(32)
    consumer, held = _consumer(fresh_store, redis_client, embedder, {0: 1})
    consumer.start()
    try:
        assert embedder.entered.wait(10)
        held[0].release_requested = True  # its last partition: no read follows
        embedder.go_on.set()
        assert held[0].done.wait(10)
        # Its next holder claims what is pending: nothing of what this one committed.
        assert redis_client.xpending(keys.stream(0), keys.GROUP)["pending"] == 0
        assert pending.wait(0.1).scope_revision == 1
    finally:
        consumer.stop()
        consumer.join(10)


def test_an_entry_read_by_a_consumer_whose_lease_ran_out_is_claimed_and_committed(
    fresh_store: Store, redis_client: redis.Redis
) -> None:
    """A worker's read sent before its lease ran out and answered after (Redis was
    restarting) leaves the entry pending to it, after the partition's new holder
    claimed what was pending when it took over. The holder finds it and commits it."""
    producer = Producer(redis_client, partitions=CONFIG.partitions)
    consumer, _ = _consumer(fresh_store, redis_client, HashingEmbedder(32), {0: 1})
    consumer.start()
    try:
        assert _enqueue(producer, {0: 1})[0][0].wait(10).scope_revision == 1  # taken over
        op = Operation.build("remember", _scope_in(0), {"text": "read by the old holder"}, None)
        stream = keys.stream(0)
        stale = redis_client.pipeline(transaction=True)  # added and read at once
        stale.xadd(stream, encode_entry(op))
        stale.xreadgroup(keys.GROUP, "old-holder", {stream: ">"}, count=1)
        stale.execute()
        assert redis_client.xpending(stream, keys.GROUP)["consumers"][0]["name"] == b"old-holder"
        receipt = producer.wait(op.scope, op.operation_id, 10)
        assert receipt.scope_revision == 2
        wait_until(lambda: redis_client.xpending(stream, keys.GROUP)["pending"] == 0)
    finally:
        consumer.stop()
        consumer.join(10)


def test_a_partition_whose_lease_renewal_is_late_is_not_read(
    fresh_store: Store, redis_client: redis.Redis
) -> None:
    """Until its lease is known to be renewed, a partition's entries stay in the stream
    for whoever holds it next, not pending to a holder that may no longer hold it."""
    producer = Producer(redis_client, partitions=CONFIG.partitions)
    consumer, held = _consumer(fresh_store, redis_client, HashingEmbedder(32), {0: 1})
    consumer.start()
    try:
        assert _enqueue(producer, {0: 1})[0][0].wait(10).scope_revision == 1
        held[0].valid_until = time.monotonic()  # no renewal since: as with Redis away
        # The cycle in flight (its read sent while the lease was valid) has ended.
        seen = consumer.cycles + 2
        wait_until(lambda: consumer.cycles >= seen, what="a cycle after the lapse")
        [late] = _enqueue(producer, {0: 1})[0]
        seen = consumer.cycles + 10
        wait_until(lambda: consumer.cycles >= seen, what="ten cycles after the send")
        assert redis_client.xpending(keys.stream(0), keys.GROUP)["pending"] == 0
        assert producer.results(late.scope, [late.operation_id]) == {}
        held[0].valid_until = time.monotonic() + 60  # renewed
        assert late.wait(10).scope_revision == 2
    finally:
        consumer.stop()
        consumer.join(10)
