"""Finding an operation in the partition streams' backlog, against the real valkey."""

from __future__ import annotations

import redis

from engram.web.backlog import Backlog, find
from engram.worker import Producer, keys, layout

SCOPE = {"user_id": "backlog"}


def test_an_enqueued_operation_is_found_and_a_typo_is_not(redis_client: redis.Redis) -> None:
    producer = Producer(redis_client, partitions=4)
    producer.remember(SCOPE, "Ada likes tea.", operation_id="queued:1")
    # The typo's id inside another operation's text is not the operation.
    producer.remember(SCOPE, 'see "typo:1" and typo:1', operation_id="queued:2")
    streams = [keys.stream(p) for p in range(4)]
    assert find(redis_client, "queued:1", streams) is Backlog.FOUND
    assert find(redis_client, "typo:1", streams) is Backlog.ABSENT
    assert find(redis_client, "queued:", streams) is Backlog.ABSENT


def test_during_a_repartition_both_epochs_are_searched(redis_client: redis.Redis) -> None:
    producer = Producer(redis_client, partitions=4)
    producer.remember(SCOPE, "before", operation_id="old:1")
    layout.begin(redis_client, 3, 4)
    producer.remember(SCOPE, "after", operation_id="new:1")
    streams = layout.live_streams(redis_client, 4)
    assert streams[:4] == [keys.stream(p) for p in range(4)] and len(streams) == 7
    assert find(redis_client, "old:1", streams) is Backlog.FOUND
    assert find(redis_client, "new:1", streams) is Backlog.FOUND


def test_past_the_bound_an_absent_id_cannot_be_ruled_out(redis_client: redis.Redis) -> None:
    producer = Producer(redis_client, partitions=1)
    for i in range(7):
        producer.remember(SCOPE, f"note {i}", operation_id=f"many:{i}")
    assert redis_client.xlen(keys.stream(0)) == 7
    assert find(redis_client, "typo", [keys.stream(0)], limit=6, page_size=4) is Backlog.UNKNOWN
    assert find(redis_client, "typo", [keys.stream(0)], limit=7, page_size=4) is Backlog.ABSENT
    assert find(redis_client, "many:5", [keys.stream(0)], limit=6, page_size=4) is Backlog.FOUND
    assert find(redis_client, "many:6", [keys.stream(0)], limit=6, page_size=2) is Backlog.UNKNOWN


def test_an_operation_another_encoder_escaped_is_found(redis_client: redis.Redis) -> None:
    # A producer in another language: non-ASCII as \u escapes, "/" as "\/".
    raw = (
        '{"operation_id":"caf\\u00e9\\/1","kind":"remember",'
        '"scope":{"user_id":"backlog"},"request":{"text":"t"}}'
    )
    redis_client.xadd(keys.stream(0), {"op": raw})
    assert find(redis_client, "café/1", [keys.stream(0)]) is Backlog.FOUND
