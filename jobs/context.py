"""What a job function works with, set up once by the process that runs the jobs.

RQ calls job functions by their dotted path with the job's arguments only (ids,
never connections). The jobs worker installs one ``JobContext`` at start (its
store pool, its Redis clients, its embedder registry, its settings), and the job
functions read it with ``current()``. Nothing connects at import time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import redis

from engram.store import Store
from engram.store.vectors.registry import EmbedderRegistry
from engram.worker.settings import WorkerConfig

from .settings import JobsSettings


@dataclass(frozen=True, slots=True)
class JobContext:
    store: Store
    # The jobs' Redis: RQ's queues, the inbox, the leases (one server, never a cluster).
    client: redis.Redis
    registry: EmbedderRegistry
    settings: JobsSettings
    # The stream workers' settings: their partitions (to find a scope's stream) and
    # how long their replies live.
    streams: WorkerConfig = field(default_factory=WorkerConfig)
    # Set when the worker was asked to stop: a long job ends its slice early.
    stopping: threading.Event = field(default_factory=threading.Event)
    # The streams' Redis (``REDIS_URL``, maybe a cluster), where the redaction erases
    # forgotten text and updates replies; None: the same as ``client``.
    streams_redis: redis.Redis | None = None

    @property
    def streams_client(self) -> redis.Redis:
        return self.streams_redis if self.streams_redis is not None else self.client

    @property
    def partitions(self) -> int:
        return self.streams.partitions

    @property
    def reply_ttl_s(self) -> int:
        return self.streams.reply_ttl_s


_current: JobContext | None = None


def install(context: JobContext) -> None:
    global _current
    _current = context


def current() -> JobContext:
    if _current is None:
        raise RuntimeError("no JobContext installed: run jobs with `engram jobs`")
    return _current
