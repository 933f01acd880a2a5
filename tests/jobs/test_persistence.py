"""valkey's persistence files lose what was deleted from valkey, once purged."""

from __future__ import annotations

import threading

import redis

from engram.jobs import persistence, streams
from engram.worker.embedded.valkey import EmbeddedValkey
from tests.helpers import files_holding, marker_text


def test_purge_rewrites_the_append_only_file_and_leaves_no_old_part(
    valkey: EmbeddedValkey, redis_client: redis.Redis
) -> None:
    marker = marker_text()
    key = "engram:dead"
    redis_client.xadd(key, {"op": "a neighbour that stays"})
    secret = redis_client.xadd(key, {"op": f"the text {marker} of a forgotten record"})
    redis_client.xadd(key, {"op": "another neighbour"})
    assert files_holding(valkey.data_dir, marker), "the append-only file holds the XADD"

    streams.delete(redis_client, key, [secret.decode()])
    assert files_holding(valkey.data_dir, marker), "until the file is rewritten"
    rewrites = int(redis_client.info("persistence")["aof_rewrites"])
    purged = persistence.purge(redis_client, wait_s=30)

    assert purged == persistence.Purged(aof_rewritten=True, rdb_saved=False, files_checked=True)
    assert int(redis_client.info("persistence")["aof_rewrites"]) > rewrites
    assert files_holding(valkey.data_dir, marker) == []
    assert redis_client.xlen(key) == 2


def test_without_compaction_the_rewrite_would_keep_the_deleted_entry(
    valkey: EmbeddedValkey, redis_client: redis.Redis
) -> None:
    """Why ``streams.delete`` rebuilds the stream: XDEL alone is not erasure."""
    marker = marker_text()
    key = "engram:dead"
    redis_client.xadd(key, {"op": "a neighbour"})
    secret = redis_client.xadd(key, {"op": f"the text {marker}"})
    redis_client.xdel(key, secret)
    persistence.purge(redis_client, wait_s=30)
    assert files_holding(valkey.data_dir / "appendonlydir", marker)
    streams.compact(redis_client, key)
    persistence.purge(redis_client, wait_s=30)
    assert files_holding(valkey.data_dir, marker) == []


def test_purges_that_arrive_together_share_rewrites(redis_client: redis.Redis) -> None:
    pipe = redis_client.pipeline(transaction=False)
    for i in range(50_000):
        pipe.set(f"filler:{i}", "x" * 100)
    pipe.execute()
    before = int(redis_client.info("persistence")["aof_rewrites"])
    callers = 8
    ready = threading.Barrier(callers)
    errors: list[BaseException] = []

    def purge() -> None:
        ready.wait()
        try:
            persistence.purge(redis_client, wait_s=60)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=purge) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rewrites = int(redis_client.info("persistence")["aof_rewrites"]) - before
    assert 1 <= rewrites < callers
