"""Dead letters as an operator handles them: list newest first, read one, retry it onto
its partition (where a worker commits it), or discard it. Real valkey and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis

from engram.store import InvalidRequestError, Operation, Store
from engram.store.errors import EngramError
from engram.worker import Producer, QueueFullError, keys
from engram.worker.admin import deadletter_selection as selection
from engram.worker.admin import deadletters
from engram.worker.consuming.replies import send_reply
from engram.worker.errors import DeadLetteredError
from engram.worker.protocol import encode_entry, encode_reply, partition_of
from tests.redis_fixtures import FAST, InProcessWorker


def _letter(client: redis.Redis, op: Operation | None, *, raw: str | None = None) -> str:
    pipe = client.pipeline(transaction=False)
    deadletters.add(
        pipe,
        partition=partition_of(op.scope, FAST.partitions) if op else 1,
        entry_id="5-0",
        operation_id=op.operation_id if op else None,
        raw=encode_entry(op)["op"] if op else raw,
        reason=deadletters.FAILED,
        error=EngramError("the embedder was down"),
        deliveries=1,
    )
    [dead_id] = pipe.execute()
    return dead_id.decode()


def test_pages_run_newest_first_with_a_cursor(redis_client: redis.Redis) -> None:
    ids = [
        _letter(redis_client, Operation.build("forget", {"user_id": "a"}, {"id": f"m{i}"}))
        for i in range(5)
    ]
    first = deadletters.page(redis_client, count=2)
    assert [d.id for d in first] == [ids[4], ids[3]]
    rest = deadletters.page(redis_client, before=first[-1].id, count=10)
    assert [d.id for d in rest] == [ids[2], ids[1], ids[0]]
    assert deadletters.count(redis_client) == 5
    got = deadletters.get(redis_client, ids[2])
    assert got is not None and got.operation_id is not None and got.error["message"]
    assert deadletters.get(redis_client, "1-1") is None
    for bad in ("", "abc", "1-", "-1", "1-1-1", "1 -1"):
        with pytest.raises(InvalidRequestError, match="stream entry id"):
            deadletters.get(redis_client, bad)


def test_a_retried_letter_is_committed_and_a_discarded_one_is_gone(
    store: Store,
    redis_client: redis.Redis,
    start_worker: Callable[..., InProcessWorker],
    scope: dict[str, str],
    redis_url: str,
) -> None:
    op = Operation.build("remember", scope, {"text": "Retried after the outage."}, "dl:retry:1")
    dead_id = _letter(redis_client, op)
    other = _letter(redis_client, Operation.build("forget", scope, {"id": "mem_x"}))
    new_entry = deadletters.retry(redis_client, dead_id)
    assert new_entry is not None
    assert deadletters.get(redis_client, dead_id) is None
    assert deadletters.retry(redis_client, dead_id) is None  # gone: nothing enqueued twice
    stream = keys.stream(partition_of(op.scope, FAST.partitions))
    assert [e[0].decode() for e in redis_client.xrange(stream)] == [new_entry]
    with start_worker(store), Producer.from_url(redis_url, partitions=FAST.partitions) as p:
        receipt = p.wait(scope, "dl:retry:1", timeout=20)
    assert receipt.records and store.get(scope, receipt.records[0].id) is not None
    assert deadletters.discard(redis_client, other) is True
    assert deadletters.discard(redis_client, other) is False
    assert deadletters.count(redis_client) == 0


def test_a_retry_takes_away_the_failed_delivery_s_reply(
    store: Store,
    redis_client: redis.Redis,
    start_worker: Callable[..., InProcessWorker],
    scope: dict[str, str],
    redis_url: str,
) -> None:
    """The failed delivery answered the operation (as a worker does when it dead-letters
    one); once retried, its reply is the retry's to give: a producer waiting on it gets
    the receipt, not the first delivery's failure."""
    op = Operation.build("remember", scope, {"text": "Retried, then committed."}, "dl:retry:2")
    dead_id = _letter(redis_client, op)
    pipe = redis_client.pipeline(transaction=False)
    send_reply(pipe, op.key, encode_reply(DeadLetteredError("no"), "5-0"), 60)
    pipe.execute()
    with Producer.from_url(redis_url, partitions=FAST.partitions) as p:
        answered = p.results(scope, [op.operation_id])[op.operation_id]
        assert isinstance(answered, DeadLetteredError)
        assert deadletters.retry(redis_client, dead_id) is not None
        assert p.results(scope, [op.operation_id]) == {}
        with start_worker(store):
            receipt = p.wait(scope, op.operation_id, timeout=20)
    assert receipt.records and receipt.error is None


def test_a_letter_without_an_operation_or_a_full_partition_is_refused(
    redis_client: redis.Redis,
) -> None:
    empty = _letter(redis_client, None, raw=None)
    with pytest.raises(InvalidRequestError, match="holds no operation"):
        deadletters.retry(redis_client, empty)
    op = Operation.build("forget", {"user_id": "full"}, {"id": "m1"})
    dead_id = _letter(redis_client, op)
    with pytest.raises(QueueFullError):
        deadletters.retry(redis_client, dead_id, stream_max_len=0)
    letter = deadletters.get(redis_client, dead_id)
    assert letter is not None and json.loads(letter.op or "")["operation_id"] == op.operation_id


def test_a_bulk_plan_takes_what_its_filter_matches_and_retries_only_what_can_succeed(
    redis_client: redis.Redis,
) -> None:
    redis_client.delete(keys.DEAD_LETTERS)
    op = Operation.build("forget", {"user_id": "home"}, {"id": "m1"})
    good = _letter(redis_client, op)
    garbage = _letter(redis_client, None, raw="{not json")
    discard = selection.plan(
        redis_client, "discard", selection.Match(reason=deadletters.FAILED), partitions=4
    )
    assert sorted(x.id for x, _ in discard.taken) == sorted([good, garbage])
    retry = selection.plan(redis_client, "retry", selection.Match(), partitions=FAST.partitions)
    assert [(x.id, p) for x, p in retry.taken] == [(good, partition_of(op.scope, FAST.partitions))]
    assert [x.id for x in retry.left] == [garbage]
    none = selection.plan(redis_client, "retry", selection.Match(partition=99), partitions=4)
    assert none.count == 0
    retry.check(1, retry.digest)
    with pytest.raises(selection.SelectionChangedError):
        retry.check(1, discard.digest)
    with pytest.raises(selection.SelectionChangedError):
        retry.check(2, retry.digest)
    with pytest.raises(InvalidRequestError):
        selection.plan(redis_client, "explode", selection.Match(), partitions=4)
    assert deadletters.check_why("  ") is None and deadletters.check_why("ok") == "ok"
    with pytest.raises(InvalidRequestError):
        deadletters.check_why("x" * (deadletters.MAX_WHY_CHARS + 1))
