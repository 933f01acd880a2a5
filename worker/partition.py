"""One owned partition: read its stream in order, commit batches, reply, acknowledge.

A ``PartitionRunner`` is a thread that lives as long as its worker holds the
partition's lease. It first raises the partition's fence in the store (from
then on, commits of any earlier holder are refused), claims every entry left
pending by earlier holders and commits those, then reads new entries. Each
batch: check every entry (a malformed one, or one delivered too often, goes to
the dead letters), commit the rest with one ``store.execute`` under the fence,
then in one Redis pipeline write the replies, the dead letters and the
counters, and acknowledge (and delete) the entries. Delivery is at least once;
the receipts make a redelivered operation a replay.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import psycopg
import psycopg_pool
import redis

from store import Embedder, Fence, Store
from store.errors import EngramError, FencedError

from . import deadletters, keys
from .committer import Committer
from .defaults import BACKOFF_MAX_S, BACKOFF_MIN_S
from .errors import DeadLetteredError
from .leases import Lease
from .metrics import BatchStats, record_batch
from .protocol import OP_FIELD, Entry, Malformed, Outcome, decode_entry, encode_reply
from .settings import WorkerConfig

log = logging.getLogger(__name__)
T = TypeVar("T")

# Failures that pass: the batch in hand is kept and tried again after a pause.
TRANSIENT_DB = (psycopg.OperationalError, psycopg.InterfaceError, psycopg_pool.PoolTimeout)
TRANSIENT_REDIS = (redis.ConnectionError, redis.TimeoutError)


class PartitionLost(Exception):
    """The lease ran out or the store refused the fence: stop, acknowledge nothing more."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Stopping(Exception):
    """Asked to stop while waiting out a failure: the batch stays pending for the next owner."""


class _Unappliable(Exception):
    """``store.execute`` raised something that is neither a passing failure nor the fence."""


@dataclass(frozen=True, slots=True)
class Shared:
    """What every partition runner of one worker uses."""

    client: redis.Redis
    store: Store
    embedder: Embedder | None
    config: WorkerConfig
    worker_id: str
    committer: Committer = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "committer", Committer(self.store, self.embedder))


@dataclass(frozen=True, slots=True)
class _Dead:
    entry_id: str
    operation_id: str | None
    raw: str | None
    reason: str
    error: EngramError
    deliveries: int


def unique_segments(entries: Sequence[Entry]) -> list[list[Entry]]:
    """Cut a batch where an operation id repeats: the store sees each id once per call."""
    segments: list[list[Entry]] = [[]]
    seen: set[str] = set()
    for entry in entries:
        op_id = entry.operation.operation_id
        if op_id in seen:
            segments.append([])
            seen.clear()
        segments[-1].append(entry)
        seen.add(op_id)
    return [s for s in segments if s]


