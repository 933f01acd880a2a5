"""``Worker``: owns a share of the partitions and runs one ``PartitionRunner`` per partition.

Any number of workers, on any number of hosts, share the streams. Each tick
(a fifth of the lease TTL) a worker beats, renews its leases, notices runners
that stopped, and rebalances: above its share it releases partitions (their
runners finish the batch in hand first), below it it takes free ones. A gone
worker stops beating, so the others' shares grow and they take its partitions
once its leases run out.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import redis

from store import Embedder, Store

from . import metrics
from .leases import Lease, Leases
from .membership import Membership, first_choice, new_worker_id, share
from .partition import PartitionRunner, Shared
from .settings import WorkerConfig

log = logging.getLogger(__name__)

# How long a stopping worker waits for its runners to finish their batches.
STOP_TIMEOUT_S = 60.0


class Worker:
    def __init__(
        self,
        client: redis.Redis,
        store: Store,
        embedder: Embedder | None,
        *,
        config: WorkerConfig | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.config = config or WorkerConfig()
        self.worker_id = worker_id or new_worker_id()
        self.client = client
        self.shared = Shared(client, store, embedder, self.config, self.worker_id)
        self.leases = Leases(client, ttl_ms=self.config.lease_ttl_ms)
        self.membership = Membership(client, self.worker_id, ttl_ms=self.config.lease_ttl_ms)
        self.runners: dict[int, PartitionRunner] = {}
        self._stop = threading.Event()
        self._redis_down_since: float | None = None

    @property
    def partitions(self) -> list[int]:
        """The partitions this worker holds now (including ones it is releasing)."""
        return sorted(self.runners)

    def stop(self) -> None:
        """Ask the worker to finish its batches, release its partitions and return from ``run``."""
        self._stop.set()

    def run(self) -> None:
        log.info(
            "worker started", extra={"worker": self.worker_id, "partitions": self.config.partitions}
        )
        try:
            while not self._stop.is_set():
                self.tick()
                self._stop.wait(self.config.tick_s)
        finally:
            self._shutdown()
        log.info("worker stopped", extra={"worker": self.worker_id})

    def tick(self) -> None:
        try:
            self._renew()
            self._reap()
            live = self.membership.beat(self.runners)
            self._rebalance(live)
            if self._redis_down_since is not None:
                log.info("redis reachable again", extra={"worker": self.worker_id})
                self._redis_down_since = None
        except redis.RedisError as exc:
            # The runners stop committing when their leases run out; nothing to do but wait.
            if self._redis_down_since is None:
                self._redis_down_since = time.monotonic()
                log.warning(
                    "redis unavailable",
                    extra={"worker": self.worker_id, "error": type(exc).__name__},
                )

    # -- leases ----------------------------------------------------------------------

    def _renew(self) -> None:
        held = [r for r in self.runners.values() if r.lost is None]
        if not held:
            return
        sent = time.monotonic()
        renewed = self.leases.renew([r.lease for r in held])
        valid_until = sent + (self.config.lease_ttl_ms - self.config.lease_margin_ms) / 1000
        for runner, ok in zip(held, renewed, strict=True):
            if ok:
                runner.valid_until = valid_until
            else:
                log.warning(
                    "lease lost", extra={"worker": self.worker_id, "partition": runner.partition}
                )
                runner.lose("lease_lost")

    def _reap(self) -> None:
        """Forget runners that have stopped; give back their leases if still held."""
        for partition, runner in list(self.runners.items()):
            if runner.is_alive():
                continue
            del self.runners[partition]
            self.leases.release([runner.lease])
            if runner.lost is not None:
                metrics.record_partition_event(self.client, self.worker_id, "lost", runner.lost)
            log.info(
                "partition released",
                extra={"worker": self.worker_id, "partition": partition, "lost": runner.lost},
            )

    def _rebalance(self, live: list[str]) -> None:
        wanted = share(self.worker_id, live, self.config.partitions)
        active = sorted(p for p, r in self.runners.items() if not r.stopping)
        if len(active) > wanted:
            for partition in active[wanted:]:
                self.runners[partition].request_stop()
            return
        if len(active) == wanted or any(r.stopping for r in self.runners.values()):
            return  # wait for releases to finish before taking more
        count = self.config.partitions
        start = first_choice(self.worker_id, live, count)
        candidates = [(start + i) % count for i in range(count)]
        holders = self.leases.holders(p for p in candidates if p not in self.runners)
        for partition in candidates:
            if len(self.runners) >= wanted:
                break
            if partition in self.runners or holders.get(partition) is not None:
                continue
            self._take(partition)

    def _take(self, partition: int) -> None:
        sent = time.monotonic()
        lease = self.leases.acquire(partition, self.worker_id)
        if lease is None:
            return
        valid_until = sent + (self.config.lease_ttl_ms - self.config.lease_margin_ms) / 1000
        runner = PartitionRunner(self.shared, lease, valid_until)
        self.runners[partition] = runner
        runner.start()
        metrics.record_partition_event(self.client, self.worker_id, "acquired")
        log.info(
            "partition acquired",
            extra={"worker": self.worker_id, "partition": partition, "token": lease.token},
        )

    # -- stopping --------------------------------------------------------------------

    def _shutdown(self) -> None:
        for runner in self.runners.values():
            runner.request_stop()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(r.is_alive() for r in self.runners.values()) and time.monotonic() < deadline:
            # Keep the leases while the batches in hand finish.
            with contextlib.suppress(redis.RedisError):
                self._renew()
            for runner in self.runners.values():
                runner.join(timeout=0.1)
        held: list[Lease] = [r.lease for r in self.runners.values() if not r.is_alive()]
        try:
            self.leases.release(held)
            self.membership.leave()
        except redis.RedisError as exc:
            log.warning(
                "could not release leases",
                extra={"worker": self.worker_id, "error": type(exc).__name__},
            )
        self.runners.clear()
