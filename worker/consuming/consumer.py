"""The partitions a worker owns, consumed by one loop: read, commit, reply, acknowledge.

A worker holds a share of the partitions (``Partition``: its lease, its fence,
where it stands). One ``Consumer`` thread serves all of them, in cycles:

1. a partition just taken first raises its fence in the store (from then on,
   commits of any earlier holder are refused), then claims (``XAUTOCLAIM``)
   the entries earlier holders read but never acknowledged, in stream order;
2. every other partition is read with one ``XREADGROUP`` over all their
   streams, which blocks until one of them has work (on a Redis Cluster, where
   a command touches one slot, one per stream: ``reads``);
3. what the cycle read is checked (a malformed entry, or one delivered too
   often, goes to the dead letters) and committed with one ``store.execute``
   carrying every partition's fence: one embedding call and one transaction,
   each operation still with its own receipt and scope revision. Operations
   that need a model wait out of it, with the rest of their scope, while
   their calls run on other threads (``models``); they commit in a later
   cycle, in their scope's order;
4. the replies and the dead letters are written, committed forgets handed
   to their redaction listeners (``on_forget``, after their replies), and
   the entries acknowledged (and deleted) in one Redis pipeline, the one that
   carries the next cycle's ``XREADGROUP``: one round trip a cycle. The
   counters go in it about once a second (``metrics.Tally``), not with every
   cycle. Before anything else touches Redis (a claim, a partition let go, a
   stop), and when the worker goes idle, what is still unsent goes on its own.

A paused partition (``pause``: looked up by the worker's own thread each tick,
off the cycle's path; by the consumer itself when no tick has offered it for a
second) is neither claimed nor read until it is resumed; what it holds waits in
its stream.

The loop is this module; the rest has a module each: ``triage`` sorts what was
read (pure), ``committer`` commits under the fences, ``outcomes`` counts and
answers (pure but for the pipeline it fills), ``replies`` writes a reply,
``partition`` is what is known of each partition held.

The batch grows with the load: whatever arrives while a cycle commits is read
by the next one. Partitions never share a scope and each partition's entries
keep their stream order within and across cycles, so every scope's operations
commit in the order they were enqueued. Delivery is at least once; the
receipts make a redelivered operation a replay.

If the store refuses a fence, that partition is lost: its entries are neither
answered nor acknowledged (its new owner claims them) and the rest of the
batch is committed without it. The worker's own thread (``worker.Worker``)
renews the leases and takes or releases partitions between cycles.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import redis

from engram.store import LLM, Embedder, Store
from engram.store.vectors.embedders import EmbedderResolver
from engram.worker import keys
from engram.worker.admin import pause
from engram.worker.admin.metrics import Tally, record_batches
from engram.worker.causes import Cause
from engram.worker.cluster import is_cluster
from engram.worker.consuming import groups
from engram.worker.consuming.committer import TRANSIENT_DB, TRANSIENT_REDIS, Committer
from engram.worker.consuming.model_phase import ModelPhase, Released
from engram.worker.consuming.outcomes import Answers, Outcomes, acknowledged, batch_stats
from engram.worker.consuming.partition import ForgetHook, Partition
from engram.worker.consuming.reads import ClusterReads, by_stream
from engram.worker.consuming.triage import Dead, Read, triage
from engram.worker.defaults import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    LINGER_BELOW,
    METRICS_FLUSH_S,
    STRAY_CHECK_S,
)
from engram.worker.protocol import Entry
from engram.worker.settings import WorkerConfig

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Shared:
    """What a worker's consumer works with."""

    client: redis.Redis
    store: Store
    # One embedder, or a resolver that follows the store's active generation.
    embedder: Embedder | EmbedderResolver | None
    config: WorkerConfig
    worker_id: str
    llm: LLM | None = None
    on_forget: ForgetHook | None = None


class _Stopping(Exception):
    """Asked to stop while waiting out a failure: the batch stays pending for the next owner."""


