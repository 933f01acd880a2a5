"""A lease that lets one job run at a time, and cannot outlive a dead holder.

The key holds ``"<holder> <token>"`` with a TTL, taken only when free and
extended only by its holder, with the stream workers' partition lease scripts
(``worker.leases``): every acquisition draws a new fencing token. A holder
that stops (killed, paused, cut off) loses the lease once the TTL runs out; the
store refuses the writes it still tries afterwards, because they carry an older
token than the next holder's (``store.Fence``).
"""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType

import redis

from engram.store import Fence
from engram.worker.consuming.leases import ACQUIRE_SCRIPT, RELEASE_SCRIPT, RENEW_SCRIPT

log = logging.getLogger(__name__)


class JobLease:
    def __init__(
        self, client: redis.Redis, *, key: str, counter_key: str, fence_name: str, ttl_ms: int
    ) -> None:
        self.client = client
        self.key = key
        self.counter_key = counter_key
        self.fence_name = fence_name
        self.ttl_ms = ttl_ms
        self._value: str | None = None
        self.token: int | None = None
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def fence(self) -> Fence:
        assert self.token is not None, "not held"
        return Fence(self.fence_name, self.token)

    def holder(self) -> str | None:
        """Who holds the lease now (``"<holder> <token>"``), or None when it is free."""
        value = self.client.get(self.key)
        return value.decode() if isinstance(value, bytes) else value

    def acquire(self, holder: str) -> bool:
        """Take the lease if it is free, and keep it renewed until ``release``."""
        token = self.client.eval(ACQUIRE_SCRIPT, 2, self.key, self.counter_key, holder, self.ttl_ms)
        if token is None:
            return False
        self.token = int(token)
        self._value = f"{holder} {self.token}"
        self.lost.clear()
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name="lease-renewal", daemon=True)
        self._renewer.start()
        return True

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        if self._value is not None and not self.lost.is_set():
            try:
                self.client.eval(RELEASE_SCRIPT, 1, self.key, self._value)
            except redis.RedisError as exc:  # it runs out by itself
                log.warning("lease not released", extra={"error": type(exc).__name__})
        self._value = None

    def _renew_loop(self) -> None:
        assert self._value is not None
        renewed_at = time.monotonic()
        while not self._stop.wait(self.ttl_ms / 3000):
            try:
                renewed = self.client.eval(RENEW_SCRIPT, 1, self.key, self._value, self.ttl_ms)
            except redis.RedisError:
                # Tried again at the next beat, while the TTL may still last.
                renewed = time.monotonic() - renewed_at < self.ttl_ms / 1000
                if renewed:
                    continue
            if not renewed:
                log.warning("lease lost", extra={"lease": self.key, "token": self.token})
                self.lost.set()
                return
            renewed_at = time.monotonic()

    def __enter__(self) -> JobLease:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
