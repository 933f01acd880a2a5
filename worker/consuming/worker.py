"""``Worker``: owns a share of the partitions; its ``Consumer`` serves them all.

Any number of workers, on any number of hosts, share the streams. Each tick
(a fifth of the lease TTL) a worker beats, renews its leases, notices the
partitions its consumer let go of, and rebalances: above its share it
releases partitions (the consumer finishes the cycle in hand first), below it
it takes free ones. A gone worker stops beating, so the others' shares grow
and they take its partitions once its leases run out.

Each tick it also reads the partition layout (``layout``): the partitions it shares
are those of the epoch being served. During a switch that is the old epoch, until
every old partition is closed and drained; the worker that sees so first writes the
steady layout. When the epoch served changes, a worker lets go of all it holds
before it takes any partition of the new epoch, so it serves one epoch at a time.
Once every live worker serves the new epoch, the old epoch's keys are retired
(``layout.retire``): a worker looks when it starts and whenever its epoch changes.
"""

from __future__ import annotations

import contextlib
import logging
import time

import redis

from engram.store import LLM, Embedder, Store
from engram.store.vectors.embedders import EmbedderResolver
from engram.worker import layout
from engram.worker.admin import metrics, pause
from engram.worker.cluster import REDIS_FAILURES
from engram.worker.consuming.consumer import Consumer, Shared
from engram.worker.consuming.leases import Lease, Leases
from engram.worker.consuming.membership import (
    Membership,
    first_choice,
    live_workers,
    new_worker_id,
    share,
)
from engram.worker.consuming.partition import ForgetHook, Partition
from engram.worker.consuming.stopping import StopRequest
from engram.worker.layout import Epoch
from engram.worker.settings import WorkerConfig

log = logging.getLogger(__name__)

# How long a stopping worker waits for its consumer to finish the cycle in hand.
STOP_TIMEOUT_S = 60.0
# A tick's length while a partition is being let go (``Worker._next_tick_s``).
RELEASE_TICK_S = 0.05
# How long a worker waits before it looks again at a replaced epoch's streams that
# still hold entries (``layout.stranded``): they are retired once those are gone.
STRANDED_RETRY_S = 10.0


