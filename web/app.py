"""The app factory: every route in one table, the layers around them, the errors.

``create_app(config, services)`` builds the dashboard and the JSON API on
services the caller made (a Store, a Redis client, a Producer): nothing
connects at import time, and the composition root (``engram web``) decides
what is served.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import psycopg
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from engram.store.errors import EngramError, NotFoundError
from engram.store.read.cursors import InvalidCursorError

from .api import operations as api_ops
from .api import pause as api_pause
from .api import pipeline as api_pipeline
from .api import reads as api_reads
from .api.openapi import openapi
from .auth import Authenticator
from .config import WebConfig
from .csrf import Csrf
from .endpoints import form_endpoint, json_endpoint
from .errors import (
    BadRequestError,
    MethodNotAllowedError,
    RetryLaterError,
)
from .middleware import (
    REALM,
    AccessLog,
    Failsafe,
    Gate,
    SecurityHeaders,
    statement_timeout,
    wants_json,
)
from .oauth import Verifier, challenge
from .ratelimit import Limiter
from .render import Renderer
from .scoped import for_tokens, refuse_unless_marked
from .services import Services
from .state import WebState, web_of
from .views import (
    audit,
    deadletters,
    find,
    generations,
    jobs,
    login,
    overview,
    pause,
    receipts,
    records,
    scopes,
    tokens,
)

STATIC = Path(__file__).parent / "static"


class IdConvertor(Convertor[str]):
    """An id in a path: the rest of it, ``/`` and line breaks included (ids may hold any
    character but NUL; they arrive percent-encoded)."""

    regex = "(?s:.+)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("id", IdConvertor())

View = Callable[[Request], Any]


def route(path: str, **by_method: View) -> Route:
    """One route per path, whatever its methods, so a 405 names all of them (``Allow``).
    A view may be a plain function (run on a thread) or an endpoint coroutine."""
    views = {method.upper(): view for method, view in by_method.items()}

    async def endpoint(request: Request) -> Any:
        view = views[request.method if request.method != "HEAD" else "GET"]
        refuse_unless_marked(request, view)
        if inspect.iscoroutinefunction(view):
            return await view(request)
        return await run_in_threadpool(view, request)

    return Route(path, endpoint, methods=list(views))


def routes() -> list[BaseRoute]:
    """Every route. An id takes the rest of the path (it may hold ``/``), so a route
    with something after an id is written before the route of the id alone."""
    return [
        # -- pages --
        route("/", get=overview.overview),
        route("/find", get=find.find_page),
        route("/scopes", get=scopes.scope_list),
        route("/scopes/{scope_id}", get=scopes.scope_page),
        route("/scopes/{scope_id}/recall", post=form_endpoint(scopes.recall)),
        route("/records/{record_id:id}", get=records.record_page),
        route(
            "/forget/{record_id:id}",
            get=records.forget_confirm,
            post=form_endpoint(records.forget),
        ),
        route("/receipts", get=receipts.receipt_list),
        route("/receipts/{operation_id:id}", get=receipts.receipt_page),
        route("/operations/{operation_id:id}", get=receipts.operation_page),
        route("/generations", get=generations.generation_list),
        route("/generations/reembed", post=form_endpoint(generations.start_reembed)),
        route(
            "/generations/{generation_id}/cancel",
            get=generations.cancel_confirm,
            post=form_endpoint(generations.cancel),
        ),
        route("/dead-letters", get=deadletters.letter_list),
        route(
            "/dead-letters/bulk",
            get=deadletters.bulk_page,
            post=form_endpoint(deadletters.bulk),
        ),
        route("/dead-letters/{letter_id}", get=deadletters.letter_page),
        route("/dead-letters/{letter_id}/retry", post=form_endpoint(deadletters.retry)),
        route(
            "/dead-letters/{letter_id}/discard",
            get=deadletters.confirm_discard,
            post=form_endpoint(deadletters.discard),
        ),
        route("/jobs", get=jobs.job_list),
        route("/jobs/bulk", get=jobs.bulk_page, post=form_endpoint(jobs.bulk)),
        route("/jobs/{job_id}", get=jobs.job_page),
        route("/jobs/{job_id}/retry", post=form_endpoint(jobs.retry)),
        route("/jobs/{job_id}/discard", get=jobs.confirm_discard, post=form_endpoint(jobs.discard)),
        route("/audit", get=audit.audit_page),
        route("/tokens", get=tokens.token_list, post=form_endpoint(tokens.create)),
        route(
            "/tokens/{name:id}/revoke",
            get=tokens.token_page,  # the page holds the confirmation
            post=form_endpoint(tokens.revoke),
        ),
        route("/tokens/{name:id}", get=tokens.token_page),
        route("/pause/partition", post=form_endpoint(pause.pause_partition_form)),
        route("/resume/partition/{partition}", post=form_endpoint(pause.resume_partition_form)),
        route("/pause/jobs", post=form_endpoint(pause.pause_jobs_form)),
        route("/resume/jobs", post=form_endpoint(pause.resume_jobs_form)),
        route("/login", get=login.login_page, post=form_endpoint(login.login)),
        route("/logout", post=form_endpoint(login.logout)),
        route("/healthz", get=overview.healthz),
        # The OAuth Protected Resource Metadata (RFC 9728), when OAuth is configured.
        route(METADATA_ROUTE, get=for_tokens(protected_resource)),
        route("/metrics", get=overview.prometheus),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
        # -- the JSON API (described by /api/v1/openapi.json) --
        # A scoped token reaches the views marked ``for_tokens`` (on its own scope, with
        # its capabilities: web.scoped); every other route refuses it.
        route("/api/v1/openapi.json", get=for_tokens(openapi)),
        route("/api/v1/operations", post=for_tokens(api_ops.enqueue)),  # waits async
        route("/api/v1/operations/{operation_id:id}", get=for_tokens(api_ops.operation)),
        route("/api/v1/receipts", get=api_ops.receipts),
        route("/api/v1/receipts/{operation_id:id}", get=for_tokens(api_ops.receipt)),
        route("/api/v1/records/{record_id:id}", get=for_tokens(api_reads.record)),
        route("/api/v1/history/{record_id:id}", get=for_tokens(api_reads.history)),
        route("/api/v1/recall", post=for_tokens(json_endpoint(api_reads.recall))),
        route("/api/v1/find", get=api_reads.find),
        route("/api/v1/scopes", get=api_reads.scopes),
        route("/api/v1/scopes/{scope_id}", get=api_reads.scope),
        route("/api/v1/scopes/{scope_id}/records", get=api_reads.scope_records),
        route("/api/v1/scopes/{scope_id}/tombstones", get=api_reads.scope_tombstones),
        route("/api/v1/generations", get=api_reads.generations),
        route(
            "/api/v1/generations/{generation_id}/cancel",
            post=api_pipeline.reasoned(api_pipeline.generation_cancel),
        ),
        route("/api/v1/reembed", post=json_endpoint(api_pipeline.reembed)),
        route("/api/v1/jobs", get=api_pipeline.job_list),
        # Before the job ids: these two are not jobs.
        route("/api/v1/queues/pause", post=api_pause.with_reason(api_pause.jobs_pause)),
        route("/api/v1/queues/resume", post=api_pause.with_reason(api_pause.jobs_resume)),
        route("/api/v1/jobs/{job_id}", get=api_pipeline.job),
        route("/api/v1/bulk/jobs", post=json_endpoint(api_pipeline.job_bulk)),
        route("/api/v1/jobs/{job_id}/retry", post=api_pipeline.reasoned(api_pipeline.job_retry)),
        route(
            "/api/v1/jobs/{job_id}/discard", post=api_pipeline.reasoned(api_pipeline.job_discard)
        ),
        route("/api/v1/dead-letters", get=api_pipeline.dead_letter_list),
        route("/api/v1/bulk/dead-letters", post=json_endpoint(api_pipeline.dead_letter_bulk)),
        route(
            "/api/v1/dead-letters/{letter_id}",
            get=api_pipeline.dead_letter,
            delete=api_pipeline.reasoned(api_pipeline.dead_letter_discard),
        ),
        route(
            "/api/v1/dead-letters/{letter_id}/retry",
            post=api_pipeline.reasoned(api_pipeline.dead_letter_retry),
        ),
        route("/api/v1/audit", get=api_reads.audit),
        route("/api/v1/paused", get=api_pause.paused),
        route(
            "/api/v1/partitions/{partition}/pause",
            post=api_pause.with_reason(api_pause.partition_pause),
        ),
        route(
            "/api/v1/partitions/{partition}/resume",
            post=api_pause.with_reason(api_pause.partition_resume),
        ),
    ]


METADATA_ROUTE = "/.well-known/oauth-protected-resource{rest:path}"


async def protected_resource(request: Request) -> Response:
    """What a client following the MCP authorization spec reads first: this resource,
    the authorization server whose tokens it takes, and the scopes (RFC 9728). Served
    at the paths ``OAuthSettings.metadata_paths`` names only, and only when OAuth is
    configured: otherwise it is no page, as for any path this server does not serve."""
    settings = web_of(request).config.oauth
    if settings is None or request.url.path not in settings.metadata_paths:
        raise NotFoundError("no such page")
    # Public, and read by browser-based clients of other origins.
    return JSONResponse(settings.metadata(), headers={"access-control-allow-origin": "*"})


def create_app(config: WebConfig, services: Services) -> Starlette:
    auth = Authenticator(config)
    csrf = Csrf(auth.keys.csrf)
    oauth = Verifier(config.oauth, services.store.tokens) if config.oauth is not None else None
    app = Starlette(
        routes=routes(),
        middleware=[
            Middleware(AccessLog),
            Middleware(SecurityHeaders),
            Middleware(Failsafe, retry_after_s=config.retry_after_s),
            Middleware(
                Gate,
                auth=auth,
                hosts=config.hosts,
                tokens=services.store.tokens,
                redis_client=services.redis,
                oauth=oauth,
            ),
        ],
        exception_handlers={
            EngramError: engram_error,
            HTTPException: http_error,
            psycopg.errors.QueryCanceled: query_canceled,
        },
    )
    app.state.web = WebState(
        config=config,
        services=services,
        auth=auth,
        csrf=csrf,
        render=Renderer(csrf, needs_token=config.needs_token),
        limiter=Limiter(services.redis, config.rate_limits),
        oauth=oauth,
    )
    return app


def engram_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EngramError)
    return error_page(request, exc)


def query_canceled(request: Request, exc: Exception) -> Response:
    """A statement PostgreSQL cancelled, past the bound every page's statements have
    (``WebConfig.statement_timeout_s``): 503 ``statement_timeout`` with Retry-After."""
    return error_page(request, statement_timeout(web_of(request).config.retry_after_s))


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


def back_of(request: Request) -> str | None:
    """The page of this site the refused request came from (its form, its link): where
    an error page sends the operator back to, the form's filter in its query kept."""
    referer = urlsplit(request.headers.get("referer", ""))
    if (referer.scheme, referer.netloc) != (request.url.scheme, request.url.netloc):
        return None
    back = referer.path + (f"?{referer.query}" if referer.query else "")
    same_site = back.startswith("/") and back[1:2] not in ("/", "\\")  # not //elsewhere
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return back if same_site and back != here else None


def list_start(request: Request, exc: EngramError) -> str | None:
    """A list's first page, with its filters, when a page's cursor is not one this server
    signs (a link from before a restart of a dashboard without a token, or tampered):
    the list has moved on, and this is where it starts."""
    if not isinstance(exc, InvalidCursorError) or "cursor" not in request.query_params:
        return None
    kept = [(k, v) for k, v in request.query_params.multi_items() if k != "cursor"]
    return request.url.path + (f"?{urlencode(kept)}" if kept else "")


def error_page(request: Request, exc: EngramError) -> Response:
    response: Response
    if wants_json(request.scope):
        response = JSONResponse({"error": exc.to_dict()}, status_code=exc.status)
    else:
        response = web_of(request).render.page(
            request,
            "error.html",
            status_code=exc.status,
            error=exc,
            back=back_of(request),
            start=list_start(request, exc),
        )
    if isinstance(exc, RetryLaterError):
        response.headers["retry-after"] = str(exc.retry_after_s)
    answer = challenge(exc, web_of(request).config.oauth, realm=REALM)
    if answer is not None:
        response.headers["www-authenticate"] = answer
    return response
