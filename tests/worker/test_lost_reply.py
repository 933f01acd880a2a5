"""A reply lost after its entry was answered is asked for again.

A worker writes an operation's reply, then acknowledges its entry and deletes it. On a
Redis Cluster the reply and the stream may be on different nodes: when the node holding
the reply dies before its replica has it, the operation is applied and acknowledged and
no worker would answer it again (found killing a master under load:
``test_a_master_killed_under_load_loses_no_replicated_enqueue`` waited 60 s for a
reply whose receipt was in PostgreSQL). ``Pending.wait`` asks again, and the receipt
comes back as a replay."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from engram.store import Scope, Store
from engram.worker import Pending, Producer, WaitTimeout, keys, producer
from tests.redis_fixtures import FAST, InProcessWorker, wait_until

SCOPE = {"user_id": "lost-reply"}


def _answered_then_lost(p: Producer, text: str, operation_id: str) -> Pending:
    """An operation the worker has answered and taken out of its stream, whose reply
    is then gone (the node that held it died)."""
    pending = p.remember(SCOPE, text, operation_id=operation_id)

    def answered() -> bool:
        gone = not p.client.xrange(pending.stream, pending.entry_id, pending.entry_id)
        return gone and bool(p.client.exists(keys.reply(pending.scope.key, operation_id)))

    wait_until(answered, timeout=30, what="the answer")
    p.client.delete(keys.reply(pending.scope.key, operation_id))
    return pending


@pytest.fixture
def answered(
    store: Store,
    redis_url: str,
    start_worker: Callable[..., InProcessWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Producer]:
    """A producer whose operations a worker answers, and whose waits look for a lost
    reply after half a second."""
    monkeypatch.setattr(producer, "REASK_AFTER_S", 0.5)
    with start_worker(store), Producer.from_url(redis_url, partitions=FAST.partitions) as p:
        yield p


def test_a_reply_lost_after_its_entry_was_answered_is_asked_again(
    answered: Producer, store: Store
) -> None:
    pending = _answered_then_lost(answered, "Ada's reply went with its node.", "lost-1")

    receipt = pending.wait(10)

    assert receipt.operation_id == "lost-1"
    assert receipt.replayed  # answered from its receipt: applied once
    [record_ref] = receipt.records
    record = store.session(SCOPE).get(record_ref.id)
    assert record is not None and record.revision == 1


def test_a_wait_on_an_event_loop_asks_again_too(answered: Producer) -> None:
    """``Pending.replied``: how the HTTP API's ``?wait=`` and MCP's writes wait."""
    pending = _answered_then_lost(answered, "Lovelace's reply went too.", "lost-3")

    with ThreadPoolExecutor(1) as pool:  # its own loop, whatever ran on this thread
        receipt = pool.submit(asyncio.run, pending.replied(10)).result()

    assert receipt is not None and receipt.operation_id == "lost-3"
    assert receipt.replayed


def test_a_wait_by_id_alone_does_not_ask_again(answered: Producer) -> None:
    """Without the operation at hand (``Producer.wait(operation_id)``) nothing is sent:
    the wait ends as it always did."""
    _answered_then_lost(answered, "Grace waits by id.", "lost-2")
    with pytest.raises(WaitTimeout):
        answered.wait(SCOPE, "lost-2", 1.5)  # three times the re-ask's
    assert not answered.client.exists(keys.reply(Scope.of(SCOPE).key, "lost-2"))
