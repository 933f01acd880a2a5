"""After ``engram repartition``, the Redis listener finds a forgotten record's entries
still waiting in the new epoch's streams (and, during a switch, in the old epoch's):
each is answered as the store answers it, and its text leaves Redis."""

from __future__ import annotations

import json

import pytest
import redis

from engram.jobs.listeners.in_redis import RedisListener
from engram.store import ForgetEvent, Scope, Store
from engram.worker import Producer, StreamReceipt, layout, partition_of
from engram.worker.embedded.runtime import connect_redis
from tests.helpers import bytes_hold, marker_text, redis_values
from tests.jobs_fixtures import context
from tests.redis_fixtures import FAST

SCOPE = {"user_id": "ada-epochs"}


def _revise(record_id: str, text: str, operation_id: str) -> str:
    return json.dumps(
        {
            "operation_id": operation_id,
            "kind": "revise",
            "scope": SCOPE,
            "request": {"id": record_id, "text": text},
        }
    )


@pytest.mark.parametrize("switching", [False, True], ids=["after", "during"])
def test_a_forgotten_record_waiting_in_a_later_epoch_is_settled_and_erased(
    fresh_store: Store, redis_url: str, switching: bool
) -> None:
    client: redis.Redis = connect_redis(redis_url)
    marker = marker_text()
    session = fresh_store.session(SCOPE)
    [record] = session.remember(f"Ada's locker code is {marker}.").records
    forget = session.forget(record.id).receipt
    # From the configured 4 partitions to 3: epoch 1, left switching or finished.
    _, new = layout.begin(client, 3, FAST.partitions)
    if not switching:
        assert layout.finish(client, new).previous is None
    waiting = []
    for epoch in layout.live_epochs(client, FAST.partitions):
        op_id = f"late-e{epoch.number}"
        client.xadd(
            epoch.stream(partition_of(SCOPE, epoch.partitions)),
            {"op": _revise(record.id, f"late {marker}", op_id)},
        )
        waiting.append(op_id)
    assert bytes_hold(redis_values(client), marker)

    ctx = context(fresh_store, redis_url)
    RedisListener(ctx)(
        [
            ForgetEvent(
                Scope.of(SCOPE),
                record.id,
                revisions=(1,),
                operation_id=forget.operation_id,
                already_forgotten=False,
            )
        ]
    )

    assert not bytes_hold(redis_values(client), marker), "a Redis key still holds it"
    with Producer.from_url(redis_url, partitions=FAST.partitions) as producer:
        replies = producer.results(SCOPE, waiting)
    for op_id in waiting:
        assert not isinstance(replies[op_id], StreamReceipt), replies[op_id]
        assert getattr(replies[op_id], "code", None) in {"revision_conflict", "not_found"}
    client.close()


def test_a_forgotten_record_stranded_in_a_replaced_epoch_is_settled_and_erased(
    fresh_store: Store, redis_url: str
) -> None:
    """A raw XADD to the old epoch's stream once no worker reads it (before the workers
    retire it): the listener finds it by its key's pattern, not by the layout."""
    client: redis.Redis = connect_redis(redis_url)
    marker = marker_text()
    session = fresh_store.session(SCOPE)
    [record] = session.remember(f"Ada's locker code is {marker}.").records
    forget = session.forget(record.id).receipt
    _, new = layout.begin(client, 3, FAST.partitions)
    assert layout.finish(client, new).previous is None
    old_stream = layout.Epoch(0, FAST.partitions).stream(partition_of(SCOPE, FAST.partitions))
    client.xadd(old_stream, {"op": _revise(record.id, f"stranded {marker}", "stranded-e0")})
    assert layout.stranded(client, FAST.partitions) == [(old_stream, 1)]

    RedisListener(context(fresh_store, redis_url))(
        [
            ForgetEvent(
                Scope.of(SCOPE),
                record.id,
                revisions=(1,),
                operation_id=forget.operation_id,
                already_forgotten=False,
            )
        ]
    )

    assert not bytes_hold(redis_values(client), marker), "a Redis key still holds it"
    assert layout.stranded(client, FAST.partitions) == []
    with Producer.from_url(redis_url, partitions=FAST.partitions) as producer:
        reply = producer.results(SCOPE, ["stranded-e0"])["stranded-e0"]
    assert getattr(reply, "code", None) in {"revision_conflict", "not_found"}, reply
    client.close()
