"""Deleting stream entries for good: a stream rebuilt from its live entries keeps
everything a consumer relies on, and none of the deleted bytes."""

from __future__ import annotations

import redis

from engram.jobs import streams
from tests.helpers import bytes_hold, marker_text


def full(client: redis.Redis, key: str) -> dict[str, object]:
    info = client.xinfo_stream(key, full=True)
    for group in info["groups"]:
        for consumer in group["consumers"]:
            consumer.pop("seen-time", None)
            consumer.pop("active-time", None)
    info.pop("radix-tree-keys")
    info.pop("radix-tree-nodes")
    return info


def test_compact_keeps_entries_groups_and_pending_and_drops_deleted_bytes(
    redis_client: redis.Redis,
) -> None:
    marker = marker_text()
    key = "engram:ops:{0}"
    redis_client.xgroup_create(key, "g", id="0", mkstream=True)
    ids = [redis_client.xadd(key, {"op": f"entry {i}"}) for i in range(5)]
    secret = redis_client.xadd(key, {"op": f"holds {marker}"})
    ids += [redis_client.xadd(key, {"op": f"entry {i}"}) for i in range(5, 8)]
    # Consumer a read four entries (acked one), b read the secret and two more.
    redis_client.xreadgroup("g", "a", {key: ">"}, count=4)
    redis_client.xack(key, "g", ids[0])
    redis_client.xreadgroup("g", "b", {key: ">"}, count=3)
    redis_client.xclaim(key, "g", "b", 0, [ids[1]], retrycount=7)
    redis_client.xdel(key, secret, ids[2])
    assert bytes_hold(redis_client.dump(key) or b"", marker), "XDEL alone keeps the bytes"

    before = full(redis_client, key)
    assert streams.compact(redis_client, key) == 7
    after = full(redis_client, key)
    assert not bytes_hold(redis_client.dump(key) or b"", marker)
    for field in (
        "length",
        "last-generated-id",
        "max-deleted-entry-id",
        "entries-added",
        "entries",
    ):
        assert after[field] == before[field], field
    [g_before], [g_after] = before["groups"], after["groups"]  # type: ignore[misc]
    for field in ("name", "last-delivered-id", "entries-read", "lag"):
        assert g_after[field] == g_before[field], field
    # Pending entries keep owner and delivery count; deleted ones are gone from them.
    pending = {p[0]: (p[1], p[3]) for p in g_after["pending"]}
    assert pending == {
        p[0]: (p[1], p[3]) for p in g_before["pending"] if p[0] not in (secret, ids[2])
    }
    assert pending[ids[1]] == (b"b", 7)
    # And consumers carry on: new entries once, pending ones claimable.
    new = redis_client.xadd(key, {"op": "after"})
    assert [e[0] for e in redis_client.xreadgroup("g", "a", {key: ">"})[0][1]] == [
        ids[6],
        ids[7],
        new,
    ]
    claimed = redis_client.xautoclaim(key, "g", "c", 0, start_id="0-0")
    assert ids[1] in [e[0] for e in claimed[1]]


def test_compact_of_an_emptied_stream_keeps_its_group_and_counters(
    redis_client: redis.Redis,
) -> None:
    key = "engram:ops:{1}"
    redis_client.xgroup_create(key, "g", id="0", mkstream=True)
    only = redis_client.xadd(key, {"op": "x"})
    redis_client.xreadgroup("g", "a", {key: ">"})
    redis_client.xdel(key, only)
    before = full(redis_client, key)
    assert streams.compact(redis_client, key) == 0
    after = full(redis_client, key)
    assert after["last-generated-id"] == before["last-generated-id"] == only
    assert after["entries-added"] == 1
    assert after["groups"][0]["last-delivered-id"] == only  # type: ignore[index]
    assert redis_client.xadd(key, {"op": "y"}) > only


def test_compact_of_a_stream_without_groups_and_of_no_stream(redis_client: redis.Redis) -> None:
    key = "engram:dead"
    kept = redis_client.xadd(key, {"op": "kept"})
    gone = redis_client.xadd(key, {"op": "gone"})
    assert streams.delete(redis_client, key, [gone.decode()]) == 1
    assert [e[0] for e in redis_client.xrange(key)] == [kept]
    assert streams.compact(redis_client, "engram:nothing") == -1
