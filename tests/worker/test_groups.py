"""A partition's consumer group, or its acknowledgements, lost by Redis (a failover
to a replica that had not received them, a server restarted without its data): the
worker goes on, nothing waiting is skipped, nothing done is applied twice."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis

from engram.store import Store
from engram.worker import Producer, keys
from engram.worker.admin.pause import Pause, pause_partition, resume_partition
from engram.worker.consuming.groups import is_missing
from engram.worker.protocol import partition_of
from tests.redis_fixtures import FAST, InProcessWorker, wait_until

SCOPE = next(
    {"user_id": f"g-{i}"}
    for i in range(1_000)
    if partition_of({"user_id": f"g-{i}"}, FAST.partitions) == 0
)
CRASHED = 'partitions_lost_total{reason="crashed"}'


@pytest.mark.parametrize(
    "message",
    [
        "NOGROUP No such key 's' or consumer group 'g' in XREADGROUP with GROUP option",
        "Command # 3 (XREADGROUP GROUP engram-workers w COUNT 64 STREAMS engram:ops:{0}...)"
        " of pipeline caused error: NOGROUP No such key 'engram:ops:{0}' or consumer group",
    ],
)
def test_a_missing_group_is_recognised_alone_or_in_a_pipeline(message: str) -> None:
    assert is_missing(redis.ResponseError(message))


@pytest.mark.parametrize(
    "exc",
    [
        redis.ResponseError("BUSYGROUP Consumer Group name already exists"),
        redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        redis.ResponseError("Command # 1 (XADD k * op NOGROUP) of pipeline caused error: OOM"),
        redis.ConnectionError("NOGROUP"),
    ],
)
def test_nothing_else_is(exc: BaseException) -> None:
    assert not is_missing(exc)


def _send(producer: Producer, label: str, count: int) -> list[str]:
    pendings = [
        producer.remember(SCOPE, f"{label} {i}", operation_id=f"grp:{label}:{i}")
        for i in range(count)
    ]
    for p in pendings:
        p.wait(30)
    return [p.operation_id for p in pendings]


def _replays(store: Store) -> dict[str, int]:
    """How many times each of the scope's operations was answered again from its receipt."""
    return {r.operation_id: r.replays for r in store.receipts(scope=SCOPE, limit=100)}


def test_a_group_destroyed_under_a_running_worker_is_created_again(
    redis_url: str, fresh_store: Store, start_worker: Callable[..., InProcessWorker]
) -> None:
    client = redis.Redis.from_url(redis_url)
    with (
        Producer.from_url(redis_url, partitions=FAST.partitions) as producer,
        start_worker(fresh_store),
    ):
        _send(producer, "before", 10)
        assert client.xgroup_destroy(keys.stream(0), keys.GROUP)
        # Sent while the group is gone: read by no one until it is back.
        _send(producer, "meanwhile", 5)
        wait_until(lambda: client.hget(keys.METRICS, "ops_committed_total") == b"15", what="counts")
    assert fresh_store.scope_revision(SCOPE) == 15
    assert set(_replays(fresh_store).values()) == {0}
    # The consumer created it again itself: it did not crash and lose its partitions.
    assert client.hget(keys.METRICS, CRASHED) is None
    client.close()


def test_a_worker_started_on_a_stream_without_its_group_takes_what_waits(
    redis_url: str, fresh_store: Store, start_worker: Callable[..., InProcessWorker]
) -> None:
    client = redis.Redis.from_url(redis_url)
    with Producer.from_url(redis_url, partitions=FAST.partitions) as producer:
        with start_worker(fresh_store):
            _send(producer, "before", 10)
        assert client.xgroup_destroy(keys.stream(0), keys.GROUP)
        waiting = [
            producer.remember(SCOPE, f"meanwhile {i}", operation_id=f"grp:mean:{i}")
            for i in range(3)
        ]
        # Created at $ (the stream's end), the group would skip these three.
        with start_worker(fresh_store):
            for p in waiting:
                p.wait(30)
    assert fresh_store.scope_revision(SCOPE) == 13
    assert set(_replays(fresh_store).values()) == {0}
    client.close()


@pytest.mark.parametrize("delivered", [False, True], ids=["undelivered", "delivered"])
def test_acknowledgements_lost_in_a_failover_are_answered_from_the_receipts(
    redis_url: str,
    fresh_store: Store,
    start_worker: Callable[..., InProcessWorker],
    delivered: bool,
) -> None:
    """A replica promoted before it received a commit's ``XACK`` and ``XDEL`` holds the
    committed entries again: not yet delivered (it missed their delivery too), or
    pending to the worker that committed them, which no longer has them in hand.
    Either way they are delivered again and answered from their receipts."""
    client = redis.Redis.from_url(redis_url)
    with (
        Producer.from_url(redis_url, partitions=FAST.partitions) as producer,
        start_worker(fresh_store, worker_id="w-1"),
    ):
        done = _send(producer, "fact", 5)
        assert client.xlen(keys.stream(0)) == 0  # acknowledged and deleted
        pause_partition(client, 0, Pause(by="test", at_ms=int(time.time() * 1000)))
        wait_until(lambda: client.hget(keys.worker("w-1"), "paused") == b"0", what="the pause")
        # The failover: the stream as the replica holds it.
        again = [
            producer.remember(SCOPE, f"fact {i}", operation_id=op) for i, op in enumerate(done)
        ]
        if delivered:
            client.xreadgroup(keys.GROUP, "w-1", {keys.stream(0): ">"})
        resume_partition(client, 0)
        for p in again:
            assert p.wait(30).replayed
        wait_until(lambda: client.xlen(keys.stream(0)) == 0, what="the replays acknowledged")
        assert client.xpending(keys.stream(0), keys.GROUP)["pending"] == 0
    assert fresh_store.scope_revision(SCOPE) == 5
    assert _replays(fresh_store) == dict.fromkeys(done, 1)
    client.close()
