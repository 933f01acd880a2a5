"""Where the jobs live: the one Redis server RQ's queues, schedule, results and
suspension (the pause of the jobs), and the jobs' own keys (the forget inbox, the
re-embedding lease), are kept on.

RQ cannot run on a Redis Cluster (rq/rq#1048: its pipelines name keys of several
slots, ``CROSSSLOT``). So ``ENGRAM_JOBS_REDIS_URL`` names one server for them; left
unset, the jobs share ``REDIS_URL``'s server, unless that is a cluster: then every
command that needs the jobs refuses to start and says what to set. ``engram up``
sets it for its children (its embedded valkey, for a cluster), and publishes it in
its run file, where the commands of the same home find it.

The streams (and what the jobs erase from them, the replies they update) stay on
``REDIS_URL``: a job that touches both gets both clients (``JobContext``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from engram.jobs import redaction
from engram.jobs.settings import JobsSettings
from engram.store.errors import ConfigError
from engram.worker import cluster
from engram.worker.consuming.partition import ForgetHook
from engram.worker.embedded import runfile, runtime
from engram.worker.settings import Settings

log = logging.getLogger(__name__)

NEEDED = (
    "REDIS_URL names a Redis Cluster, which the jobs (RQ) cannot use: set "
    "ENGRAM_JOBS_REDIS_URL to one Redis or valkey server (not a cluster) for the jobs' "
    "queues, schedule and inbox (`engram up` starts one itself)"
)
NOT_A_CLUSTER = (
    "ENGRAM_JOBS_REDIS_URL names a Redis Cluster, which the jobs (RQ) cannot use: "
    "name one Redis or valkey server"
)


def jobs_url(settings: Settings) -> str:
    """``ENGRAM_JOBS_REDIS_URL``; else what the ``engram up`` of this home published
    for the streams in use; else the streams' own URL (which may be a cluster's: the
    caller finds out when it connects)."""
    if settings.jobs_redis_url:
        return settings.jobs_redis_url
    streams_url = runtime.redis_url(settings)
    run = runfile.read_live(settings.home)
    if run and run.get("jobs_redis_url") and run.get("redis_url") == streams_url:
        return str(run["jobs_redis_url"])
    return streams_url


def connect(settings: Settings) -> redis.Redis:
    """A client of the jobs' Redis (bytes in and out); ``ConfigError`` if it is a
    cluster: for ``REDIS_URL``'s, saying to set ``ENGRAM_JOBS_REDIS_URL``."""
    client = runtime.connect_redis(jobs_url(settings))
    if cluster.is_cluster(client):
        client.close()
        raise ConfigError(NOT_A_CLUSTER if settings.jobs_redis_url else NEEDED)
    return client


@contextmanager
def opened(settings: Settings) -> Iterator[redis.Redis]:
    client = connect(settings)
    try:
        yield client
    finally:
        client.close()


def forget_hook(settings: Settings, streams: redis.Redis) -> ForgetHook | None:
    """How a stream worker on ``streams`` hands its committed forgets to the jobs: in
    the pipeline of its replies when the jobs share its server, else on the jobs'
    own Redis. None when no listener is set, or when the streams are a cluster and no
    jobs Redis is named: then the worker still runs, and says so; the jobs' sweeper
    hands those forgets over once jobs run (they stay ``pending`` until then)."""
    if not JobsSettings.from_env().redaction.listeners:
        return None
    url = jobs_url(settings)
    if url == runtime.redis_url(settings):
        if cluster.is_cluster(streams):
            log.warning(
                "forgets are not handed to the jobs: REDIS_URL is a cluster and "
                "ENGRAM_JOBS_REDIS_URL is not set; their redaction waits until it is"
            )
            return None
        return redaction.hand_over
    return redaction.hand_over_to(connect(settings))