class PartitionRunner(threading.Thread):
    def __init__(self, shared: Shared, lease: Lease, valid_until: float) -> None:
        super().__init__(name=f"engram-partition-{lease.partition}", daemon=True)
        self.shared = shared
        self.lease = lease
        self.partition = lease.partition
        self.stream = keys.stream(lease.partition)
        self.fence = Fence(keys.fence_name(lease.partition), lease.token)
        # Monotonic time after which no commit is attempted; the worker moves it
        # on at each renewal. The fence, not this, is what makes it safe.
        self.valid_until = valid_until
        self.lost: str | None = None
        self._stop_requested = threading.Event()

    def request_stop(self) -> None:
        self._stop_requested.set()

    def lose(self, reason: str) -> None:
        """The worker saw the lease go: commit nothing more, stop after the current step."""
        self.valid_until = 0.0
        if self.lost is None:
            self.lost = reason
        self._stop_requested.set()

    @property
    def stopping(self) -> bool:
        return self._stop_requested.is_set()

    def _ids(self) -> dict[str, Any]:
        return {"partition": self.partition, "token": self.lease.token}

    def run(self) -> None:
        try:
            self._prepare()
            self._drain_pending()
            while not self._stop_requested.is_set():
                entries = self._read_new()
                if entries:
                    self._handle(entries, {})
        except PartitionLost as exc:
            self.lost = self.lost or exc.reason
            log.warning("partition lost", extra={**self._ids(), "reason": exc.reason})
        except _Stopping:
            pass
        except Exception as exc:
            self.lost = "crashed"
            # The frames, not the message: a database error's message may quote data.
            log.error(
                "partition runner crashed",
                extra={
                    **self._ids(),
                    "error": type(exc).__name__,
                    "where": "".join(traceback.format_tb(exc.__traceback__))[-2000:],
                },
            )

    # -- reading ---------------------------------------------------------------------

    def _prepare(self) -> None:
        client = self.shared.client

        def create_group() -> None:
            try:
                client.xgroup_create(self.stream, keys.GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

        self._redis(create_group)
        self._execute([])  # raises the fence: earlier holders can no longer commit here

    def _drain_pending(self) -> None:
        """Claim and commit, in stream order, what earlier holders read but never acknowledged."""
        client, cfg, me = self.shared.client, self.shared.config, self.shared.worker_id
        cursor: Any = "0-0"
        while not self._stop_requested.is_set():
            cursor, entries, deleted = self._redis(
                partial(
                    client.xautoclaim,
                    self.stream,
                    keys.GROUP,
                    me,
                    0,
                    start_id=cursor,
                    count=cfg.batch_size,
                )
            )
            if deleted:
                self._redis(partial(client.xack, self.stream, keys.GROUP, *deleted))
            if entries:
                pending = self._redis(
                    partial(
                        client.xpending_range,
                        self.stream,
                        keys.GROUP,
                        min=entries[0][0],
                        max=entries[-1][0],
                        count=len(entries),
                        consumername=me,
                    )
                )
                self._handle(
                    entries, {_s(p["message_id"]): int(p["times_delivered"]) for p in pending}
                )
            if _s(cursor) == "0-0":
                return

    def _read_new(self) -> list[Any]:
        cfg = self.shared.config
        reply: Any = self._redis(
            lambda: self.shared.client.xreadgroup(
                keys.GROUP,
                self.shared.worker_id,
                {self.stream: ">"},
                count=cfg.batch_size,
                block=cfg.block_ms,
            )
        )
        # redis-py gives [[stream, [(id, fields), ...]]], or [] when the block timed out.
        return list(reply[0][1]) if reply else []

    # -- one batch -------------------------------------------------------------------

    def _handle(self, entries: list[Any], deliveries: dict[str, int]) -> None:
        started = time.monotonic()
        cfg = self.shared.config
        dead: list[_Dead] = []
        good: list[Entry] = []
        raws: dict[str, str | None] = {}
        for raw_id, fields in entries:
            item = decode_entry(
                raw_id, fields or {}, partition=self.partition, partitions=cfg.partitions
            )
            count = deliveries.get(item.entry_id, 1)
            if isinstance(item, Malformed):
                dead.append(
                    _Dead(
                        item.entry_id,
                        item.operation_id,
                        item.raw,
                        deadletters.MALFORMED,
                        item.error,
                        count,
                    )
                )
            elif count > cfg.max_deliveries:
                op_id = item.operation.operation_id
                dead.append(
                    _Dead(
                        item.entry_id,
                        op_id,
                        _raw(fields),
                        deadletters.DELIVERIES,
                        DeadLetteredError(
                            f"operation {op_id} was delivered {count} times without being committed"
                        ),
                        count,
                    )
                )
            else:
                good.append(item)
                raws[item.entry_id] = _raw(fields)
        outcomes, failed = self._commit(good)
        for d in failed:
            dead.append(
                _Dead(
                    d.entry_id,
                    d.operation_id,
                    raws.get(d.entry_id),
                    d.reason,
                    d.error,
                    deliveries.get(d.entry_id, 1),
                )
            )
        self._finish([_s(e[0]) for e in entries], outcomes, dead, started)

    def _commit(self, good: list[Entry]) -> tuple[list[tuple[Entry, Outcome]], list[_Dead]]:
        outcomes: list[tuple[Entry, Outcome]] = []
        failed: list[_Dead] = []
        for segment in unique_segments(good):
            try:
                outcomes += zip(segment, self._execute(segment), strict=True)
                continue
            except _Unappliable:
                pass
            # Something in the batch breaks it: commit one by one to find it.
            for entry in segment:
                try:
                    outcomes += zip([entry], self._execute([entry]), strict=True)
                except _Unappliable as exc:
                    op_id = entry.operation.operation_id
                    failed.append(
                        _Dead(
                            entry.entry_id,
                            op_id,
                            None,
                            deadletters.FAILED,
                            DeadLetteredError(f"operation {op_id} could not be applied ({exc})"),
                            1,
                        )
                    )
        return outcomes, failed

    def _execute(self, entries: list[Entry]) -> list[Outcome]:
        shared = self.shared
        ops = [e.operation for e in entries]
        stream_entries = {e.operation.operation_id: e.entry_id for e in entries}
        delay = BACKOFF_MIN_S
        while True:
            if time.monotonic() > self.valid_until:
                raise PartitionLost("lease_expired")
            try:
                return shared.committer.execute(ops, self.fence, stream_entries)
            except FencedError:
                self._count_fenced()
                raise PartitionLost("fenced") from None
            except TRANSIENT_DB as exc:
                log.warning(
                    "database unavailable, will retry",
                    extra={
                        **self._ids(),
                        "error": type(exc).__name__,
                        "entries": len(ops),
                        "retry_in_s": delay,
                    },
                )
                self._backoff(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
            except Exception as exc:
                raise _Unappliable(type(exc).__name__) from exc

    def _finish(
        self,
        entry_ids: list[str],
        outcomes: list[tuple[Entry, Outcome]],
        dead: list[_Dead],
        started: float,
    ) -> None:
        """Replies, dead letters, counters and the acknowledgement, in one pipeline."""
        shared = self.shared
        stats = BatchStats(entries=len(entry_ids))
        for _, outcome in outcomes:
            if isinstance(outcome, EngramError):
                stats.failed[outcome.code] += 1
            elif outcome.replayed:
                stats.replayed += 1
            else:
                stats.committed += 1
        for d in dead:
            stats.dead[d.reason] += 1
            log.warning(
                "entry dead-lettered",
                extra={
                    **self._ids(),
                    "entry": d.entry_id,
                    "operation_id": d.operation_id,
                    "reason": d.reason,
                    "code": d.error.code,
                    "deliveries": d.deliveries,
                },
            )
        stats.seconds = time.monotonic() - started

        def send() -> None:
            pipe = shared.client.pipeline(transaction=False)
            for entry, outcome in outcomes:
                _reply(
                    pipe,
                    entry.operation.operation_id,
                    encode_reply(outcome, entry.entry_id),
                    shared.config.reply_ttl_s,
                )
            for d in dead:
                deadletters.add(
                    pipe,
                    partition=self.partition,
                    entry_id=d.entry_id,
                    operation_id=d.operation_id,
                    raw=d.raw,
                    reason=d.reason,
                    error=d.error,
                    deliveries=d.deliveries,
                )
                if d.operation_id is not None:
                    _reply(
                        pipe,
                        d.operation_id,
                        encode_reply(d.error, d.entry_id),
                        shared.config.reply_ttl_s,
                    )
            if entry_ids:
                pipe.xack(self.stream, keys.GROUP, *entry_ids)
                # Acknowledged entries are deleted: the stream holds only work to do,
                # and no memory text lingers in Redis after its commit.
                pipe.xdel(self.stream, *entry_ids)
            record_batch(pipe, stats, shared.worker_id)
            pipe.execute()

        self._redis(send)
        log.debug(
            "batch done",
            extra={
                **self._ids(),
                "entries": stats.entries,
                "committed": stats.committed,
                "replayed": stats.replayed,
                "failed": sum(stats.failed.values()),
                "dead_lettered": len(dead),
                "ms": round(stats.seconds * 1000, 1),
            },
        )

    # -- failures --------------------------------------------------------------------

    def _count_fenced(self) -> None:
        """The store refused a commit of ours: worth a counter of its own, best effort."""
        try:
            pipe = self.shared.client.pipeline(transaction=False)
            pipe.hincrby(keys.METRICS, "commits_fenced_total", 1)
            pipe.hincrby(keys.worker(self.shared.worker_id), "fenced", 1)
            pipe.execute()
        except redis.RedisError:
            pass

    def _redis(self, call: Callable[[], T]) -> T:
        delay = BACKOFF_MIN_S
        while True:
            try:
                return call()
            except TRANSIENT_REDIS as exc:
                log.warning(
                    "redis unavailable, will retry",
                    extra={**self._ids(), "error": type(exc).__name__, "retry_in_s": delay},
                )
                self._backoff(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)

    def _backoff(self, delay_s: float) -> None:
        if self._stop_requested.wait(delay_s):
            raise _Stopping


def _reply(pipe: Any, operation_id: str, body: str, ttl_s: int) -> None:
    # One element at most: a redelivered operation's reply replaces the first.
    key = keys.reply(operation_id)
    pipe.delete(key)
    pipe.rpush(key, body)
    pipe.expire(key, ttl_s)


def _raw(fields: Any) -> str | None:
    if not fields:
        return None
    value = fields.get(OP_FIELD.encode(), fields.get(OP_FIELD))
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
