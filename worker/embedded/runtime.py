"""Finding the servers and connecting to them: ``DATABASE_URL`` / ``REDIS_URL``, else
what the ``engram up`` running on ``ENGRAM_HOME`` published in its run file
(``runfile``).

So ``engram worker``, ``engram enqueue`` and ``engram metrics`` started from
another shell find an ``up``'s embedded servers without any configuration.
``DATABASE_URL`` / ``REDIS_URL`` always win.
"""

from __future__ import annotations

import redis

from engram.store.errors import ConfigError
from engram.worker import cluster
from engram.worker.embedded import runfile
from engram.worker.settings import Settings


def redis_url(settings: Settings) -> str:
    return _required(settings, "redis_url", "REDIS_URL")


def database_url(settings: Settings) -> str:
    return _required(settings, "database_url", "DATABASE_URL")


def configured_or_published(settings: Settings, key: str) -> str | None:
    """The URL ``key`` (``database_url``, ``redis_url``) as configured, else as the
    ``engram up`` running on the home published it; None if neither."""
    configured: str | None = getattr(settings, key)
    if configured:
        return configured
    run = runfile.read_live(settings.home)
    return str(run[key]) if run and run.get(key) else None


def _required(settings: Settings, key: str, variable: str) -> str:
    url = configured_or_published(settings, key)
    if url is None:
        raise ConfigError(
            f"set {variable}, or start `engram up` with this ENGRAM_HOME "
            f"({settings.home.resolve()})"
        )
    return url


def connect_redis(url: str) -> redis.Redis:
    """A client for workers and producers: bytes in and out (entries may be any bytes).

    ``url`` names one server, or any node of a Redis Cluster (told by the server:
    then a ``redis.cluster.RedisCluster``), or several seeds of a cluster
    (``redis://user:pw@h1:p1,h2:p2/0``); a malformed one is a ``ConfigError``."""
    return cluster.open_client(
        url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30
    )
