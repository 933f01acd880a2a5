"""Operations through the streams, end to end: a Producer, a Worker on a thread
of this process, a real valkey-server and a real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis

from engram.store import Operation, Store
from engram.store.errors import (
    InvalidRequestError,
    NotFoundError,
    OperationConflictError,
    RevisionConflictError,
)
from engram.worker import DeadLetteredError, Producer, StreamReceipt, keys
from engram.worker.admin import deadletters, metrics
from engram.worker.consuming.membership import live_workers
from engram.worker.protocol import encode_entry, partition_of
from tests.redis_fixtures import FAST, InProcessWorker, PoisonEmbedder, wait_until

StartWorker = Callable[..., InProcessWorker]


@pytest.fixture
def producer(redis_url: str) -> Producer:
    return Producer.from_url(redis_url, partitions=FAST.partitions)


def test_every_kind_round_trips(
    store: Store, start_worker: StartWorker, producer: Producer, scope: dict[str, str]
) -> None:
    with start_worker(store):
        first = producer.remember(
            scope, "Ada lives in London.", metadata={"k": 1}, id="mem_ada_city"
        ).wait(10)
        assert isinstance(first, StreamReceipt)
        assert (first.kind, first.scope_revision, first.replayed) == ("remember", 1, False)
        assert [r.as_dict() for r in first.records] == [
            {"id": "mem_ada_city", "revision": 1, "status": "active"}
        ]
        revised = producer.revise(
            scope, "mem_ada_city", text="Ada lives in Paris.", expected_revision=1
        ).wait(10)
        assert revised.records[0].revision == 2 and revised.scope_revision == 2
        retracted = producer.retract(scope, "mem_ada_city", expected_revision=2).wait(10)
        assert retracted.records[0].status == "retracted"
        extracted = producer.extract(
            scope,
            [
                {"id": "m1", "message": {"role": "user", "content": "I drink tea every morning."}},
            ],
            infer=False,
        ).wait(10)
        assert extracted.kind == "extract" and len(extracted.records) == 1
        forgot = producer.forget(scope, "mem_ada_city").wait(10)
        assert forgot.kind == "forget" and forgot.revisions == (1, 2, 3)
        assert forgot.already_forgotten is False and forgot.scope_revision == 5
        again = producer.forget(scope, "mem_ada_city").wait(10)
        assert again.revisions == () and again.already_forgotten is True
    assert store.get(scope, "mem_ada_city") is None
    assert store.scope_revision(scope) == 6
    [receipt] = [r for r in store.receipts(scope=scope) if r.operation_id == first.operation_id]
    assert receipt.stream_entry is not None  # the worker recorded where the op came from


def test_who_asked_travels_to_the_receipt_and_replays_are_counted(
    store: Store, start_worker: StartWorker, producer: Producer, scope: dict[str, str]
) -> None:
    with start_worker(store):
        first = producer.remember(
            scope, "Ada likes tea.", operation_id="asked:1", requested_by="grace"
        ).wait(10)
        # Someone else repeating the same operation gets the same receipt: who asked
        # is not part of the request, and the first asker stays on the receipt.
        again = producer.remember(
            scope, "Ada likes tea.", operation_id="asked:1", requested_by="alan"
        ).wait(10)
    assert first.requested_by == "grace" and again.requested_by == "grace"
    assert (first.replayed, again.replayed) == (False, True)
    item = store.browse.receipt("asked:1")
    assert item is not None
    assert (item.receipt.requested_by, item.receipt.replays) == ("grace", 1)


def test_a_raw_xadd_from_any_language_is_accepted(
    store: Store,
    start_worker: StartWorker,
    producer: Producer,
    scope: dict[str, str],
    redis_client: redis.Redis,
) -> None:
    body = {
        "operation_id": "raw:1",
        "kind": "remember",
        "scope": scope,
        "request": {"text": "Sent with redis-cli."},
    }
    stream = keys.stream(partition_of(scope, FAST.partitions))
    redis_client.execute_command("XADD", stream, "*", "op", json.dumps(body))
    with start_worker(store):
        assert producer.wait(scope, "raw:1", timeout=10).scope_revision == 1


def test_a_redelivered_entry_is_replayed(
    store: Store,
    start_worker: StartWorker,
    producer: Producer,
    scope: dict[str, str],
    redis_client: redis.Redis,
    embedder: object,
) -> None:
    """A worker committed an entry and died before acknowledging it: the next owner
    claims it, the store answers from the receipt, nothing is applied twice."""
    op = Operation.build("remember", scope, {"text": "Ada likes tea."}, "redeliver:1")
    partition = partition_of(scope, FAST.partitions)
    stream = keys.stream(partition)
    redis_client.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
    redis_client.xadd(stream, encode_entry(op))
    redis_client.xreadgroup(keys.GROUP, "dead-worker", {stream: ">"}, count=10)
    [first] = store.execute([op], embedder)  # type: ignore[arg-type]
    with start_worker(store):
        receipt = producer.wait(scope, "redeliver:1", timeout=10)
        # The producer retries its enqueue (same id, same request): replayed again.
        producer.enqueue(op)
        wait_until(lambda: redis_client.xlen(stream) == 0, what="the retry to be processed")
    assert receipt.replayed is True
    assert receipt.scope_revision == first.receipt.scope_revision == 1  # type: ignore[union-attr]
    assert store.scope_revision(scope) == 1
    assert redis_client.xpending(stream, keys.GROUP)["pending"] == 0
    assert metrics.read_counters(redis_client)["ops_replayed_total"] == 2


def test_conflicts_surface_as_typed_errors(
    store: Store,
    start_worker: StartWorker,
    producer: Producer,
    scope: dict[str, str],
    redis_client: redis.Redis,
) -> None:
    with start_worker(store):
        rec = producer.remember(scope, "v1", id="mem_conflict", operation_id="c:1").wait(10)
        producer.revise(scope, rec.records[0].id, text="v2").wait(10)
        with pytest.raises(RevisionConflictError) as stale:
            producer.revise(scope, "mem_conflict", text="v3", expected_revision=1).wait(10)
        assert (stale.value.expected, stale.value.actual) == (1, 2)
        with pytest.raises(OperationConflictError):
            producer.remember(scope, "something else", operation_id="c:1").wait(10)
        with pytest.raises(NotFoundError):
            producer.retract(scope, "mem_nobody").wait(10)
        body = {
            "operation_id": "c:bad",
            "kind": "remember",
            "scope": scope,
            "request": {"text": "x", "colour": "red"},
        }
        redis_client.xadd(
            keys.stream(partition_of(scope, FAST.partitions)), {"op": json.dumps(body)}
        )
        with pytest.raises(InvalidRequestError, match="colour"):
            producer.wait(scope, "c:bad", timeout=10)
    assert store.scope_revision(scope) == 2
    counters = metrics.read_counters(redis_client)
    assert counters['ops_failed_total{code="revision_conflict"}'] == 1
    assert counters['ops_failed_total{code="operation_conflict"}'] == 1


def test_a_poison_entry_is_dead_lettered_and_the_entries_after_it_commit(
    store: Store,
    start_worker: StartWorker,
    producer: Producer,
    scope: dict[str, str],
    redis_client: redis.Redis,
) -> None:
    stream = keys.stream(partition_of(scope, FAST.partitions))
    before = producer.remember(scope, "before", operation_id="p:1")
    poison = producer.remember(scope, "POISON for the embedder", operation_id="p:2")
    redis_client.xadd(stream, {"op": "{this is not json"})
    after = producer.remember(scope, "after", operation_id="p:3")
    with start_worker(store, PoisonEmbedder()):
        assert before.wait(10).scope_revision == 1
        assert after.wait(10).scope_revision == 2
        with pytest.raises(DeadLetteredError, match="p:2"):
            poison.wait(10)
        wait_until(lambda: redis_client.xlen(stream) == 0, what="the stream to drain")
    letters = {d.reason: d for d in deadletters.read(redis_client)}
    assert set(letters) == {deadletters.FAILED, deadletters.MALFORMED}
    failed = letters[deadletters.FAILED]
    assert failed.operation_id == "p:2" and failed.error["code"] == "dead_lettered"
    assert json.loads(failed.op or "")["request"]["text"] == "POISON for the embedder"
    assert "POISON" not in failed.error["message"]
    # Its cause: the embedder's error, whose message quotes no text, kept.
    assert failed.code == "unexpected_error" and "POISON" not in (failed.detail or "")
    assert failed.detail == "ValueError: this embedder cannot embed that text"
    malformed = letters[deadletters.MALFORMED]
    assert malformed.op == "{this is not json" and malformed.error["code"] == "invalid_request"
    assert malformed.code == "invalid_json"
    assert store.scope_revision(scope) == 2


def test_an_entry_delivered_too_often_is_dead_lettered(
    store: Store,
    start_worker: StartWorker,
    producer: Producer,
    scope: dict[str, str],
    redis_client: redis.Redis,
) -> None:
    """Its workers kept dying on it: after max_deliveries it stops blocking the partition."""
    stream = keys.stream(partition_of(scope, FAST.partitions))
    redis_client.xgroup_create(stream, keys.GROUP, id="0", mkstream=True)
    crashing = producer.remember(scope, "kills every worker", operation_id="d:1")
    redis_client.xreadgroup(keys.GROUP, "w0", {stream: ">"}, count=1)
    for i in range(FAST.max_deliveries - 1):
        redis_client.xclaim(stream, keys.GROUP, f"w{i + 1}", 0, [crashing.entry_id])
    fine = producer.remember(scope, "fine", operation_id="d:2")
    with start_worker(store):
        assert fine.wait(10).scope_revision == 1
        with pytest.raises(DeadLetteredError, match="delivered 6 times"):
            crashing.wait(10)
    [letter] = deadletters.read(redis_client)
    assert (letter.reason, letter.deliveries) == (deadletters.DELIVERIES, 6)


def test_batches_keep_each_scope_in_order(
    store: Store,
    start_worker: StartWorker,
    producer: Producer,
    scope: dict[str, str],
    redis_client: redis.Redis,
) -> None:
    scopes = [{"user_id": f"{scope['user_id']}-{i}"} for i in range(8)]
    sent: dict[str, list[str]] = {}
    for i in range(120):  # all queued before the worker starts: large batches
        s = scopes[i % len(scopes)]
        record_id = f"mem_order_{i % len(scopes)}_{s['user_id'][:8]}"
        p = (
            producer.remember(s, f"v{i}", id=record_id)
            if i < len(scopes)
            else producer.revise(s, record_id, text=f"v{i}")
        )
        sent.setdefault(s["user_id"], []).append(p.operation_id)
    with start_worker(store):
        for s in scopes:
            for op_id in sent[s["user_id"]]:
                producer.wait(s, op_id, timeout=20)
    for i, s in enumerate(scopes):
        got = sorted(store.receipts(scope=s, limit=100), key=lambda r: r.scope_revision)
        assert [r.operation_id for r in got] == sent[s["user_id"]]
        history = store.history(s, f"mem_order_{i}_{s['user_id'][:8]}")
        assert [h.text for h in history] == [f"v{j}" for j in range(i, 120, len(scopes))]
    counters = metrics.read_counters(redis_client)
    assert counters["batch_size_count"] < 120  # batched, not one by one


def test_counters_heartbeats_and_a_clean_stop(
    store: Store,
    start_worker: StartWorker,
    producer: Producer,
    scope: dict[str, str],
    redis_client: redis.Redis,
) -> None:
    with start_worker(store, worker_id="test-worker-1") as worker:
        producer.remember(scope, "x").wait(10)
        wait_until(lambda: len(worker.partitions) == FAST.partitions, what="all partitions")
        [info] = wait_until(
            lambda: [
                w
                for w in live_workers(redis_client, FAST.lease_ttl_ms)
                if w["partitions"] == "0,1,2,3"
            ],
            what="a heartbeat",
        )
        assert info["id"] == "test-worker-1" and int(info["pid"]) > 0
        assert int(info["last_beat_ms"]) > 0 and info["host"]

        def rendered_with_the_commit() -> str | None:
            # Counters are written about once a second, or as soon as the worker idles.
            text = metrics.render(
                redis_client, partitions=FAST.partitions, lease_ttl_ms=FAST.lease_ttl_ms
            )
            return text if "engram_ops_committed_total 1" in text.splitlines() else None

        text = wait_until(rendered_with_the_commit, timeout=5, what="the commit counted")
        assert "engram_workers_live 1" in text
        stream = keys.stream(partition_of(scope, FAST.partitions))
        assert redis_client.xlen(stream) == 0  # acknowledged entries are deleted
    # Stopped: leases released, no longer live.
    assert redis_client.keys("engram:lease:*") == []
    assert live_workers(redis_client, FAST.lease_ttl_ms) == []


def test_a_worker_whose_consumer_crashed_takes_its_partitions_again(
    fresh_store: Store,
    start_worker: StartWorker,
    producer: Producer,
    scope: dict[str, str],
    redis_client: redis.Redis,
) -> None:
    """An unexpected error outside any batch (here: the first fence raise) ends the
    consumer; the worker lets its partitions go as lost, starts a new consumer and
    takes them again, and operations commit."""
    real_execute = fresh_store.execute
    failures = []

    def execute_failing_once(ops: Any, *args: Any, **kwargs: Any) -> Any:
        if not ops and not failures:
            failures.append(1)
            raise RuntimeError("store broke while raising the fences")
        return real_execute(ops, *args, **kwargs)

    fresh_store.execute = execute_failing_once  # type: ignore[method-assign]
    with start_worker(fresh_store) as worker:
        first = worker.consumer
        assert producer.remember(scope, "after the crash").wait(15).scope_revision == 1
        assert worker.consumer is not first and not first.is_alive()
    assert failures == [1]
    counters = metrics.read_counters(redis_client)
    assert counters['partitions_lost_total{reason="crashed"}'] >= 1
