"""Partition leases: who may commit a partition, and its fencing token.

A lease is the key ``engram:lease:{N}`` = ``"<worker id> <token>"`` with a TTL,
taken only when free and extended only by its holder (compare-and-extend in
Lua). Every acquisition draws a new token, strictly greater than any before;
the worker passes it to the store as ``Fence("partition:N", token)``, and the
store refuses a commit whose token is older than one it has seen. So a worker
that lost its lease (paused, cut off) can never commit for the partition again,
whatever its clock or its view of Redis says.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis

from engram.worker import cluster, keys

# The token is at least the Redis server's clock in microseconds and above the
# last one drawn: it keeps growing even if the counter key is lost (a flushed or
# rebuilt Redis), so the store's fence never refuses every new holder, and two
# holders drawn after such a loss never share a token (they would both pass the
# fence). Formatted with %d: Lua would print a 16-digit number as 1.7e+15.
# KEYS: the lease, its token counter. ARGV: the holder's id, the TTL in ms.
# The three scripts are shared with the jobs' re-embedding lease (``jobs.lease``).
ACQUIRE_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local now = redis.call('TIME')
local floor_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local token = redis.call('INCR', KEYS[2])
if token < floor_us then
  token = floor_us
  redis.call('SET', KEYS[2], string.format('%d', token))
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. string.format('%d', token), 'PX', ARGV[2])
return token
"""

RENEW_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Lease:
    partition: int
    worker_id: str
    token: int
    epoch: int = 0  # the layout epoch the partition belongs to (``layout``)

    @property
    def value(self) -> str:
        return f"{self.worker_id} {self.token}"


class Leases:
    def __init__(self, client: redis.Redis, *, ttl_ms: int) -> None:
        self.client = client
        self.ttl_ms = ttl_ms
        self._acquire = client.register_script(ACQUIRE_SCRIPT)
        self._renew = client.register_script(RENEW_SCRIPT)
        self._release = client.register_script(RELEASE_SCRIPT)

    def acquire(self, partition: int, worker_id: str, epoch: int = 0) -> Lease | None:
        """Take the partition if no one holds it; a new token each time."""
        token = self._acquire(
            keys=[keys.lease(partition, epoch), keys.fence_counter(partition, epoch)],
            args=[worker_id, self.ttl_ms],
        )
        return Lease(partition, worker_id, int(token), epoch) if token is not None else None

    def renew(self, leases: Sequence[Lease]) -> list[bool]:
        """Extend each lease still held by its owner; False where it was lost."""
        if not leases:
            return []
        pipe = self.client.pipeline(transaction=False)
        for lease in leases:
            cluster.run_script(
                self._renew,
                [keys.lease(lease.partition, lease.epoch)],
                [lease.value, self.ttl_ms],
                pipe,
            )
        return [bool(x) for x in pipe.execute()]

    def release(self, leases: Iterable[Lease]) -> None:
        for lease in leases:
            self._release(keys=[keys.lease(lease.partition, lease.epoch)], args=[lease.value])

    def holders(
        self, partitions: Iterable[int], epoch: int = 0
    ) -> dict[int, tuple[str, int] | None]:
        """Who holds each partition now (worker id, token), or None when free."""
        parts = list(partitions)
        if not parts:
            return {}
        # One GET per key (not MGET): the keys live in different cluster slots.
        pipe = self.client.pipeline(transaction=False)
        for p in parts:
            pipe.get(keys.lease(p, epoch))
        return {p: _parse(v) for p, v in zip(parts, pipe.execute(), strict=True)}


def _parse(value: bytes | str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    worker_id, _, token = text.rpartition(" ")
    return worker_id, int(token)
