"""``Producer``: enqueue memory operations onto the partition streams, wait for receipts.

A producer needs Redis only. It validates every operation before anything is
sent (an invalid one raises ``InvalidRequestError`` and enqueues nothing),
adds it to its scope's partition stream and returns at once; ``wait`` blocks
on the operation's reply key, which a worker fills after the commit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Unpack

import anyio
import redis

from engram.store import Operation, Scope
from engram.store.errors import EngramError
from engram.store.write.requests import (
    ExtractFields,
    RememberFields,
    RetractFields,
    ReviseFields,
    extract_request,
    forget_request,
    remember_request,
    retract_request,
    revise_request,
)
from engram.worker import cluster, keys
from engram.worker.defaults import MAX_PARTITIONS, PARTITIONS, STREAM_MAX_LEN
from engram.worker.embedded import runtime
from engram.worker.errors import (
    PartitionRetiredError,
    QueueFullError,
    QueueUnavailableError,
    WaitTimeout,
)
from engram.worker.layout import ADD_SCRIPT, MOVED, RETIRED, Epoch, Layout
from engram.worker.protocol import OP_FIELD, StreamReceipt, decode_reply, encode_entry, partition_of
from engram.worker.settings import Settings

# How long an enqueue with ``wait_replicas`` waits for the replicas (``WAIT``).
WAIT_REPLICAS_MS = 1000
# How long one blocking read of a reply lasts: below the client's socket
# timeout, and short enough to ride out a Redis restart within a wait.
_WAIT_SLICE_S = 1.0
# How often a wait looks again when the reply there is to an earlier enqueue.
_STALE_POLL_S = 0.05
# How long a wait with no reply goes before it looks whether its entry is still in its
# stream (gone, with no reply: the reply was lost, and the operation is asked again).
REASK_AFTER_S = 5.0
# How many times an enqueue refused by a closed partition reloads the layout: more than
# one switch between two of its reads would be needed to run out.
_RELOADS = 5
# A wait on an event loop (``Pending.replied``) first blocks on its reply key for up
# to FAST_WAIT_S, on a thread of its own: a receipt that comes meanwhile (most do, at
# everyday load: a few ms) wakes it at once. At most FAST_WAITERS waits of a process
# block so at once, each on its own limiter, so they take no token of the server's
# thread pool and cannot starve it; the others, and a wait past FAST_WAIT_S, look for
# their reply after FIRST_POLL_S, then twice as long each time, up to MAX_POLL_S: a
# reply then shows within a tenth of a second.
FAST_WAIT_S = 0.05
FAST_WAITERS = 8
FIRST_POLL_S = 0.01
MAX_POLL_S = 0.1
_fast_waiters = threading.BoundedSemaphore(FAST_WAITERS)


log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Pending:
    """An enqueued operation: its id, where it went, and a way to wait for its receipt."""

    operation_id: str
    partition: int
    entry_id: str
    producer: Producer
    stream: str
    # Its scope names its reply; to ask again for a lost reply (``wait``). Its text is
    # never shown.
    op: Operation = field(repr=False, compare=False)

    @property
    def scope(self) -> Scope:
        return self.op.scope

    def wait(self, timeout: float = 30.0) -> StreamReceipt:
        """The receipt, as ``Producer.wait``; and a reply that was lost is asked again.

        A worker writes the reply, then acknowledges the entry and deletes it from its
        stream. On a Redis Cluster the two may live on different nodes: when the one
        holding the reply dies before a replica has it, the operation is applied and
        acknowledged, and no worker would ever answer it again. So a wait with no reply
        after ``REASK_AFTER_S`` looks for its entry; gone from its stream, the operation
        is enqueued once more under its id, and its receipt comes back as a replay
        (nothing is applied twice)."""
        return self.producer.wait(
            self.scope, self.operation_id, timeout, entry_id=self.entry_id, asked=self
        )

    async def replied(self, wait_s: float) -> StreamReceipt | None:
        """The receipt (its error raised) within ``wait_s``, waited for on an event loop
        holding no thread of the server's pool: first, if fewer than ``FAST_WAITERS``
        waits do so, a blocking read of ``FAST_WAIT_S`` on a thread of its own (a reply
        wakes it at once); then it sleeps between looks that each borrow a thread for one
        read that never blocks, so many waiting requests cannot starve a server's thread
        pool. None once ``wait_s`` has passed, or as soon as the producer is stopping
        (``Producer.stopping``: the server that waits is shutting down and answers its
        waiting requests at once; a blocking read under way ends first, within
        ``FAST_WAIT_S``); the operation stays queued either way. A reply lost
        after its entry was answered is asked again, as ``wait`` does."""
        producer = self.producer
        deadline = time.monotonic() + wait_s
        next_look = time.monotonic() + REASK_AFTER_S
        asked, pause_s = self, FIRST_POLL_S
        if not producer.stopping.is_set() and _fast_waiters.acquire(blocking=False):
            blocking = partial(
                producer.wait,
                self.scope,
                self.operation_id,
                min(FAST_WAIT_S, wait_s),
                entry_id=self.entry_id,
            )
            try:
                return await anyio.to_thread.run_sync(blocking, limiter=anyio.CapacityLimiter(1))
            except WaitTimeout:
                pass
            finally:
                _fast_waiters.release()
        while not producer.stopping.is_set():
            read_now = partial(
                producer.wait, self.scope, self.operation_id, 0.0, entry_id=asked.entry_id
            )
            try:
                return await anyio.to_thread.run_sync(read_now)  # never blocks
            except WaitTimeout:
                pass
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + REASK_AFTER_S
                asked = await anyio.to_thread.run_sync(producer._ask_again_if_lost, asked)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await anyio.sleep(min(pause_s, remaining))
            pause_s = min(pause_s * 2, MAX_POLL_S)
        return None


class Producer:
    def __init__(
        self,
        client: redis.Redis,
        *,
        partitions: int = PARTITIONS,
        stream_max_len: int = STREAM_MAX_LEN,
        wait_replicas: int = 0,
        wait_replicas_ms: int = WAIT_REPLICAS_MS,
        stopping: threading.Event | None = None,
    ) -> None:
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"partitions must be from 1 to {MAX_PARTITIONS}")
        if wait_replicas < 0:
            raise ValueError("wait_replicas must be 0 or more")
        self.client = client
        # The configured count: what ``layout`` is until Redis holds one (``engram
        # repartition``), which then wins.
        self.partitions = partitions
        self._layout: Layout | None = None
        self.stream_max_len = stream_max_len
        # With N > 0 an enqueue returns once N replicas hold the entry (``WAIT``).
        self.wait_replicas = wait_replicas
        self.wait_replicas_ms = wait_replicas_ms
        self._enqueue = client.register_script(ADD_SCRIPT)
        self._connections = _ThreadConnections(client)
        # Set when the process that waits is stopping: every ``Pending.replied`` ends.
        self.stopping = stopping or threading.Event()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        partitions: int = PARTITIONS,
        stream_max_len: int = STREAM_MAX_LEN,
        wait_replicas: int = 0,
        **redis_kwargs: Any,
    ) -> Producer:
        """A producer on the Redis ``url`` names: one server, or a cluster (any of its
        nodes, or several seeds: ``redis://user:pw@h1:p1,h2:p2/0``)."""
        return cls(
            cluster.open_client(url, **redis_kwargs),
            partitions=partitions,
            stream_max_len=stream_max_len,
            wait_replicas=wait_replicas,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **redis_kwargs: Any) -> Producer:
        """A producer for the Redis engram uses here: ``REDIS_URL`` when set, else the one
        the ``engram up`` running on ``ENGRAM_HOME`` (default ``./.engram``) publishes;
        ``ENGRAM_PARTITIONS`` partitions, ``ENGRAM_WAIT_REPLICAS`` replicas to wait for.
        ``ConfigError`` when there is neither."""
        settings = Settings.from_env(env)
        return cls.from_url(
            runtime.redis_url(settings),
            partitions=settings.worker.partitions,
            wait_replicas=settings.wait_replicas,
            **redis_kwargs,
        )

    def close(self) -> None:
        self._connections.close()
        self.client.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- enqueue ----------------------------------------------------------------------

    def layout(self, *, fresh: bool = False) -> Layout:
        """The partition layout this producer sends by: read from Redis once, then again
        when a stream refuses an entry because a switch closed it (or ``fresh``)."""
        if self._layout is None or fresh:
            raw = self._connections.get(keys.LAYOUT)
            self._layout = (
                Layout.decode(raw) if raw is not None else Layout.initial(self.partitions)
            )
        return self._layout

    def enqueue(self, op: Operation) -> Pending:
        """Add a validated operation to its scope's partition stream."""
        fields = encode_entry(op)
        for _ in range(_RELOADS):
            epoch = self._epoch(f"operation {op.operation_id}", "retry with the same operation id")
            partition = partition_of(op.scope, epoch.partitions)
            stream = epoch.stream(partition)
            try:
                entry_id = self._add(op.operation_id, epoch, partition, fields[OP_FIELD])
            except redis.ResponseError as exc:
                if str(exc).startswith(MOVED):
                    self.layout(fresh=True)
                    continue
                if str(exc).startswith(RETIRED):
                    self._reroute(op.operation_id, epoch, stream, exc)
                    continue
                if str(exc).startswith("ENGRAMFULL"):
                    raise QueueFullError(
                        f"operation {op.operation_id} not enqueued: {stream} holds "
                        f"{self.stream_max_len} unprocessed operations"
                    ) from exc
                raise _unavailable(op.operation_id, stream, exc) from exc
            except cluster.REDIS_FAILURES as exc:
                raise _unavailable(op.operation_id, stream, exc) from exc
            return Pending(op.operation_id, partition, _text(entry_id), self, stream, op)
        raise QueueUnavailableError(
            f"operation {op.operation_id} not enqueued: every partition it was sent to "
            "was closed by a repartition; retry with the same operation id"
        )

    def _reroute(self, what: str, tried: Epoch, stream: str, refusal: Exception) -> None:
        """A retired stream refused an entry: read the layout again, or, when it still
        sends to that epoch, ``PartitionRetiredError`` (nothing was enqueued)."""
        if self.layout(fresh=True).current != tried:
            return
        said = str(refusal).removeprefix(RETIRED).strip()[:300]
        raise PartitionRetiredError(
            f"{what} not enqueued: {stream} is {said}, and the layout read here still "
            f"sends to epoch {tried.number}: restore {keys.LAYOUT} (or set "
            "ENGRAM_PARTITIONS) to the layout in use"
        ) from refusal

    def _epoch(self, what: str, retry: str) -> Epoch:
        """The epoch to send to; ``QueueUnavailableError`` (nothing sent) when the layout
        cannot be read."""
        try:
            return self.layout().current
        except cluster.REDIS_FAILURES as exc:
            raise QueueUnavailableError(
                f"{what} not enqueued: the partition layout could not be read "
                f"({type(exc).__name__}); {retry}"
            ) from exc

    def _add(self, operation_id: str, epoch: Epoch, partition: int, body: str) -> Any:
        stream = epoch.stream(partition)
        closed = keys.closed(partition, epoch.number)
        if self.wait_replicas:
            return self._add_replicated(operation_id, stream, closed, body)
        return self._connections.call(self._enqueue, [stream, closed], self.stream_max_len, body)

    def _add_replicated(self, operation_id: str, stream: str, closed: str, body: Any) -> Any:
        """The capped ``XADD`` then ``WAIT``, on one connection (``WAIT`` counts the
        replicas holding that connection's writes): on a cluster, one of the node
        serving the stream's slot. ``NotReplicatedError`` when too few do in time."""
        if cluster.is_cluster(self.client):
            node_client = _node_client(self.client, stream)
        else:
            node_client = self.client
        pipe = node_client.pipeline(transaction=False)
        # The script's text (EVAL): the node may not have it loaded.
        pipe.execute_command("EVAL", ADD_SCRIPT, 2, stream, closed, self.stream_max_len, body)
        pipe.execute_command("WAIT", self.wait_replicas, self.wait_replicas_ms)
        entry_id, held = pipe.execute()
        if int(held) < self.wait_replicas:
            raise NotReplicatedError(
                f"operation {operation_id} was enqueued on {stream} but {held} of "
                f"{self.wait_replicas} replicas held it after {self.wait_replicas_ms} ms; "
                "retry with the same operation id"
            )
        return entry_id

    def enqueue_many(self, ops: Sequence[Operation]) -> list[Pending]:
        """Add many validated operations in one round trip (bulk loads).

        All or an error: when Redis fails, or a stream is full, the error says
        how many were enqueued; enqueue them all again with the same operation
        ids, the receipts make the repeats exact. With ``wait_replicas``, they go one
        by one (``enqueue``: each waits for its replicas).
        """
        if self.wait_replicas:
            return [self.enqueue(op) for op in ops]
        bodies = [encode_entry(op)[OP_FIELD] for op in ops]
        added: list[Pending | None] = [None] * len(ops)
        for _ in range(_RELOADS):
            todo = [i for i, p in enumerate(added) if p is None]
            if not todo:
                break
            moved = self._add_many(ops, bodies, todo, added)
            if moved:
                self.layout(fresh=True)  # a switch closed their partitions: in order, again
        if any(p is None for p in added):
            raise QueueUnavailableError(
                f"{sum(p is not None for p in added)} of {len(ops)} operations enqueued "
                "(the others' partitions were closed by a repartition); retry them with "
                "the same operation ids"
            )
        return [p for p in added if p is not None]

    def _add_many(
        self,
        ops: Sequence[Operation],
        bodies: list[str],
        todo: list[int],
        added: list[Pending | None],
    ) -> bool:
        """Send ``ops[i]`` for each ``i`` in ``todo`` in one round trip, filling ``added``;
        whether some were refused by a closed partition (they stay None)."""
        epoch = self._epoch(
            f"{len(todo)} of {len(ops)} operations", "retry them with the same operation ids"
        )
        targets = [(i, partition_of(ops[i].scope, epoch.partitions)) for i in todo]
        pipe = self.client.pipeline(transaction=False)
        for i, partition in targets:
            cluster.run_script(
                self._enqueue,
                [epoch.stream(partition), keys.closed(partition, epoch.number)],
                [self.stream_max_len, bodies[i]],
                pipe,
            )
        try:
            replies = pipe.execute(raise_on_error=False)
        except cluster.REDIS_FAILURES as exc:
            raise QueueUnavailableError(
                f"{len(ops)} operations may not have been enqueued: {type(exc).__name__}; "
                "retry them with the same operation ids"
            ) from exc
        moved = False
        failed = []
        retired: tuple[str, Exception] | None = None
        for (i, partition), reply in zip(targets, replies, strict=True):
            if not isinstance(reply, Exception):
                added[i] = Pending(
                    ops[i].operation_id,
                    partition,
                    _text(reply),
                    self,
                    epoch.stream(partition),
                    ops[i],
                )
            elif str(reply).startswith(MOVED):
                moved = True
            elif str(reply).startswith(RETIRED):
                moved, retired = True, (epoch.stream(partition), reply)
            else:
                failed.append(reply)
        if retired is not None:
            done = sum(p is not None for p in added)
            self._reroute(f"{len(ops) - done} of {len(ops)} operations", epoch, *retired)
        if failed:
            cls = (
                QueueFullError
                if all(str(f).startswith("ENGRAMFULL") for f in failed)
                else QueueUnavailableError
            )
            raise cls(
                f"{sum(p is not None for p in added)} of {len(ops)} operations enqueued "
                f"({type(failed[0]).__name__}); retry them with the same operation ids"
            )
        return moved

    def submit(
        self,
        kind: str,
        scope: Scope | Mapping[str, Any],
        request: Mapping[str, Any],
        *,
        operation_id: str | None = None,
        requested_by: str | None = None,
    ) -> Pending:
        """Validate (raising ``InvalidRequestError``, nothing sent) and enqueue.

        ``requested_by`` (who asked: an operator, a service) is kept on the receipt
        for the audit trail; it is not part of the request."""
        return self.enqueue(
            Operation.build(kind, scope, request, operation_id, requested_by=requested_by)
        )

    # The verbs' fields are written once, in ``engram.store.write.requests``
    # (``RememberFields`` ...), as ``Session`` takes them.

    def remember(
        self,
        scope: Scope | Mapping[str, Any],
        text: str,
        *,
        operation_id: str | None = None,
        requested_by: str | None = None,
        **fields: Unpack[RememberFields],
    ) -> Pending:
        request = remember_request(text, **fields)
        return self.submit(
            "remember", scope, request, operation_id=operation_id, requested_by=requested_by
        )

    def extract(
        self,
        scope: Scope | Mapping[str, Any],
        messages: Sequence[Mapping[str, Any]],
        *,
        operation_id: str | None = None,
        requested_by: str | None = None,
        **fields: Unpack[ExtractFields],
    ) -> Pending:
        request = extract_request(messages, **fields)
        return self.submit(
            "extract", scope, request, operation_id=operation_id, requested_by=requested_by
        )

    def revise(
        self,
        scope: Scope | Mapping[str, Any],
        record_id: str,
        *,
        operation_id: str | None = None,
        requested_by: str | None = None,
        **fields: Unpack[ReviseFields],
    ) -> Pending:
        request = revise_request(record_id, **fields)
        return self.submit(
            "revise", scope, request, operation_id=operation_id, requested_by=requested_by
        )

    def retract(
        self,
        scope: Scope | Mapping[str, Any],
        record_id: str,
        *,
        operation_id: str | None = None,
        requested_by: str | None = None,
        **fields: Unpack[RetractFields],
    ) -> Pending:
        request = retract_request(record_id, **fields)
        return self.submit(
            "retract", scope, request, operation_id=operation_id, requested_by=requested_by
        )

    def forget(
        self,
        scope: Scope | Mapping[str, Any],
        record_id: str,
        *,
        operation_id: str | None = None,
        requested_by: str | None = None,
    ) -> Pending:
        request = forget_request(record_id)
        return self.submit(
            "forget", scope, request, operation_id=operation_id, requested_by=requested_by
        )

    # -- replies ----------------------------------------------------------------------

    def wait(
        self,
        scope: Scope | Mapping[str, Any],
        operation_id: str,
        timeout: float = 30.0,
        *,
        entry_id: str | None = None,
        asked: Pending | None = None,
    ) -> StreamReceipt:
        """The receipt of the operation ``operation_id`` of ``scope`` (an operation id
        identifies an operation within its scope); raises its typed error, or
        ``WaitTimeout``.

        Any number of callers may wait for the same id, before or after the
        reply arrives: the reply stays in Redis for the reply TTL. With
        ``entry_id`` (``Pending.wait`` passes its own), a reply to an earlier
        enqueue of the same operation id is passed over. With ``asked`` (``Pending.wait``
        passes itself), a reply lost after its entry was acknowledged is asked again.
        """
        key = keys.reply(Scope.of(scope).key, operation_id)
        deadline = time.monotonic() + timeout
        unreachable: Exception | None = None
        next_look = time.monotonic() + REASK_AFTER_S
        while True:
            remaining = deadline - time.monotonic()
            if asked is not None and time.monotonic() >= next_look:
                next_look = time.monotonic() + REASK_AFTER_S
                asked = self._ask_again_if_lost(asked)
                entry_id = asked.entry_id
            raw = None
            try:
                if remaining >= 0.01:
                    # Rotating the one-element list onto itself returns the reply
                    # and leaves it there, so every waiter is woken, not just one.
                    slice_s = min(remaining, _WAIT_SLICE_S)
                    # Redis takes fractions of a second; redis-py's annotation says int.
                    raw = self.client.blmove(key, key, slice_s, "RIGHT", "LEFT")  # type: ignore[arg-type]
                else:
                    raw = self.client.lindex(key, -1)
                unreachable = None
            except cluster.REDIS_FAILURES as exc:
                unreachable = exc
                time.sleep(min(0.2, max(remaining, 0)))
            if raw is not None:
                reply = decode_reply(raw)
                if entry_id is None or _not_older(reply.entry_id, entry_id):
                    return _unwrap(reply.outcome)
                # An earlier enqueue's reply: ours will replace it (rare, so poll).
                time.sleep(min(_STALE_POLL_S, max(remaining, 0)))
            if remaining < 0.01:
                why = f" (redis unreachable: {type(unreachable).__name__})" if unreachable else ""
                raise WaitTimeout(f"no reply for operation {operation_id} within {timeout}s{why}")

    def _ask_again_if_lost(self, asked: Pending) -> Pending:
        """``asked``, or its operation enqueued again when its entry has left its stream
        with no reply (``Pending.wait``). Anything unsure (Redis unreachable, the
        operation not at hand) keeps waiting on ``asked``."""
        if not asked.stream:
            return asked
        try:
            if self.client.xrange(asked.stream, asked.entry_id, asked.entry_id, count=1):
                return asked  # still to be answered
        except redis.RedisError:  # unreachable; or a retired stream's key, a string now
            return asked
        try:
            again = self.enqueue(asked.op)
        except EngramError:  # not enqueued (Redis unreachable, the stream full): later
            return asked
        log.warning(
            "a reply did not come though its entry was answered: asked again",
            extra={"operation_id": asked.operation_id, "stream": asked.stream},
        )
        return again

    def results(
        self, scope: Scope | Mapping[str, Any], operation_ids: Iterable[str]
    ) -> dict[str, StreamReceipt | EngramError]:
        """The replies already there of these operations of ``scope``, without waiting:
        receipts, or errors as values, by operation id."""
        ids = list(operation_ids)
        key = Scope.of(scope).key
        pipe = self.client.pipeline(transaction=False)
        for op_id in ids:
            pipe.lindex(keys.reply(key, op_id), -1)
        try:
            raws = pipe.execute()
        except cluster.REDIS_FAILURES as exc:
            raise QueueUnavailableError(f"could not read replies: {type(exc).__name__}") from exc
        return {
            op_id: decode_reply(raw).outcome
            for op_id, raw in zip(ids, raws, strict=True)
            if raw is not None
        }


class NotReplicatedError(QueueUnavailableError):
    """The entry is in the stream, but fewer replicas than asked held it in time: a
    failover now could lose it. Retry with the same operation id (the receipt makes
    a repeat exact)."""


def _node_client(client: Any, key: str) -> Any:
    """The cluster node client serving ``key``'s slot (its own connection pool)."""
    node = client.get_node_from_key(key)
    return node.redis_connection or client.get_redis_connection(node)


class _ThreadConnections:
    """One connection per thread (made as the client's pool makes them), kept, for
    ``enqueue``.

    A call through ``redis.Redis`` checks a connection out of the pool and back,
    and goes through the client's command layers: about half the CPU of an
    enqueue (measured with redis-py 8: ~120 against ~50 us). Here the calling
    thread's own connection sends the script, with the client's retry policy.
    A thread's connection is closed when the thread ends, or by ``close``.
    """

    def __init__(self, client: redis.Redis) -> None:
        # A cluster client has a pool per node and routes by key: it sends the script
        # itself (``call``).
        self._client = client if cluster.is_cluster(client) else None
        self._pool = None if self._client is not None else client.connection_pool
        self._local = threading.local()
        self._all: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def call(self, script: Any, script_keys: list[str], *args: Any) -> Any:
        """``EVALSHA`` of a registered script (loaded first if the server lost it)."""
        if self._pool is None:
            return script(keys=script_keys, args=list(args), client=self._client)
        conn = self._connection()

        def evalsha() -> Any:
            conn.send_command("EVALSHA", script.sha, len(script_keys), *script_keys, *args)
            try:
                return conn.read_response()
            except redis.exceptions.NoScriptError:  # a restarted or flushed server
                conn.send_command("SCRIPT", "LOAD", script.script)
                conn.read_response()
                conn.send_command("EVALSHA", script.sha, len(script_keys), *script_keys, *args)
                return conn.read_response()

        return conn.retry.call_with_retry(evalsha, lambda _: conn.disconnect())

    def get(self, key: str) -> Any:
        """``GET`` on the thread's connection (the partition layout, read before an enqueue)."""
        if self._client is not None:
            return self._client.get(key)
        conn = self._connection()

        def get() -> Any:
            conn.send_command("GET", key)
            return conn.read_response()

        return conn.retry.call_with_retry(get, lambda _: conn.disconnect())

    def _connection(self) -> Any:
        assert self._pool is not None
        conn: Any = self._local.__dict__.get("conn")
        if conn is None or conn.pid != os.getpid():
            # New, or inherited through a fork: the parent's socket is the parent's.
            # Made like the pool's own, but not counted against its max_connections:
            # the pool never learns that a thread's connection went with the thread.
            conn = self._local.conn = self._pool.connection_class(**self._pool.connection_kwargs)
            # The thread's locals go when it ends, and this marker with them: the
            # socket is closed then, not left to the garbage collector.
            self._local.ended = ended = _Marker()
            weakref.finalize(ended, conn.disconnect)
            with self._lock:
                self._all.add(conn)
        return conn

    def close(self) -> None:
        with self._lock:
            for conn in list(self._all):
                conn.disconnect()
            self._all.clear()


class _Marker:
    pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _not_older(replied: str | None, mine: str) -> bool:
    """Whether a reply answers our entry, or a later one of the same stream."""
    if replied is None or replied == mine:
        return replied == mine
    try:
        a, b = (tuple(int(x) for x in e.split("-")) for e in (replied, mine))
    except ValueError:
        return False
    return a >= b


def _unwrap(reply: StreamReceipt | EngramError) -> StreamReceipt:
    if isinstance(reply, EngramError):
        raise reply
    return reply


def _unavailable(op_id: str, stream: str, exc: Exception) -> QueueUnavailableError:
    return QueueUnavailableError(
        f"operation {op_id} may not have been enqueued on {stream}: "
        f"{type(exc).__name__}: {str(exc)[:200]}; retry with the same operation id"
    )
