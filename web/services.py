"""What the web app works with, built by the composition root and handed in."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import redis
from redis import Redis

from engram.store import Embedder, Store
from engram.store.vectors.embedders import EmbedderResolver
from engram.store.vectors.registry import EmbedderRegistry
from engram.worker import Producer


class ReembedStarter(Protocol):
    """Starts a reembed job towards ``model`` on behalf of ``requested_by``; returns the
    job's id. Raises ``InvalidRequestError`` for a model it does not know."""

    def __call__(self, model: str, requested_by: str) -> str: ...


@dataclass(frozen=True, slots=True)
class Services:
    store: Store
    redis: redis.Redis  # the streams' (maybe a cluster): bytes in and out, as the workers'
    producer: Producer
    # The query embedder for recall: one embedder, or a resolver that follows the
    # active generation; None, or no embedder for the active model: recall by text only
    # (and it says so).
    embedder: Embedder | EmbedderResolver | None = None
    # None without the jobs: the reembed form and POST /api/v1/reembed say so.
    start_reembed: ReembedStarter | None = None
    # The names a reembed may ask for from the web (never a module path); the
    # composition root hands in the configured registry, else the built-ins.
    embedders: EmbedderRegistry = field(default_factory=EmbedderRegistry)
    # Seconds since the epoch: the overview's minute buckets and how old its costly
    # counts are. Tests hand in their own.
    clock: Callable[[], float] = time.time
    # The jobs' Redis (RQ: one server, never a cluster), when it is not ``redis``'s.
    jobs_redis: Redis | None = None

    @property
    def jobs(self) -> Redis:
        """Where the jobs live: their queues, their pause."""
        return self.jobs_redis if self.jobs_redis is not None else self.redis
