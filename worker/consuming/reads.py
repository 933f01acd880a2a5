"""Reading a worker's new entries on a Redis Cluster, where a command touches one slot
and each partition stream has its own: one ``XREADGROUP`` per stream.

On one server the consumer reads all its streams with one ``XREADGROUP``, which
blocks until any of them has work (``consumer.Consumer._xreadgroup``). On a
cluster a cycle reads:

1. every stream without blocking, in one cluster pipeline (redis-py splits it by
   node: a round trip per node, not per stream), after the last cycle's replies and
   acknowledgements, as on one server;
2. only if none found anything, and the cycle may block: one blocking read of one
   stream, a different one each time (in turn). An entry that arrives meanwhile on
   another stream waits at most that block: the next cycle's reads find it.

That block is short just after work was found (``FIRST_BLOCK_MS``) and doubles with
every empty one, up to the worker's ``block_ms``: while operations keep coming the
wait for one is short (a few ms more than on one server, measured with
``bench.bench_cluster``), and a worker idle for a second costs what it costs with
one blocking read per ``block_ms``: one pipeline of non-blocking reads and one
blocking read. Under load every cycle reads every stream at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engram.worker import keys

# The first blocking read after work was found; each empty one doubles the next (up
# to the block the consumer asks for).
FIRST_BLOCK_MS = 10
_LONGEST_MS = 60_000


class ClusterReads:
    """The reads of one consumer (its group and name) on a cluster client."""

    def __init__(self, client: Any, consumer: str) -> None:
        self.client = client
        self.consumer = consumer
        self._turn = 0  # which stream the next blocking read waits on
        self._block_ms = FIRST_BLOCK_MS

    @property
    def next_block_ms(self) -> int:
        """How long the next blocking read waits at most (before the cap it is given)."""
        return self._block_ms

    def read(
        self,
        streams: list[str],
        *,
        count: int,
        block_ms: int | None,
        unsent: Callable[[Any], None] | None = None,
    ) -> dict[Any, list[Any]]:
        """The new entries of ``streams``, by stream name (as Redis gave it), after
        ``unsent``; with ``block_ms``, waiting up to that long on one of them when
        none has any."""
        if not streams:
            return {}
        pipe = self.client.pipeline(transaction=False)
        if unsent is not None:
            unsent(pipe)
        for stream in streams:
            pipe.xreadgroup(keys.GROUP, self.consumer, {stream: ">"}, count=count)
        found: dict[Any, list[Any]] = {}
        for reply in pipe.execute()[-len(streams) :]:
            found.update((k, v) for k, v in by_stream(reply).items() if v)
        if found or block_ms is None:
            self._block_ms = FIRST_BLOCK_MS if found else self._block_ms
            return found
        stream = streams[self._turn % len(streams)]
        self._turn += 1
        block = min(block_ms, self._block_ms)
        found = by_stream(
            self.client.xreadgroup(
                keys.GROUP, self.consumer, {stream: ">"}, count=count, block=block
            )
        )
        self._block_ms = FIRST_BLOCK_MS if found else min(block * 2, _LONGEST_MS)
        return found


def by_stream(reply: Any) -> dict[Any, list[Any]]:
    """XREADGROUP's answer by stream name, whichever shape redis-py gives it."""
    if not reply:
        return {}
    if isinstance(reply, dict):  # RESP3: {stream: [[(id, fields), ...]]}
        return {k: v[0] if v and isinstance(v[0], list) else v for k, v in reply.items()}
    return {stream: list(entries) for stream, entries in reply}
