"""The app factory: every route in one table, the layers around them, the errors.

``create_app(config, services)`` builds the dashboard and the JSON API on
services the caller made (a Store, a Redis client, a Producer): nothing
connects at import time, and the composition root (``engram web``) decides
what is served.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

import psycopg
import psycopg_pool
import redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from store.errors import EngramError, NotFoundError

from .api import operations as api_ops
from .api import pipeline as api_pipeline
from .api import reads as api_reads
from .api.openapi import openapi
from .auth import Authenticator
from .config import WebConfig
from .csrf import Csrf
from .endpoints import action_endpoint, form_endpoint, json_endpoint
from .errors import BadRequestError, MethodNotAllowedError, UnavailableError
from .middleware import AccessLog, Gate, SecurityHeaders, wants_json
from .render import Renderer
from .services import Services
from .state import WebState, web_of
from .views import audit, deadletters, generations, jobs, login, overview, receipts, records, scopes

log = logging.getLogger("engram.web")
STATIC = Path(__file__).parent / "static"


def routes() -> list[BaseRoute]:
    """Every route. Ids in paths may hold ``/``: they take the rest of the path, so a
    route with a suffix after an id comes before the route of the id alone."""
    return [
        # -- pages --
        Route("/", overview.overview, name="overview"),
        Route("/scopes", scopes.scope_list, name="scopes"),
        Route("/scopes/{scope_id}", scopes.scope_page, name="scope"),
        Route("/scopes/{scope_id}/recall", form_endpoint(scopes.recall), methods=["POST"]),
        Route("/records/{record_id:path}", records.record_page, name="record"),
        Route("/forget/{record_id:path}", records.forget_confirm, name="forget"),
        Route("/forget/{record_id:path}", form_endpoint(records.forget), methods=["POST"]),
        Route("/receipts", receipts.receipt_list, name="receipts"),
        Route("/receipts/{operation_id:path}", receipts.receipt_page, name="receipt"),
        Route("/operations/{operation_id:path}", receipts.operation_page, name="operation"),
        Route("/generations", generations.generation_list, name="generations"),
        Route("/generations/reembed", form_endpoint(generations.start_reembed), methods=["POST"]),
        Route("/dead-letters", deadletters.letter_list, name="dead_letters"),
        Route("/dead-letters/{letter_id}", deadletters.letter_page, name="dead_letter"),
        Route(
            "/dead-letters/{letter_id}/retry", form_endpoint(deadletters.retry), methods=["POST"]
        ),
        Route(
            "/dead-letters/{letter_id}/discard",
            form_endpoint(deadletters.discard),
            methods=["POST"],
        ),
        Route("/jobs", jobs.job_list, name="jobs"),
        Route("/jobs/{job_id}", jobs.job_page, name="job"),
        Route("/jobs/{job_id}/retry", form_endpoint(jobs.retry), methods=["POST"]),
        Route("/audit", audit.audit_page, name="audit"),
        Route("/login", login.login_page, name="login"),
        Route("/login", form_endpoint(login.login), methods=["POST"]),
        Route("/logout", form_endpoint(login.logout), methods=["POST"]),
        Route("/healthz", overview.healthz),
        Route("/metrics", overview.prometheus),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
        # -- the JSON API (described by /api/v1/openapi.json) --
        Route("/api/v1/openapi.json", openapi),
        Route("/api/v1/operations", json_endpoint(api_ops.enqueue), methods=["POST"]),
        Route("/api/v1/operations/{operation_id:path}", api_ops.operation),
        Route("/api/v1/receipts", api_ops.receipts),
        Route("/api/v1/receipts/{operation_id:path}", api_ops.receipt),
        Route("/api/v1/records/{record_id:path}", api_reads.record),
        Route("/api/v1/history/{record_id:path}", api_reads.history),
        Route("/api/v1/recall", json_endpoint(api_reads.recall), methods=["POST"]),
        Route("/api/v1/scopes", api_reads.scopes),
        Route("/api/v1/scopes/{scope_id}", api_reads.scope),
        Route("/api/v1/scopes/{scope_id}/records", api_reads.scope_records),
        Route("/api/v1/scopes/{scope_id}/tombstones", api_reads.scope_tombstones),
        Route("/api/v1/generations", api_reads.generations),
        Route("/api/v1/reembed", json_endpoint(api_pipeline.reembed), methods=["POST"]),
        Route("/api/v1/jobs", api_pipeline.job_list),
        Route("/api/v1/jobs/{job_id}", api_pipeline.job),
        Route(
            "/api/v1/jobs/{job_id}/retry", action_endpoint(api_pipeline.job_retry), methods=["POST"]
        ),
        Route("/api/v1/dead-letters", api_pipeline.dead_letter_list),
        Route(
            "/api/v1/dead-letters/{letter_id}",
            api_pipeline.dead_letter,
        ),
        Route(
            "/api/v1/dead-letters/{letter_id}",
            action_endpoint(api_pipeline.dead_letter_discard),
            methods=["DELETE"],
        ),
        Route(
            "/api/v1/dead-letters/{letter_id}/retry",
            action_endpoint(api_pipeline.dead_letter_retry),
            methods=["POST"],
        ),
        Route("/api/v1/audit", api_reads.audit),
    ]


def create_app(config: WebConfig, services: Services) -> Starlette:
    auth = Authenticator(config)
    csrf = Csrf(auth.keys.csrf)
    app = Starlette(
        routes=routes(),
        middleware=[
            Middleware(AccessLog),
            Middleware(SecurityHeaders),
            Middleware(Failsafe),
            Middleware(Gate, auth=auth, hosts=config.hosts),
        ],
        exception_handlers={EngramError: engram_error, HTTPException: http_error},
    )
    app.state.web = WebState(
        config=config,
        services=services,
        auth=auth,
        csrf=csrf,
        render=Renderer(csrf, needs_token=config.needs_token),
    )
    return app


def engram_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EngramError)
    return error_page(request, exc)


def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own: no such route (404), or not with that method (405)."""
    assert isinstance(exc, HTTPException)
    error: EngramError
    if exc.status_code == 405:
        error = MethodNotAllowedError(f"{request.method} is not allowed here")
    elif exc.status_code == 404:
        error = NotFoundError("no such page")
    elif exc.status_code < 500:
        error = BadRequestError(str(exc.detail))
    else:
        error = EngramError(str(exc.detail))
    response = error_page(request, error)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


def error_page(request: Request, exc: EngramError) -> Response:
    if wants_json(request.scope):
        return JSONResponse({"error": exc.to_dict()}, status_code=exc.status)
    return web_of(request).render.page(request, "error.html", status_code=exc.status, error=exc)


UNAVAILABLE = (psycopg.OperationalError, psycopg_pool.PoolTimeout, redis.ConnectionError)


class Failsafe:
    """The last word on an exception no view handled: a server that is down is a 503,
    anything else a 500. The log names its type and frames, never its message (a
    database error can quote the data)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            error = (
                UnavailableError("a server engram needs did not answer: try again shortly")
                if isinstance(exc, UNAVAILABLE)
                else EngramError("the server failed to answer; the error is in its log")
            )
            log.error(
                "request failed",
                extra={
                    "error": type(exc).__name__,
                    "where": "".join(traceback.format_tb(exc.__traceback__))[-2000:],
                },
            )
            body = {"error": error.to_dict()}
            if wants_json(scope):
                await JSONResponse(body, status_code=error.status)(scope, receive, send)
            else:
                await Response(
                    f"{error.status}: {error.message}\n", error.status, media_type="text/plain"
                )(scope, receive, send)
