"""The overview (the pipeline at a glance, polled), the health probe and the metrics."""

from __future__ import annotations

import redis
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from engram.jobs.progress import progress_of
from engram.store import Store
from engram.store import backup as backups
from engram.worker import layout
from engram.worker.admin import metrics

from ..chart import DAY_COLUMN_S, bucketed, lag_rows, ops_chart
from ..params import Query
from ..pipeline import snapshot
from ..state import web_of
from . import pause

DAY_S = 86_400


def overview(request: Request) -> Response:
    Query.of(request)  # takes none
    web = web_of(request)
    config, services = web.config, web.services
    now_s = services.clock()
    pipeline = snapshot(
        services.redis,
        partitions=config.partitions,
        lease_ttl_ms=config.lease_ttl_ms,
        queues=config.job_queues,
        signer=services.store.cursors,
        jobs=services.jobs,
    )
    # The dashboard samples the lag (the workers count only what they did), so the
    # last day's lag covers the minutes some dashboard was open.
    metrics.record_lag(services.redis, pipeline.streams, now_s=now_s)
    # A day of minutes is 2,880 reads, and the vector counts scan a table: both at
    # most every 30 s; the generations themselves (a reembed's progress) every poll.
    minutes, samples = web.costly.get(
        "history",
        now_s,
        lambda: (
            metrics.minutes(services.redis, window_s=DAY_S, now_s=now_s),
            metrics.lag_samples(services.redis, window_s=DAY_S, now_s=now_s),
        ),
    )
    vectors = web.costly.get("vectors", now_s, lambda: vector_counts(services.store))
    current = [g for g in services.store.embeddings.all() if g.status in ("active", "pending")]
    paused = pause.state(request)
    return web.render.page(
        request,
        "overview.html",
        "_overview.html",
        pipeline=pipeline,
        chart=ops_chart(pipeline.intervals),
        day=ops_chart(bucketed(minutes), interval_s=DAY_COLUMN_S),
        lags=lag_rows(samples, {s.partition: s.lag for s in pipeline.streams}, now_s),
        generations=[(g, vectors.get(g.id), progress_of(g.progress)) for g in current],
        paused=paused,
        # Which workers have seen each pause: when it is in effect.
        seen=pause.seen(request, paused),
        # The epoch the workers serve: what a pause names (``worker.layout``).
        partition_count=layout.read(services.redis, config.partitions).serving.partitions,
        # Entries in a replaced epoch's streams, which no worker reads (names, counts).
        stranded=layout.stranded(services.redis, config.partitions),
        # The databases restores moved aside in the home: they hold forgotten texts.
        set_aside=web.costly.get(
            "set_aside",
            now_s,
            lambda: backups.set_aside_databases(config.home) if config.home else [],
        ),
        # WAL archiving failing: a restore cannot reach past the segment it is stuck on.
        archive=web.costly.get("archive", now_s, lambda: archiving(services.store)),
    )


def archiving(store: Store) -> backups.ArchiveStatus | None:
    """The database's WAL archiving, when it archives and answers within 2 s."""
    try:
        with store.pool.connection(timeout=2) as conn:
            return backups.archive_status(conn)
    except Exception:  # down, refusing, no rights: the page and the metrics go on
        return None


def vector_counts(store: Store) -> dict[int, int]:
    """How many vectors each of the newest generations holds (a count of the vectors)."""
    return {g.generation.id: g.vectors for g in store.browse.generations(limit=5).items}


def healthz(request: Request) -> Response:
    """200 when PostgreSQL and Redis answer; 503 (saying which did not) otherwise."""
    Query.of(request)  # takes none
    services = web_of(request).services
    checks = {"postgres": "ok", "redis": "ok"}
    try:
        with services.store.pool.connection(timeout=2) as conn:
            conn.execute("SELECT 1")
    except Exception:  # down, refusing, pool exhausted: whatever it is, not healthy
        checks["postgres"] = "unavailable"
    servers = {"redis": services.redis}
    if services.jobs_redis is not None:  # the jobs on a Redis of their own
        servers["jobs_redis"] = services.jobs_redis
    for name, client in servers.items():
        checks[name] = "ok"
        try:
            client.ping()
        except (redis.RedisError, redis.exceptions.RedisClusterException, OSError):
            checks[name] = "unavailable"
    healthy = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ok" if healthy else "unavailable", **checks}, 200 if healthy else 503
    )


def prometheus(request: Request) -> Response:
    """What ``engram metrics`` prints: the workers' counters and the live gauges."""
    Query.of(request)  # takes none
    web = web_of(request)
    text = metrics.render(
        web.services.redis,
        partitions=web.config.partitions,
        lease_ttl_ms=web.config.lease_ttl_ms,
        archiving=archiving(web.services.store),
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
