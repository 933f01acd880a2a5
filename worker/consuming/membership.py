"""Worker heartbeats and each worker's share of the partitions.

Every worker beats into ``engram:workers`` (ZSET id -> last beat, ms) and
describes itself in ``engram:worker:<id>`` (host, pid, partitions, counters).
A worker whose last beat is older than the lease TTL counts as gone: the
live ones split the partitions between them (``share``) and take over the
gone one's partitions as its leases run out.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from typing import Any

import redis

from engram.worker import keys


def share(worker_id: str, live: Iterable[str], partitions: int) -> int:
    """How many partitions this worker should own, the live workers sorted by id.

    Every live worker computes the same split: ``partitions // n`` each, and one
    more for the first ``partitions % n`` of them.
    """
    ordered = sorted(set(live) | {worker_id})
    count = len(ordered)
    index = ordered.index(worker_id)
    return partitions // count + (1 if index < partitions % count else 0)


def first_choice(worker_id: str, live: Iterable[str], partitions: int) -> int:
    """Where this worker starts looking for free partitions, spread between workers."""
    ordered = sorted(set(live) | {worker_id})
    return (ordered.index(worker_id) * partitions) // len(ordered)


def now_ms() -> int:
    return int(time.time() * 1000)


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


class Membership:
    def __init__(self, client: redis.Redis, worker_id: str, *, ttl_ms: int) -> None:
        self.client = client
        self.worker_id = worker_id
        self.ttl_ms = ttl_ms
        self.started_ms = now_ms()

    def beat(
        self, partitions: Iterable[int], *, epoch: int = 0, partition_count: int = 0
    ) -> list[str]:
        """Record this worker as alive, with the partitions it holds and the layout it
        serves (epoch, count); return the ids of all live workers."""
        now = now_ms()
        key = keys.worker(self.worker_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(keys.WORKERS, {self.worker_id: now})
        pipe.hset(
            key,
            mapping={
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started_ms": self.started_ms,
                "last_beat_ms": now,
                "partitions": ",".join(map(str, sorted(partitions))),
                "epoch": epoch,
                "partition_count": partition_count,
            },
        )
        # Kept a while after the worker stops beating, so its counters can be read.
        pipe.pexpire(key, self.ttl_ms * 20)
        # Forget workers long gone, so the set does not grow without bound.
        pipe.zremrangebyscore(keys.WORKERS, "-inf", now - self.ttl_ms * 20)
        pipe.zrangebyscore(keys.WORKERS, now - self.ttl_ms, "+inf")
        live = pipe.execute()[-1]
        return [w.decode() if isinstance(w, bytes) else str(w) for w in live]

    def leave(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(keys.WORKERS, self.worker_id)
        pipe.hset(keys.worker(self.worker_id), "partitions", "")
        pipe.execute()


def live_workers(client: redis.Redis, ttl_ms: int) -> list[dict[str, Any]]:
    """The live workers' descriptions (for the dashboard and ``engram status``)."""
    ids = client.zrangebyscore(keys.WORKERS, now_ms() - ttl_ms, "+inf")
    out = []
    for raw in ids:
        worker_id = raw.decode() if isinstance(raw, bytes) else str(raw)
        info = client.hgetall(keys.worker(worker_id))
        out.append(
            {
                "id": worker_id,
                **{
                    (k.decode() if isinstance(k, bytes) else k): (
                        v.decode() if isinstance(v, bytes) else v
                    )
                    for k, v in info.items()
                },
            }
        )
    return out
