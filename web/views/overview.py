"""The overview (the pipeline at a glance, polled), the health probe and the metrics."""

from __future__ import annotations

import redis
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from worker import metrics

from ..chart import ops_chart
from ..params import Query
from ..pipeline import snapshot
from ..progress import progress_of
from ..state import web_of


def overview(request: Request) -> Response:
    Query.of(request)  # takes none
    web = web_of(request)
    config, services = web.config, web.services
    pipeline = snapshot(
        services.redis,
        partitions=config.partitions,
        lease_ttl_ms=config.lease_ttl_ms,
        queues=config.job_queues,
        signer=services.store.cursors,
    )
    generations = services.store.browse.generations(limit=5).items
    current = [g for g in generations if g.generation.status in ("active", "pending")]
    return web.render.page(
        request,
        "overview.html",
        "_overview.html",
        pipeline=pipeline,
        chart=ops_chart(pipeline.intervals),
        generations=[(g, progress_of(g.generation.progress)) for g in current],
    )


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
    try:
        services.redis.ping()
    except (redis.RedisError, OSError):
        checks["redis"] = "unavailable"
    healthy = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ok" if healthy else "unavailable", **checks}, 200 if healthy else 503
    )


def prometheus(request: Request) -> Response:
    """What ``engram metrics`` prints: the workers' counters and the live gauges."""
    Query.of(request)  # takes none
    web = web_of(request)
    text = metrics.render(
        web.services.redis, partitions=web.config.partitions, lease_ttl_ms=web.config.lease_ttl_ms
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