class Worker:
    def __init__(
        self,
        client: redis.Redis,
        store: Store,
        embedder: Embedder | EmbedderResolver | None,
        *,
        llm: LLM | None = None,
        config: WorkerConfig | None = None,
        worker_id: str | None = None,
        on_forget: ForgetHook | None = None,
    ) -> None:
        """``embedder``: one embedder, or a resolver (``store.vectors.registry``) with which the
        worker follows a switch of the active generation without a restart.
        ``on_forget``: hands committed forgets to their redaction listeners; without it,
        a forget's redaction is ``none``."""
        self.config = config or WorkerConfig()
        self.worker_id = worker_id or new_worker_id()
        self.client = client
        self.shared = Shared(
            client, store, embedder, self.config, self.worker_id, llm=llm, on_forget=on_forget
        )
        self.leases = Leases(client, ttl_ms=self.config.lease_ttl_ms)
        self.membership = Membership(client, self.worker_id, ttl_ms=self.config.lease_ttl_ms)
        self.held: dict[int, Partition] = {}
        self.consumer = Consumer(self.shared)
        self._stop = StopRequest()  # set by a signal handler, too
        self._redis_down_since: float | None = None
        # The epoch whose partitions this worker shares: the configured count until the
        # layout in Redis says otherwise (read each tick).
        self.serving = Epoch(0, self.config.partitions)
        self._told_layout = False
        self._layout: layout.Layout | None = None  # as last read; None: none in Redis
        # The replaced epochs' partitions left to retire; None: look in Redis again.
        self._retiring: dict[Epoch, set[int]] | None = None
        self._retire_after = 0.0
        self._told_stranded: set[Epoch] = set()

    @property
    def partitions(self) -> list[int]:
        """The partitions this worker holds now (including ones it is releasing)."""
        return sorted(self.held)

    def stop(self) -> None:
        """Ask the worker to finish its batches, release its partitions and return from
        ``run``. Safe from a signal handler."""
        self._stop.set()

    def run(self) -> None:
        log.info(
            "worker started",
            extra={
                "worker": self.worker_id,
                "partitions": self.config.partitions,
                "model": self.shared.llm is not None,
            },
        )
        try:
            while not self._stop.is_set():
                self.tick()
                self._stop.wait(self._next_tick_s())
        finally:
            self._shutdown()
        log.info("worker stopped", extra={"worker": self.worker_id})

    def _next_tick_s(self) -> float:
        """A tick's length, shorter while a partition is being let go: the next tick
        takes the partitions that wait for it (after a rebalance, or all of a new layout
        epoch's) as soon as the consumer has finished with it."""
        if any(p.stopping for p in self.held.values()):
            return min(self.config.tick_s, RELEASE_TICK_S)
        return self.config.tick_s

    def tick(self) -> None:
        try:
            self._renew()
            self._reap()
            self._follow_layout()
            # Read here, taken by the consumer's next cycle: off the path of its operations.
            sent = time.monotonic()
            self.consumer.offer_pauses(pause.paused_numbers(self.client), sent)
            live = self.membership.beat(
                self.held, epoch=self.serving.number, partition_count=self.serving.partitions
            )
            self._rebalance(live)
            self._retire_replaced()
            if self._redis_down_since is not None:
                log.info("redis reachable again", extra={"worker": self.worker_id})
                self._redis_down_since = None
        except REDIS_FAILURES as exc:
            # The consumer commits nothing once the leases run out; nothing to do but wait.
            if self._redis_down_since is None:
                self._redis_down_since = time.monotonic()
                log.warning(
                    "redis unavailable",
                    extra={"worker": self.worker_id, "error": type(exc).__name__},
                )

    # -- the layout --------------------------------------------------------------------

    def _follow_layout(self) -> None:
        """Read the layout; during a switch, look at its barrier. When the epoch to serve
        changes, let go of every partition held (their consumer finishes the cycle in
        hand): ``_rebalance`` takes the new epoch's once they are all released."""
        found = self._layout = layout.stored(self.client)
        if found is None:
            return  # epoch 0, the configured count
        if not self._told_layout and found.current.partitions != self.config.partitions:
            log.warning(
                "the partition layout in Redis differs from ENGRAM_PARTITIONS; using Redis's",
                extra={
                    "worker": self.worker_id,
                    "configured": self.config.partitions,
                    **found.as_dict(),
                },
            )
        self._told_layout = True
        if found.switching:
            found = layout.finish(self.client, found)
            if not found.switching:
                log.info(
                    "partition switch finished",
                    extra={"worker": self.worker_id, **found.current.as_dict()},
                )
        if found.serving != self.serving:
            log.info(
                "serving a new partition layout",
                extra={
                    "worker": self.worker_id,
                    "was": self.serving.as_dict(),
                    **found.serving.as_dict(),
                },
            )
            self.serving = found.serving
            self._retiring = None
            for p in self.held.values():
                p.release_requested = True

    def _retire_replaced(self) -> None:
        """Retire the epochs a switch replaced, once every live worker serves the
        current one (none may read an old stream any more): ``layout.retire``."""
        now = self._layout
        if now is None or now.switching or self._retiring == {}:
            return
        if time.monotonic() < self._retire_after:
            return
        if self._retiring is None:
            self._retiring = {
                e: set(range(e.partitions))
                for e in layout.retiring(self.client)
                if e.number < now.current.number
            }
            if not self._retiring:
                return
        epoch_now = str(now.current.number)
        if any(
            w.get("epoch") != epoch_now for w in live_workers(self.client, self.config.lease_ttl_ms)
        ):
            return  # one still serves (or is moving from) an old epoch
        holding: list[str] = []
        for epoch, left in list(self._retiring.items()):
            done = layout.retire(self.client, epoch, now.current, sorted(left))
            left -= {n for n, status in done.items() if status == "retired"}
            if not left:
                del self._retiring[epoch]
                log.info(
                    "partition epoch retired", extra={"worker": self.worker_id, **epoch.as_dict()}
                )
            held = [epoch.stream(n) for n, status in done.items() if status == "holds"]
            if held and epoch not in self._told_stranded:
                self._told_stranded.add(epoch)
                log.warning(
                    "entries wait in a replaced epoch's streams, which no worker reads",
                    extra={"worker": self.worker_id, "streams": ",".join(held)},
                )
            holding.extend(held)
        if self._retiring and len(holding) == sum(map(len, self._retiring.values())):
            self._retire_after = time.monotonic() + STRANDED_RETRY_S

    # -- leases ----------------------------------------------------------------------

    def _renew(self) -> None:
        held = [p for p in self.held.values() if p.lost is None]
        if not held:
            return
        sent = time.monotonic()
        renewed = self.leases.renew([p.lease for p in held])
        valid_until = sent + (self.config.lease_ttl_ms - self.config.lease_margin_ms) / 1000
        for p, ok in zip(held, renewed, strict=True):
            if ok:
                p.valid_until = valid_until
            else:
                log.warning("lease lost", extra={"worker": self.worker_id, "partition": p.number})
                p.lose("lease_lost")

    def _reap(self) -> None:
        """Forget the partitions the consumer let go of; give back their leases if still
        held. A consumer that died (it logged why) lets go of everything and is replaced."""
        if self.consumer.ident is not None and not self.consumer.is_alive():
            for p in self.held.values():
                if not p.done.is_set():
                    p.lose("crashed")
                    p.done.set()
            self.consumer = Consumer(self.shared)
        for number, p in list(self.held.items()):
            if not p.done.is_set():
                continue
            del self.held[number]
            self.leases.release([p.lease])
            if p.lost is not None:
                metrics.record_partition_event(self.client, self.worker_id, "lost", p.lost)
            log.info(
                "partition released",
                extra={"worker": self.worker_id, "partition": number, "lost": p.lost},
            )

    def _rebalance(self, live: list[str]) -> None:
        wanted = share(self.worker_id, live, self.serving.partitions)
        active = sorted(n for n, p in self.held.items() if not p.stopping)
        if len(active) > wanted:
            for number in active[wanted:]:
                self.held[number].release_requested = True
            return
        if len(active) == wanted or any(p.stopping for p in self.held.values()):
            return  # wait for releases to finish before taking more
        epoch, count = self.serving.number, self.serving.partitions
        start = first_choice(self.worker_id, live, count)
        candidates = [(start + i) % count for i in range(count)]
        holders = self.leases.holders((p for p in candidates if p not in self.held), epoch)
        for partition in candidates:
            if len(self.held) >= wanted:
                break
            if partition in self.held or holders.get(partition) is not None:
                continue
            self._take(partition)

    def _take(self, partition: int) -> None:
        sent = time.monotonic()
        lease = self.leases.acquire(partition, self.worker_id, self.serving.number)
        if lease is None:
            return
        valid_until = sent + (self.config.lease_ttl_ms - self.config.lease_margin_ms) / 1000
        self.held[partition] = p = Partition(lease, valid_until, self.serving.partitions)
        self.consumer.add(p)
        if self.consumer.ident is None:
            self.consumer.start()
        metrics.record_partition_event(self.client, self.worker_id, "acquired")
        log.info(
            "partition acquired",
            extra={"worker": self.worker_id, **p.ids()},
        )

    # -- stopping --------------------------------------------------------------------

    def _shutdown(self) -> None:
        self.consumer.stop()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self.consumer.is_alive() and time.monotonic() < deadline:
            # Keep the leases while the cycle in hand finishes.
            with contextlib.suppress(*REDIS_FAILURES):
                self._renew()
            self.consumer.join(timeout=0.1)
        held: list[Lease] = [p.lease for p in self.held.values() if p.done.is_set()]
        try:
            self.leases.release(held)
            self.membership.leave()
        except REDIS_FAILURES as exc:
            log.warning(
                "could not release leases",
                extra={"worker": self.worker_id, "error": type(exc).__name__},
            )
        self.held.clear()
