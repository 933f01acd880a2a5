"""A dead-letter retry racing the redaction of a forget (``worker.deadletters``,
``jobs.listeners.in_redis``), the two interleaved by hand in the orders that could put
the forgotten operation back on a stream once the listener had read it: neither leaves
the forgotten text in Redis, on one server or on a cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from engram.jobs.listeners.in_redis import RedisListener
from engram.store import ForgetEvent, Scope, Store
from engram.store.errors import EngramError
from engram.worker import keys, partition_of
from engram.worker.admin import deadletters
from engram.worker.embedded.runtime import connect_redis
from tests.helpers import bytes_hold, marker_text, redis_values
from tests.jobs_fixtures import context
from tests.redis_fixtures import FAST

SCOPE = {"user_id": "ada-race"}


def _plant(fresh_store: Store, client: redis.Redis) -> tuple[str, str, ForgetEvent]:
    """A record, forgotten, and a dead letter of a revise that holds its text (as a revise
    whose embedder was down leaves one); the marker, the letter's id and the forget."""
    marker = marker_text()
    session = fresh_store.session(SCOPE)
    [record] = session.remember(f"Ada's locker code is {marker}.").records
    pipe = client.pipeline(transaction=False)
    op = {
        "operation_id": "race:revise",
        "kind": "revise",
        "scope": SCOPE,
        "request": {"id": record.id, "text": f"Ada's new code is {marker}."},
    }
    deadletters.add(
        pipe,
        partition=partition_of(SCOPE, FAST.partitions),
        entry_id="5-0",
        operation_id="race:revise",
        raw=json.dumps(op),
        reason=deadletters.FAILED,
        error=EngramError("the embedder was down"),
        deliveries=1,
    )
    [dead_id] = pipe.execute()
    forget = session.forget(record.id).receipt
    event = ForgetEvent(
        Scope.of(SCOPE),
        record.id,
        revisions=(1,),
        operation_id=forget.operation_id,
        already_forgotten=False,
    )
    return marker, dead_id.decode(), event


class RetryAfterAStream(RedisListener):
    """The listener, with an operator's retry of ``dead_id`` run as soon as it has read
    the first partition stream."""

    dead_id = ""
    retried: list[str | None]

    def _partition(self, *args: Any) -> None:
        super()._partition(*args)
        if not hasattr(self, "retried"):
            self.retried = [deadletters.retry(self.client, self.dead_id)]


def test_a_retry_run_after_the_listener_read_the_stream_puts_nothing_back(
    fresh_store: Store, redis_url: str
) -> None:
    client = connect_redis(redis_url)
    marker, dead_id, event = _plant(fresh_store, client)
    assert bytes_hold(redis_values(client), marker)
    listener = RetryAfterAStream(context(fresh_store, redis_url))
    listener.dead_id = dead_id

    listener([event])

    assert listener.retried == [None], "the retry moved a forgotten operation back"
    assert not bytes_hold(redis_values(client), marker), "a Redis key still holds it"
    client.close()


@pytest.mark.parametrize("where", ["server", "cluster"])
def test_a_retry_that_read_its_letter_before_the_redaction_moves_nothing_after_it(
    fresh_store: Store, request: pytest.FixtureRequest, where: str
) -> None:
    """On a cluster the retry's XADD and the letter's XDEL are two commands on two
    slots: the XADD lands after the listener read the stream, and the XDEL that finds
    the letter gone takes the entry back."""
    url = request.getfixturevalue("redis_url" if where == "server" else "cluster_url")
    client = connect_redis(url)
    marker, dead_id, event = _plant(fresh_store, client)
    letter = deadletters.get(client, dead_id)  # the retry has read it ...
    assert letter is not None
    RedisListener(context(fresh_store, url, ENGRAM_REDIS_PURGE_FILES="off"))([event])
    assert deadletters.get(client, dead_id) is None  # ... the redaction deleted it ...

    assert deadletters.requeue(client, letter) is None  # ... then the retry moves it

    stream = keys.stream(partition_of(SCOPE, FAST.partitions))
    assert not client.exists(stream) or client.xlen(stream) == 0
    assert not bytes_hold(redis_values(client), marker), "a Redis key still holds it"
    client.close()
