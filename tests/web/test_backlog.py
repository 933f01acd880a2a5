"""Finding an operation in the partition streams' backlog, against the real valkey."""

from __future__ import annotations

import redis

from web.backlog import Backlog, find
from worker import Producer, keys

SCOPE = {"user_id": "backlog"}


def test_an_enqueued_operation_is_found_and_a_typo_is_not(redis_client: redis.Redis) -> None:
    producer = Producer(redis_client, partitions=4)
    producer.remember(SCOPE, "Ada likes tea.", operation_id="queued:1")
    # The typo's id inside another operation's text is not the operation.
    producer.remember(SCOPE, 'see "typo:1" and typo:1', operation_id="queued:2")
    assert find(redis_client, "queued:1", range(4)) is Backlog.FOUND
    assert find(redis_client, "typo:1", range(4)) is Backlog.ABSENT
    assert find(redis_client, "queued:", range(4)) is Backlog.ABSENT


def test_past_the_bound_an_absent_id_cannot_be_ruled_out(redis_client: redis.Redis) -> None:
    producer = Producer(redis_client, partitions=1)
    for i in range(7):
        producer.remember(SCOPE, f"note {i}", operation_id=f"many:{i}")
    assert redis_client.xlen(keys.stream(0)) == 7
    assert find(redis_client, "typo", [0], limit=6, page_size=4) is Backlog.UNKNOWN
    assert find(redis_client, "typo", [0], limit=7, page_size=4) is Backlog.ABSENT
    assert find(redis_client, "many:5", [0], limit=6, page_size=4) is Backlog.FOUND
    assert find(redis_client, "many:6", [0], limit=6, page_size=2) is Backlog.UNKNOWN


def test_an_operation_another_encoder_escaped_is_found(redis_client: redis.Redis) -> None:
    # A producer in another language: non-ASCII as \u escapes, "/" as "\/".
    raw = (
        '{"operation_id":"caf\\u00e9\\/1","kind":"remember",'
        '"scope":{"user_id":"backlog"},"request":{"text":"t"}}'
    )
    redis_client.xadd(keys.stream(0), {"op": raw})
    assert find(redis_client, "café/1", [0]) is Backlog.FOUND
