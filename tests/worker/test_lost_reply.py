"""A reply lost after its entry was answered is asked for again.

A worker writes an operation's reply, then acknowledges its entry and deletes it. On a
Redis Cluster the reply and the stream may be on different nodes: when the node holding
the reply dies before its replica has it, the operation is applied and acknowledged and
no worker would answer it again (found killing a master under load:
``test_a_master_killed_under_load_loses_no_replicated_enqueue`` waited 60 s for a
reply whose receipt was in PostgreSQL). ``Pending.wait`` asks again, and the receipt
comes back as a replay."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from engram.store import Store
from engram.worker import Producer, WaitTimeout, keys, producer
from tests.redis_fixtures import FAST, InProcessWorker, wait_until

SCOPE = {"user_id": "lost-reply"}


def _answered(client: redis.Redis, stream: str, entry_id: str, operation_id: str) -> bool:
    """The worker has replied and taken the entry out of its stream."""
    gone = not client.xrange(stream, entry_id, entry_id)
    return gone and bool(client.exists(keys.reply(operation_id)))


def test_a_reply_lost_after_its_entry_was_answered_is_asked_again(
    store: Store,
    redis_url: str,
    start_worker: Callable[..., InProcessWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(producer, "REASK_AFTER_S", 0.5)
    with start_worker(store), Producer.from_url(redis_url, partitions=FAST.partitions) as p:
        pending = p.remember(SCOPE, "Ada's reply went with its node.", operation_id="lost-1")
        wait_until(
            lambda: _answered(p.client, pending.stream, pending.entry_id, "lost-1"),
            timeout=30,
            what="the answer",
        )
        p.client.delete(keys.reply("lost-1"))  # the node that held it died

        receipt = pending.wait(10)

        assert receipt.operation_id == "lost-1"
        assert receipt.replayed  # answered from its receipt: applied once
        [record_ref] = receipt.records
        record = store.session(SCOPE).get(record_ref.id)
        assert record is not None and record.revision == 1


def test_a_wait_by_id_alone_does_not_ask_again(
    store: Store,
    redis_url: str,
    start_worker: Callable[..., InProcessWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the operation at hand (``Producer.wait(operation_id)``) nothing is sent:
    the wait ends as it always did."""
    monkeypatch.setattr(producer, "REASK_AFTER_S", 0.2)
    with start_worker(store), Producer.from_url(redis_url, partitions=FAST.partitions) as p:
        pending = p.remember(SCOPE, "Grace waits by id.", operation_id="lost-2")
        wait_until(
            lambda: _answered(p.client, pending.stream, pending.entry_id, "lost-2"),
            timeout=30,
            what="the answer",
        )
        p.client.delete(keys.reply("lost-2"))
        with pytest.raises(WaitTimeout):
            p.wait("lost-2", 1.0)
        assert not p.client.exists(keys.reply("lost-2"))
