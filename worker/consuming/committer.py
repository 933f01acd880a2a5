"""Committing a cycle's operations under the fences of their partitions.

One ``store.execute`` per cycle (cut where an operation id repeats); a batch the
store refuses as a whole is retried one operation at a time, to find the one that
breaks it. A fence the store refuses loses its partition, whose operations are
left out; a database outage is waited out (``wait_out``) and the batch tried again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import psycopg
import psycopg_pool
import redis

from engram.store import Embedder, Store, WriteOptions
from engram.store.errors import FencedError
from engram.store.vectors.embedders import EmbedderResolver
from engram.store.write.operations import OpKey
from engram.store.write.reconcile import Decision
from engram.worker import keys
from engram.worker.causes import Cause, cause_of, strings_in
from engram.worker.consuming.outcomes import Outcomes
from engram.worker.consuming.partition import Item, Partition, partitions_of
from engram.worker.defaults import BACKOFF_MIN_S
from engram.worker.protocol import Entry

T = TypeVar("T")

# Failures that pass: the batch in hand is kept and tried again after a pause.
TRANSIENT_DB = (psycopg.OperationalError, psycopg.InterfaceError, psycopg_pool.PoolTimeout)
# A cluster answers CLUSTERDOWN or TRYAGAIN while a failover moves its slots, and an
# old master READONLY until it learns it was demoted; the client finds no node for a
# slot until the cluster says who took it over: each passes as an outage does.
TRANSIENT_REDIS = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.SlotNotCoveredError,
)

# Waits out a passing outage of ``server`` (or stops the consumer): the next delay.
WaitOut = Callable[..., float]
Failed = list[tuple[Partition, Entry, Cause]]


class Unappliable(Exception):
    """``store.execute`` raised something that is neither a passing failure nor a fence;
    ``cause`` says what, fit to show (``worker.causes``)."""

    def __init__(self, cause: Cause) -> None:
        super().__init__(cause.detail)
        self.cause = cause


def unique_segments(items: Sequence[T], operation_key: Callable[[T], OpKey]) -> list[list[T]]:
    """Cut a batch where an operation (scope key, operation id) repeats: the store sees
    each operation once per call."""
    segments: list[list[T]] = [[]]
    seen: set[OpKey] = set()
    for item in items:
        op_id = operation_key(item)
        if op_id in seen:
            segments.append([])
            seen.clear()
        segments[-1].append(item)
        seen.add(op_id)
    return [s for s in segments if s]


class Committer:
    def __init__(
        self,
        store: Store,
        embedder: Embedder | EmbedderResolver | None,
        client: redis.Redis,
        worker_id: str,
        *,
        listeners: bool,
        wait_out: WaitOut,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.client = client
        self.worker_id = worker_id
        self.listeners = listeners  # committed forgets go to their redaction listeners
        self.wait_out = wait_out

    def commit(
        self, good: list[Item], *, check_replays: bool, decisions: dict[OpKey, Decision]
    ) -> tuple[Outcomes, Failed]:
        """The outcomes, and the entries no commit could take (with what was raised)."""
        outcomes: Outcomes = []
        failed: Failed = []
        for segment in unique_segments(good, lambda item: item[1].operation.key):
            try:
                outcomes += self.execute(partitions_of(segment), segment, check_replays, decisions)
                continue
            except Unappliable:
                pass
            # Something in the batch breaks it: commit one by one to find it.
            for item in segment:
                try:
                    outcomes += self.execute([item[0]], [item], True, decisions)
                except Unappliable as exc:
                    failed.append((item[0], item[1], exc.cause))
        return outcomes, failed

    def execute(
        self,
        partitions: list[Partition],
        items: list[Item],
        check_replays: bool = True,
        decisions: dict[OpKey, Decision] | None = None,
    ) -> Outcomes:
        """Commit ``items`` under the fences of ``partitions``; the items of a partition
        lost on the way are left out (neither answered nor acknowledged)."""
        delay = BACKOFF_MIN_S
        while True:
            now = time.monotonic()
            for p in partitions:
                if p.lost is None and now > p.valid_until:
                    p.lose("lease_expired")
            partitions = [p for p in partitions if p.lost is None]
            items = [item for item in items if item[0].lost is None]
            if not partitions:
                return []
            try:
                options = WriteOptions(
                    fences=tuple(p.fence for p in partitions),
                    listeners=self.listeners,
                    stream_entries={e.operation.key: e.entry_id for _, e in items},
                    check_replays=check_replays,
                    # Decided by the model phase, on other threads: no model is called here.
                    decisions=decisions or {},
                )
                results = self.store.execute(
                    [entry.operation for _, entry in items], self.embedder, options=options
                )
                return list(zip(items, results, strict=True))
            except FencedError as exc:
                stale = [p for p in partitions if p.fence.name in exc.fences] or partitions
                for p in stale:
                    p.lose("fenced")
                self._count_fenced(len(stale))
            except TRANSIENT_DB as exc:
                delay = self.wait_out("database", exc, delay, entries=len(items))
            except Exception as exc:
                texts = strings_in([entry.operation.to_dict() for _, entry in items])
                raise Unappliable(cause_of(exc, texts)) from exc

    def _count_fenced(self, partitions: int) -> None:
        """The store refused a commit of ours: worth a counter of its own, best effort."""
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.hincrby(keys.METRICS, "commits_fenced_total", partitions)
            pipe.hincrby(keys.worker(self.worker_id), "fenced", partitions)
            pipe.execute()
        except redis.RedisError:
            pass
