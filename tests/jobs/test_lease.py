"""The re-embedding lease: one holder at a time, renewed while held, gone with a dead
holder, and a fencing token that makes a late holder's writes fail."""

from __future__ import annotations

import time

import pytest
import redis

from engram.jobs.lease import JobLease
from engram.store import HashingEmbedder, Store
from engram.store.errors import FencedError
from engram.store.vectors.embeddings import VectorItem


def lease(client: redis.Redis, ttl_ms: int = 600) -> JobLease:
    return JobLease(
        client, key="t:lease", counter_key="t:fence", fence_name="t-fence", ttl_ms=ttl_ms
    )


def test_one_holder_at_a_time_renewed_while_held(redis_client: redis.Redis) -> None:
    first, second = lease(redis_client), lease(redis_client)
    assert first.acquire("first")
    assert not second.acquire("second")
    time.sleep(1.5)  # over twice the TTL: the renewal keeps it
    assert not second.acquire("second") and not first.lost.is_set()
    assert (first.holder() or "").startswith("first ")
    first.release()
    assert first.holder() is None
    assert second.acquire("second")
    assert second.token is not None and first.token is not None and second.token > first.token
    second.release()


def test_a_holder_that_stops_renewing_loses_it_and_its_writes_are_fenced(
    redis_client: redis.Redis, fresh_store: Store
) -> None:
    fact = (
        fresh_store.session({"user_id": "ada"}, embedder=HashingEmbedder(64))
        .remember("Ada prefers tea.")
        .records[0]
    )
    gen = fresh_store.embeddings.begin("hashing-16", 16)
    scope_id = fresh_store.scope_id({"user_id": "ada"})
    assert scope_id is not None
    item = VectorItem(scope_id, fact.id, fact.revision, fact.digest, [1.0] * 16)

    stalled = lease(redis_client)
    assert stalled.acquire("stalled")
    fence = stalled.fence
    stalled._stop.set()  # as a paused or killed process: no more renewals
    time.sleep(0.8)
    assert stalled.holder() is None, "the dead holder's lease ran out"

    taker = lease(redis_client)
    assert taker.acquire("taker")
    assert fresh_store.embeddings.put(gen.id, [item], fence=taker.fence) == 1
    with pytest.raises(FencedError):
        fresh_store.embeddings.put(gen.id, [item], fence=fence)
    taker.release()


def test_a_holder_whose_key_was_taken_notices(redis_client: redis.Redis) -> None:
    held = lease(redis_client, ttl_ms=300)
    assert held.acquire("held")
    redis_client.set("t:lease", "someone-else 1", px=5000)
    assert held.lost.wait(2), "the renewal found the lease in other hands"
    held.release()
    assert redis_client.get("t:lease") == b"someone-else 1", "release leaves another's lease"
