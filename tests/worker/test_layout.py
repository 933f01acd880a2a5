"""The partition layout and its online switch (``worker.layout``): the pure plan, the
keys of each epoch, the producers' refusal of a closed partition, the barrier, a
switch with an in-process worker, and the retirement of the replaced epoch's keys. The
switch under load with real worker processes killed is in ``test_repartition``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from redis.crc import key_slot

from engram.store import Operation, Store
from engram.store.errors import ConfigError, EngramError
from engram.worker import PartitionRetiredError, Producer, Settings, WorkerConfig, keys, layout
from engram.worker.admin import deadletters, metrics
from engram.worker.defaults import MAX_PARTITIONS
from engram.worker.errors import RepartitionError
from engram.worker.layout import Epoch, Layout
from engram.worker.protocol import encode_entry, partition_of
from tests.redis_fixtures import FAST, InProcessWorker, wait_until

# -- pure ------------------------------------------------------------------------------


def test_epoch_zero_keeps_the_key_names_of_before() -> None:
    assert keys.stream(3) == keys.stream(3, 0) == "engram:ops:{3}"
    assert keys.lease(3, 0) == "engram:lease:{3}"
    assert keys.fence_counter(3, 0) == "engram:fence:{3}"
    assert keys.fence_name(3, 0) == "partition:3"


def test_a_later_epoch_has_keys_of_its_own_in_one_slot_per_partition() -> None:
    names = [keys.stream(3, 2), keys.closed(3, 2), keys.lease(3, 2), keys.fence_counter(3, 2)]
    assert names[0] == "engram:ops:{e2.3}"
    assert len({key_slot(n.encode()) for n in names}) == 1
    assert keys.fence_name(3, 2) == "partition:e2.3"
    assert len({keys.stream(3, e) for e in range(4)}) == 4


def test_a_switch_plans_the_next_epoch_and_refuses_what_is_no_switch() -> None:
    steady = Layout.initial(4)
    switching = layout.plan(steady, 6)
    assert switching == Layout(Epoch(1, 6), previous=Epoch(0, 4))
    assert switching.serving == Epoch(0, 4) and switching.switching
    assert layout.plan(switching, 6) == switching  # taken up again: the same
    assert layout.finished(switching) == Layout(Epoch(1, 6))
    assert layout.plan(layout.finished(switching), 3).previous == Epoch(1, 6)
    for target in (0, -1):
        with pytest.raises(RepartitionError, match="at least 1"):
            layout.plan(steady, target)
    with pytest.raises(RepartitionError, match="already has 4"):
        layout.plan(steady, 4)
    with pytest.raises(RepartitionError, match="in progress"):
        layout.plan(switching, 5)
    assert RepartitionError.code == "repartition_refused"


def test_past_the_maximum_a_count_is_refused_wherever_it_comes_from() -> None:
    with pytest.raises(RepartitionError, match=f"at most {MAX_PARTITIONS}"):
        layout.plan(Layout.initial(4), MAX_PARTITIONS + 1)
    assert layout.plan(Layout.initial(4), MAX_PARTITIONS).current == Epoch(1, MAX_PARTITIONS)
    with pytest.raises(ConfigError):  # a layout planted in Redis
        Layout.decode(f'{{"epoch": 1, "partitions": {MAX_PARTITIONS + 1}}}')
    with pytest.raises(ValueError, match=f"ENGRAM_PARTITIONS.*at most {MAX_PARTITIONS}"):
        Settings.from_env({"ENGRAM_PARTITIONS": str(MAX_PARTITIONS + 1)})
    with pytest.raises(ValueError):
        WorkerConfig(partitions=MAX_PARTITIONS + 1)
    assert Settings.from_env({"ENGRAM_PARTITIONS": str(MAX_PARTITIONS)}).worker.partitions


def test_a_layout_reads_back_what_it_wrote_and_refuses_anything_else() -> None:
    for value in (Layout.initial(16), Layout(Epoch(2, 3), previous=Epoch(1, 8))):
        assert Layout.decode(value.encode()) == value
    for raw in (
        "",
        "[]",
        '{"epoch": 1}',
        '{"epoch": 1, "partitions": 0}',
        '{"epoch": "1", "partitions": 2}',
        '{"epoch": 1, "partitions": 2, "previous": {"epoch": 1, "partitions": 2}}',
    ):
        with pytest.raises(ConfigError):
            Layout.decode(raw)


# -- in Redis ----------------------------------------------------------------------------


def _scopes(count: int) -> list[dict[str, str]]:
    return [{"user_id": f"layout-{i}"} for i in range(count)]


def test_a_producer_sends_to_the_new_epoch_once_the_old_partition_is_closed(
    redis_client: redis.Redis, redis_url: str
) -> None:
    producer = Producer.from_url(redis_url, partitions=4)
    scope = {"user_id": "ada"}
    first = producer.remember(scope, "before")
    assert producer.layout() == Layout.initial(4)
    before, after = layout.begin(redis_client, 6, 4)
    assert before == Layout.initial(4) and after.current == Epoch(1, 6)
    assert layout.stored(redis_client) == after
    # The producer still holds epoch 0: the closed stream refuses, it reloads.
    second = producer.remember(scope, "after")
    assert producer.layout() == after
    assert redis_client.xlen(keys.stream(first.partition)) == 1
    assert second.partition == partition_of(scope, 6)
    assert redis_client.xlen(keys.stream(second.partition, 1)) == 1
    # So does a bulk enqueue from a producer that never read the layout.
    late = Producer.from_url(redis_url, partitions=4)
    late._layout = Layout.initial(4)
    ops = [Operation.build("remember", s, {"text": f"bulk {i}"}) for i, s in enumerate(_scopes(10))]
    sent = late.enqueue_many(ops)
    assert [p.operation_id for p in sent] == [op.operation_id for op in ops]
    assert sum(redis_client.xlen(keys.stream(p, 0)) for p in range(4)) == 1
    assert sum(redis_client.xlen(keys.stream(p, 1)) for p in range(6)) == 11


def test_the_barrier_holds_until_every_old_partition_is_closed_and_drained(
    redis_client: redis.Redis, redis_url: str
) -> None:
    producer = Producer.from_url(redis_url, partitions=4)
    pending = producer.remember({"user_id": "ada"}, "queued")
    switching = layout.plan(Layout.initial(4), 2)
    assert layout.replace(redis_client, None, switching)
    assert not layout.replace(redis_client, None, switching)  # someone wrote first
    assert layout.undrained(redis_client, Epoch(0, 4)) == [0, 1, 2, 3]  # none closed
    layout.close(redis_client, Epoch(0, 4))
    assert layout.undrained(redis_client, Epoch(0, 4)) == [pending.partition]
    assert layout.finish(redis_client, switching) == switching
    redis_client.xdel(keys.stream(pending.partition), pending.entry_id)  # as a worker does
    assert layout.finish(redis_client, switching) == Layout(Epoch(1, 2))
    assert layout.stored(redis_client) == Layout(Epoch(1, 2))
    # Taken up again once finished: it is no switch any more.
    with pytest.raises(RepartitionError, match="already has 2"):
        layout.begin(redis_client, 2, 4)


def test_an_in_process_worker_follows_a_switch_and_keeps_each_scope_in_order(
    fresh_store: Store,
    redis_client: redis.Redis,
    redis_url: str,
    start_worker: Callable[..., InProcessWorker],
) -> None:
    producer = Producer.from_url(redis_url, partitions=FAST.partitions)
    scopes = _scopes(12)
    sent = {s["user_id"]: [producer.remember(s, f"{s['user_id']} 0")] for s in scopes}
    with start_worker(fresh_store) as worker:
        for i in range(1, 4):
            for s in scopes:
                sent[s["user_id"]].append(producer.remember(s, f"{s['user_id']} {i}"))
            if i == 2:
                layout.begin(redis_client, 7, FAST.partitions)
        for pendings in sent.values():
            for p in pendings:
                p.wait(30)
        wait_until(
            lambda: worker.serving == Epoch(1, 7) and len(worker.partitions) == 7,
            what="the worker on the new epoch",
        )
    assert layout.stored(redis_client) == Layout(Epoch(1, 7))
    for s in scopes:
        receipts = sorted(fresh_store.receipts(scope=s, limit=100), key=lambda r: r.scope_revision)
        assert [r.operation_id for r in receipts] == [p.operation_id for p in sent[s["user_id"]]]


def test_a_dead_letter_retried_after_a_switch_goes_to_its_home_in_the_new_layout(
    redis_client: redis.Redis,
) -> None:
    op = Operation.build("remember", {"user_id": "ada"}, {"text": "x"}, "dead:1")
    pipe = redis_client.pipeline(transaction=False)
    deadletters.add(
        pipe,
        partition=partition_of(op.scope, 4),
        entry_id="5-0",
        operation_id=op.operation_id,
        raw=encode_entry(op)["op"],
        reason=deadletters.FAILED,
        error=EngramError("the embedder was down"),
        deliveries=1,
    )
    [dead_id] = pipe.execute()
    layout.begin(redis_client, 7, 4)
    letter = deadletters.get(redis_client, dead_id.decode())
    assert letter is not None
    assert deadletters.home_partition(letter, Epoch(0, 4)) == letter.partition
    home = deadletters.home_partition(letter, Epoch(1, 7))  # from epoch 0: its scope's
    assert home == partition_of(op.scope, 7)
    assert deadletters.retry(redis_client, letter.id, partition=home) is not None
    assert redis_client.xlen(keys.stream(home, 1)) == 1
    assert deadletters.count(redis_client) == 0


def test_the_stream_gauges_show_both_epochs_during_a_switch(
    redis_client: redis.Redis, redis_url: str
) -> None:
    producer = Producer.from_url(redis_url, partitions=4)
    producer.remember({"user_id": "ada"}, "old")
    layout.begin(redis_client, 3, 4)
    producer.remember({"user_id": "ada"}, "new")
    states = metrics.stream_states(redis_client, 4)
    assert [(s.epoch, s.partition) for s in states] == [(0, p) for p in range(4)] + [
        (1, p) for p in range(3)
    ]
    assert sum(s.length for s in states if s.epoch == 0) == 1
    assert sum(s.lag for s in states if s.epoch == 1) == 1
    text = metrics.render(redis_client, partitions=4, lease_ttl_ms=1000)
    assert 'engram_stream_length{partition="0"} ' in text
    assert 'engram_stream_length{partition="0",epoch="1"} ' in text


# -- retiring the replaced epoch ---------------------------------------------------------


def _op(scope: dict[str, str], text: str) -> str:
    return encode_entry(Operation.build("remember", scope, {"text": text}))["op"]


def _xadd_refused(client: redis.Redis, stream: str) -> str:
    """What a raw XADD to ``stream`` answers: it must be refused."""
    with pytest.raises(redis.ResponseError) as refused:
        client.xadd(stream, {"op": _op({"user_id": "raw"}, "raw")})
    return str(refused.value)


def test_a_replaced_epoch_retired_refuses_a_raw_xadd_and_reports_what_it_still_holds(
    redis_client: redis.Redis, redis_url: str
) -> None:
    old, new = Epoch(0, 4), Epoch(1, 2)
    layout.begin(redis_client, 2, 4)
    assert layout.retiring(redis_client) == [old]
    assert layout.stranded(redis_client, 4) == []  # still served: not stranded
    assert layout.finish(redis_client, layout.read(redis_client, 4)) == Layout(new)
    # Once no worker reads epoch 0, a raw XADD (the README's example) lands there.
    planted = redis_client.xadd(keys.stream(3), {"op": _op({"user_id": "late"}, "late")})
    assert layout.stranded(redis_client, 4) == [(keys.stream(3), 1)]
    # A worker that still leases partition 2 keeps it as it is, for now.
    redis_client.set(keys.lease(2), "w 1", px=60_000)
    redis_client.set(keys.fence_counter(0), "7")
    statuses = layout.retire(redis_client, old, new, range(4))
    assert statuses == {0: "retired", 1: "retired", 2: "leased", 3: "holds"}
    for n in (0, 1):
        assert redis_client.type(keys.stream(n)) == b"string"
        assert "WRONGTYPE" in _xadd_refused(redis_client, keys.stream(n))
    assert b"epoch 1 (2 partitions)" in redis_client.get(keys.stream(0))
    assert not redis_client.exists(keys.fence_counter(0))
    assert layout.retiring(redis_client) == [old]  # not all retired yet
    assert layout.stranded(redis_client, 4) == [(keys.stream(3), 1)]

    # engram's Producer, with the layout it read before the switch, is sent on.
    scope = next(s for s in _scopes(20) if partition_of(s, 4) == 0)
    stale = Producer.from_url(redis_url, partitions=4)
    stale._layout = Layout.initial(4)
    sent = stale.remember(scope, "after the retirement")
    assert stale.layout() == Layout(new) and sent.partition == partition_of(scope, 2)
    assert redis_client.xlen(keys.stream(sent.partition, 1)) == 1
    # With the layout gone from Redis, it would send to epoch 0: a typed refusal.
    redis_client.delete(keys.LAYOUT)
    lost = Producer.from_url(redis_url, partitions=4)
    with pytest.raises(PartitionRetiredError, match="epoch 1 \\(2 partitions\\)") as refused:
        lost.remember(scope, "nowhere")
    assert refused.value.code == "partition_retired"
    with pytest.raises(PartitionRetiredError):
        lost.enqueue_many([Operation.build("remember", scope, {"text": "nowhere either"})])
    assert redis_client.xlen(keys.stream(sent.partition, 1)) == 1  # nothing more enqueued
    redis_client.set(keys.LAYOUT, Layout(new).encode())

    # Once its lease is gone and its entries too, the rest is retired.
    redis_client.delete(keys.lease(2))
    redis_client.xdel(keys.stream(3), planted)
    assert layout.retire(redis_client, old, new, [2, 3]) == {2: "retired", 3: "retired"}
    assert layout.retiring(redis_client) == [] and layout.stranded(redis_client, 4) == []
    assert "WRONGTYPE" in _xadd_refused(redis_client, keys.stream(3))


def test_a_worker_retires_the_replaced_epoch_once_every_worker_serves_the_new_one(
    fresh_store: Store,
    redis_client: redis.Redis,
    redis_url: str,
    start_worker: Callable[..., InProcessWorker],
) -> None:
    producer = Producer.from_url(redis_url, partitions=FAST.partitions)
    scope = {"user_id": "ada"}
    with start_worker(fresh_store) as worker:
        producer.remember(scope, "before").wait(30)
        layout.begin(redis_client, 3, FAST.partitions)
        wait_until(lambda: layout.retiring(redis_client) == [], what="epoch 0 retired")
        assert worker.serving == Epoch(1, 3)
        for n in range(FAST.partitions):
            assert redis_client.type(keys.stream(n)) == b"string"
            assert not redis_client.exists(keys.fence_counter(n), keys.lease(n))
            assert "WRONGTYPE" in _xadd_refused(redis_client, keys.stream(n))
        # The producer that sent before the switch is sent on, and its operation commits.
        receipt = producer.remember(scope, "after").wait(30)
    assert receipt.scope_revision == 2