class Consumer(threading.Thread):
    def __init__(self, shared: Shared) -> None:
        super().__init__(name=f"engram-consumer-{shared.worker_id}", daemon=True)
        self.shared = shared
        self._lock = threading.Lock()
        self._partitions: dict[int, Partition] = {}
        self._stop_requested = threading.Event()
        # The last cycle's replies and acknowledgements, until they go out (``_send``).
        self._unsent: Callable[[Any], None] | None = None
        # The counts of the batches done and not yet written (``Tally``).
        self._tally = Tally(METRICS_FLUSH_S)
        self._pauses = pause.PauseWatch()
        # The paused partitions as the worker's own thread last read them (``offer_pauses``),
        # not yet taken by a cycle: the lookup stays off the cycle's path. With when that
        # read was sent: one sent before the consumer's own last look is older than what
        # it saw, and is passed over.
        self._offered: tuple[frozenset[int], float] | None = None
        self._looked_at = 0.0
        self._next_stray_check = 0.0
        # Cycles ended so far: whoever changed what a cycle looks at (a lease's
        # validity, say) knows it is seen once two more have ended.
        self.cycles = 0
        # On a Redis Cluster a command touches one slot: a read per stream (``reads``).
        self._cluster_reads = (
            ClusterReads(shared.client, shared.worker_id) if is_cluster(shared.client) else None
        )
        self.committer = Committer(
            shared.store,
            shared.embedder,
            shared.client,
            shared.worker_id,
            listeners=shared.on_forget is not None,
            wait_out=self._back_off,
        )
        self.models = ModelPhase(
            shared.store,
            shared.embedder,
            shared.llm,
            concurrency=shared.config.llm_concurrency,
            deadline_s=shared.config.llm_deadline_s,
            transient=TRANSIENT_DB,
        )

    def add(self, partition: Partition) -> None:
        """Serve ``partition`` from the next cycle on."""
        with self._lock:
            self._partitions[partition.number] = partition

    def stop(self) -> None:
        """Finish the cycle in hand, then let go of every partition and return."""
        self._stop_requested.set()

    def run(self) -> None:
        try:
            while True:
                active = self._settle()
                if self._stop_requested.is_set() and not self.models.busy:
                    self._send()
                    break
                if active:
                    try:
                        self._cycle(active)
                    except redis.ResponseError as exc:
                        if not groups.is_missing(exc):
                            raise
                        self._recreate_groups(active)
                    self.cycles += 1
                else:
                    self._stop_requested.wait(self.shared.config.block_ms / 1000)
        except _Stopping:
            pass
        except Exception as exc:
            # The frames, not the message: a database error's message may quote data.
            log.error(
                "consumer crashed",
                extra={
                    "worker": self.shared.worker_id,
                    "error": type(exc).__name__,
                    "where": "".join(traceback.format_tb(exc.__traceback__))[-2000:],
                },
            )
            for p in self._snapshot():
                p.lose("crashed")
        finally:
            self.models.close()
            for p in self._snapshot():
                p.done.set()
            with self._lock:
                self._partitions.clear()

    def _snapshot(self) -> list[Partition]:
        with self._lock:
            return sorted(self._partitions.values(), key=lambda p: p.number)

    def _settle(self) -> list[Partition]:
        """Let go of the partitions lost or being released; the others are served. One
        being released that still holds operations waiting for a model finishes them first."""
        active: list[Partition] = []
        stopping: list[Partition] = []
        for p in self._snapshot():
            finishing = p.lost is None and self.models.held(p) > 0
            (stopping if p.stopping and not finishing else active).append(p)
        if stopping:
            self._send()  # their entries acknowledged before their next owners claim them
        for p in stopping:
            self.models.drop(p)
            if p.lost is not None:
                log.warning("partition lost", extra={**p.ids(), "reason": p.lost})
            with self._lock:
                del self._partitions[p.number]
            p.done.set()
        return active

    # -- one cycle -------------------------------------------------------------------

    def _cycle(self, active: list[Partition]) -> None:
        started = time.monotonic()
        self._find_strays(active)
        if any(not p.fenced or p.draining for p in active):
            self._send()  # a claim must not see our own unacknowledged entries
        self._raise_fences([p for p in active if not p.fenced])
        ready = [p for p in active if p.fenced and p.lost is None]
        # A partition being let go (or a worker stopping) only finishes what it holds.
        taking = [p for p in ready if not p.stopping and not self._stop_requested.is_set()]
        # A paused partition is neither claimed nor read: its entries wait in the stream.
        paused = self._paused()
        held_back = any(p.number in paused for p in taking)
        taking = [p for p in taking if p.number not in paused]
        reads = [r for p in taking if p.draining for r in self._claim(p)]
        claimed = {r.partition for r in reads}
        # A partition whose lease is not known to be ours (its renewal is late: Redis
        # may be gone) is not read: what a read takes after the lease ran out would
        # be pending to us, out of its next holder's sight.
        now = time.monotonic()
        lapsed = any(p.valid_until <= now for p in taking)
        reading = [
            p
            for p in taking
            if not p.draining
            and p not in claimed
            and p.valid_until > now
            and self.models.held(p) < self.shared.config.llm_max_held
        ]
        if self.models.busy:
            self.models.start()  # any phase due again (the last commit went through)
        if reading:
            # Entries claimed are in hand, or model calls are running: then only look.
            reads += self._read_new(reading, block=not reads and not self.models.running)
        if reads or self.models.has_ready():
            self._handle(reads, started)
        elif self.models.running:
            self.models.wait()
        elif self._tally:
            self._send()  # idle: the counts not yet written go now
        if (held_back or lapsed) and not reading and not reads and not self.models.running:
            # Nothing but paused partitions, or leases not renewed yet: no read blocks,
            # so wait as one would have.
            self._stop_requested.wait(self.shared.config.block_ms / 1000)

    def offer_pauses(self, paused: frozenset[int], sent_at: float) -> None:
        """The paused partitions, as the worker's own thread read them (each tick) with a
        read sent at ``sent_at`` (``time.monotonic``): the next cycle takes them, with no
        round trip of its own."""
        self._offered = (paused, sent_at)

    def _paused(self) -> frozenset[int]:
        """The paused partitions: as the worker's thread last offered them, or, none
        offered once ``PAUSE_CHECK_S`` has passed since the last look (before the first
        tick, or with ticks longer than that), read here; a change is reported in this
        worker's hash once it is in effect here."""
        now = time.monotonic()
        given, self._offered = self._offered, None
        offered = given[0] if given is not None and given[1] >= self._looked_at else None
        if offered is not None or self._pauses.due(now):
            client = self.shared.client
            if offered is None:
                self._looked_at = now
                offered = self._redis(partial(pause.paused_numbers, client))
            if self._pauses.update(offered, now):
                found = self._pauses.paused
                self._redis(partial(pause.report, client, self.shared.worker_id, found))
                log.info(
                    "paused partitions",
                    extra={"worker": self.shared.worker_id, "paused": sorted(found)},
                )
        return self._pauses.paused

    def _raise_fences(self, new: list[Partition]) -> None:
        """From this commit on, earlier holders of these partitions can commit nothing."""
        self._create_groups(new)
        self.committer.execute(new, [])
        for p in new:
            p.fenced = p.lost is None

    def _find_strays(self, active: list[Partition]) -> None:
        """Drain again, at most every ``STRAY_CHECK_S``, a partition with entries left
        pending that no one will answer: pending to another consumer, one that read
        them after its lease ran out (a read sent before, answered after), after
        this worker had claimed what was pending when it took the partition; or
        pending to this worker although it does not hold them, their
        acknowledgement lost (a failover to a replica that had not received it).
        Unclaimed, they would wait for the partition's next change of hands."""
        now = time.monotonic()
        if now < self._next_stray_check:
            return
        self._next_stray_check = now + STRAY_CHECK_S
        watched = [p for p in active if p.fenced and not p.draining and not p.stopping]
        if not watched:
            return
        # What this worker answered is acknowledged before it looks: in the same round
        # trip, ahead of the looks (a round trip of their own would hold up the cycle).
        unsent, counts = self._unsent, self._tally.take(due_only=False)

        def look() -> list[Any]:
            pipe = self.shared.client.pipeline(transaction=False)
            if unsent is not None:
                unsent(pipe)
            record_batches(pipe, counts, self.shared.worker_id)
            for p in watched:
                pipe.xpending(p.stream, keys.GROUP)
            return list(pipe.execute()[-len(watched) :])

        summaries = self._redis(look)
        self._unsent = None
        me = self.shared.worker_id
        for p, summary in zip(watched, summaries, strict=True):
            pending = {_s(c["name"]): int(c["pending"]) for c in summary.get("consumers") or []}
            strays = {name: n for name, n in pending.items() if name != me}
            # What this worker holds pending is what waits for a model phase.
            unheld = pending.get(me, 0) - self.models.held(p)
            if strays:
                log.warning(
                    "entries pending to another consumer, claiming them",
                    extra={**p.ids(), "consumers": sorted(strays), "entries": sum(strays.values())},
                )
            elif unheld > 0:
                log.warning(
                    "entries pending to this worker that it does not hold, claiming them",
                    extra={**p.ids(), "entries": unheld},
                )
            if strays or unheld > 0:
                p.draining, p.cursor = True, "0-0"

    def _create_groups(self, partitions: list[Partition]) -> None:
        """Create each partition's consumer group (and stream) where it is missing."""
        for p in partitions:
            self._redis(partial(groups.create, self.shared.client, p.stream))

    def _recreate_groups(self, active: list[Partition]) -> None:
        """A stream's group is gone (a failover to a replica that had not received it,
        a server restarted without its data): created again, at the start of the
        stream, which holds only entries not yet acknowledged; what was pending to
        anyone is claimed before new entries are read."""
        log.warning(
            "a consumer group is missing, creating it again",
            extra={"worker": self.shared.worker_id, "partitions": [p.number for p in active]},
        )
        self._create_groups(active)
        for p in active:
            p.draining, p.cursor = True, "0-0"

    def _claim(self, p: Partition) -> list[Read]:
        """The next entries left pending on ``p`` (by anyone), in stream order."""
        client, cfg, me = self.shared.client, self.shared.config, self.shared.worker_id
        cursor, entries, deleted = self._redis(
            partial(
                client.xautoclaim,
                p.stream,
                keys.GROUP,
                me,
                0,
                start_id=p.cursor,
                count=cfg.batch_size,
            )
        )
        p.cursor = _s(cursor)
        p.draining = p.cursor != "0-0"
        if deleted:
            self._redis(partial(client.xack, p.stream, keys.GROUP, *deleted))
        if not entries:
            return []
        pending = self._redis(
            partial(
                client.xpending_range,
                p.stream,
                keys.GROUP,
                min=entries[0][0],
                max=entries[-1][0],
                count=len(entries),
                consumername=me,
            )
        )
        deliveries = {_s(x["message_id"]): int(x["times_delivered"]) for x in pending}
        return [Read(p, list(entries), deliveries)]

    def _read_new(self, partitions: list[Partition], *, block: bool) -> list[Read]:
        """The new entries of ``partitions`` (the last cycle's replies and
        acknowledgements go in the same round trip). With ``linger_ms``, a read that
        found only a few is topped up by a second one after that long."""
        cfg = self.shared.config
        unsent, self._unsent = self._unsent, None
        found = self._xreadgroup(partitions, block=block, unsent=unsent)
        if found is None:
            self._unsent = unsent  # idempotent: they go again
            return []
        if (
            cfg.linger_ms
            and found
            and sum(len(entries) for entries in found.values()) < LINGER_BELOW
            and not self._stop_requested.wait(cfg.linger_ms / 1000)
        ):
            for p, entries in (self._xreadgroup(partitions, block=False) or {}).items():
                found.setdefault(p, []).extend(entries)  # later in its stream: after
        return [Read(p, entries, {}) for p, entries in found.items()]

    def _xreadgroup(
        self,
        partitions: list[Partition],
        *,
        block: bool,
        unsent: Callable[[Any], None] | None = None,
    ) -> dict[Partition, list[Any]] | None:
        """One ``XREADGROUP`` over the partitions' streams, after ``unsent``; ``None``
        if Redis failed (after a pause)."""
        cfg = self.shared.config
        block_ms = None
        if block:
            # It answers before the first of its leases is due to run out.
            left_s = min(p.valid_until for p in partitions) - time.monotonic()
            block_ms = max(1, min(cfg.block_ms, int(left_s * 1000)))  # 0 would be forever
        try:
            if self._cluster_reads is not None:
                found = self._cluster_reads.read(
                    [p.stream for p in partitions],
                    count=cfg.batch_size,
                    block_ms=block_ms,
                    unsent=unsent,
                )
            else:
                found = by_stream(self._read_all(partitions, block_ms, unsent))
        except TRANSIENT_REDIS as exc:
            # Entries Redis delivered may not have reached us: they stay pending to
            # this consumer, so claim them again before reading past them. The
            # replies and acknowledgements go again: they are idempotent (the
            # counters may count this cycle twice).
            for p in partitions:
                p.draining, p.cursor = True, "0-0"
            self._back_off("redis", exc, BACKOFF_MIN_S)
            return None
        return {
            p: list(entries)
            for p in partitions
            if (entries := found.get(p.stream.encode(), found.get(p.stream)))
        }

    def _read_all(
        self,
        partitions: list[Partition],
        block_ms: int | None,
        unsent: Callable[[Any], None] | None,
    ) -> Any:
        """One server: one ``XREADGROUP`` over every stream, in the pipeline that carries
        the last cycle's replies and acknowledgements."""
        pipe = self.shared.client.pipeline(transaction=False)
        if unsent is not None:
            unsent(pipe)
        pipe.xreadgroup(
            keys.GROUP,
            self.shared.worker_id,
            {p.stream: ">" for p in partitions},
            count=self.shared.config.batch_size,
            block=block_ms,
        )
        return pipe.execute()[-1]

    def _handle(self, reads: list[Read], started: float) -> None:
        sorted_ = triage(
            reads,
            max_deliveries=self.shared.config.max_deliveries,
            in_hand=self.models.holds,  # delivered again while it waits for its model
        )
        good = self.models.admit(sorted_.good)
        released = self.models.ready()
        # Only entries claimed from earlier deliveries are likely replays: for a batch
        # of first deliveries the store skips its look-up before embedding.
        outcomes, failed = self.committer.commit(
            released.items + good,
            check_replays=any(r.deliveries for r in reads),
            decisions=released.decisions,
        )
        self.models.start()  # after the commit: each phase sees its scope's earlier operations
        outcomes += self._model_failures(released, failed)
        sorted_.failed(failed)
        self._finish(outcomes, sorted_.dead, started, released)

    def _model_failures(
        self, released: Released, failed: list[tuple[Partition, Entry, Cause]]
    ) -> Outcomes:
        """Operations whose model phase failed are answered with its error (nothing was
        committed); one whose phase raised something unexpected is dead-lettered."""
        failed += [(p, entry, why) for (p, entry), why in released.broken if p.lost is None]
        return [(item, error) for item, error in released.failures if item[0].lost is None]

    # -- answering -------------------------------------------------------------------

    def _finish(
        self, outcomes: Outcomes, dead: list[Dead], started: float, released: Released
    ) -> None:
        """Replies, dead letters, counters and the acknowledgements, for one pipeline
        (sent with the next read, or by ``_send``).

        Every entry answered is acknowledged: committed, refused with a typed error,
        or dead-lettered; entries held for a model phase are not (yet). A lost
        partition's are left pending, except those committed before it was lost
        (their receipts answer a replay)."""
        shared = self.shared
        dead = [d for d in dead if d.partition.lost is None]
        done = acknowledged(outcomes, dead)
        entries = sum(len(ids) for ids in done.values())
        stats = batch_stats(outcomes, dead, entries=entries, model_calls=released.calls)
        for d in dead:
            log.warning(
                "entry dead-lettered",
                extra={
                    **d.partition.ids(),
                    "entry": d.entry_id,
                    "operation_id": d.operation_id,
                    "reason": d.reason,
                    "code": d.error.code,
                    # Why, content-free: the cause's code and its error's type and message.
                    **d.error.details(),
                    "deliveries": d.deliveries,
                },
            )
        stats.seconds = time.monotonic() - started
        if self._unsent is not None:
            self._send()  # not in the normal course: the read that began this cycle took it
        self._tally.add(stats)
        counts = self._tally.take(due_only=True)
        answers = Answers(outcomes, dead, done, shared.config.reply_ttl_s, shared.on_forget)

        def add_to(pipe: Any) -> None:
            answers.add_to(pipe)
            record_batches(pipe, counts, shared.worker_id)

        self._unsent = add_to
        log.debug(
            "batch done",
            extra={
                "worker": shared.worker_id,
                "partitions": len(done),
                "entries": stats.entries,
                "committed": stats.committed,
                "replayed": stats.replayed,
                "failed": sum(stats.failed.values()),
                "dead_lettered": len(dead),
                "ms": round(stats.seconds * 1000, 1),
            },
        )

    def _send(self) -> None:
        """Send the last cycle's replies and acknowledgements now, on their own, with
        every count not yet written."""
        unsent = self._unsent
        counts = self._tally.take(due_only=False)
        if unsent is None and not counts:
            return

        def send() -> None:
            pipe = self.shared.client.pipeline(transaction=False)
            if unsent is not None:
                unsent(pipe)
            record_batches(pipe, counts, self.shared.worker_id)
            pipe.execute()

        self._redis(send)
        self._unsent = None

    # -- failures --------------------------------------------------------------------

    def _redis(self, call: Callable[[], T]) -> T:
        delay = BACKOFF_MIN_S
        while True:
            try:
                return call()
            except TRANSIENT_REDIS as exc:
                delay = self._back_off("redis", exc, delay)

    def _back_off(self, server: str, exc: BaseException, delay_s: float, **ids: Any) -> float:
        """Wait out a passing outage (or stop); return the next, longer, delay."""
        log.warning(
            f"{server} unavailable, will retry",
            extra={
                "worker": self.shared.worker_id,
                "error": type(exc).__name__,
                "retry_in_s": delay_s,
                **ids,
            },
        )
        if self._stop_requested.wait(delay_s):
            raise _Stopping
        return min(delay_s * 2, BACKOFF_MAX_S)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
