"""The layers every request goes through, outermost first: the access log, the
security headers, the Host check, then the gate (who is asking, and may they).
Pure ASGI: no buffering of bodies, nothing per request but what each layer needs.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, MutableMapping
from typing import Any
from urllib.parse import quote

import psycopg
import psycopg_pool
import redis
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram.store.errors import EngramError
from engram.store.tokens import Tokens

from . import auth_refusals
from .auth import Authenticator, bearer, presented_token
from .auth_refusals import Reason, door_of, why_token_refused
from .csrf import check_same_origin
from .errors import (
    RetryLaterError,
    StatementTimeoutError,
    UnauthorizedError,
    UnavailableError,
)
from .oauth import InvalidTokenError, OAuthSettings, Verifier, challenge, looks_like_jwt
from .origins import Hosts

log = logging.getLogger("engram.web")
access_log = logging.getLogger("engram.web.access")

# No inline script or style anywhere: htmx is told not to inject its indicator style
# (htmx-config in base.html), charts are SVG with presentation attributes only.
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    )
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    # Not no-referrer: with it, browsers send "Origin: null" on this site's own form
    # posts, which the cross-site check could not tell from a sandboxed attacker's.
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "permissions-policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
}
# Paths anyone may fetch: the load balancer's probe, the login page and its assets.
PUBLIC_PREFIXES = ("/healthz", "/static/", "/login", "/.well-known/oauth-protected-resource")
# What a 401 answers with: how to authenticate (``web.oauth.challenge``).
REALM = "engram"


class HttpLayer:
    """An ASGI layer over HTTP requests; anything else (lifespan) passes through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


def on_start(send: Send, started: Callable[[Message], None]) -> Send:
    """``send``, calling ``started`` with the response's start (status, headers) first."""

    async def watched(message: Message) -> None:
        if message["type"] == "http.response.start":
            started(message)
        await send(message)

    return watched


class SecurityHeaders(HttpLayer):
    """The usual security headers on every response. Pages hold memory text: nothing
    but the static files may be cached, by the browser or anything in between."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        static = scope["path"].startswith("/static/")
        https = scope.get("scheme") == "https"

        def add_headers(message: Message) -> None:
            headers = MutableHeaders(scope=message)
            for name, value in SECURITY_HEADERS.items():
                headers[name] = value
            headers["cache-control"] = "public, max-age=3600" if static else "no-store"
            if https:
                headers["strict-transport-security"] = "max-age=31536000"

        await self.app(scope, receive, on_start(send, add_headers))


class AccessLog(HttpLayer):
    """One line per request: method, path, status, time, operator. Never the query
    string (it can hold a scope's values or search text) nor any body."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        response: list[Message] = []
        try:
            await self.app(scope, receive, on_start(send, response.append))
        finally:
            state: MutableMapping[str, Any] = scope.get("state", {})
            operator, grant = state.get("operator"), state.get("grant")
            access_log.info(
                "request",
                extra={
                    "method": scope["method"],
                    "path": quote(scope["path"])[:300],
                    "status": response[0]["status"] if response else 500,
                    "ms": round((time.perf_counter() - started) * 1000, 1),
                    "operator": operator.name
                    if operator is not None
                    else (grant.actor if grant is not None else None),
                },
            )


class Failsafe(HttpLayer):
    """The last word on an exception no view handled: a server that is down is a 503,
    anything else a 500. The log names its type and frames, never its message (a
    database error can quote the data). A statement cancelled past its bound is a 503
    ``statement_timeout`` (what the app's own handler answers for a view's)."""

    def __init__(self, app: ASGIApp, retry_after_s: int = 1) -> None:
        super().__init__(app)
        self.retry_after_s = retry_after_s

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started: list[Message] = []
        try:
            await self.app(scope, receive, on_start(send, started.append))
        except Exception as exc:
            if started:
                raise
            error = (
                statement_timeout(self.retry_after_s)
                if isinstance(exc, psycopg.errors.QueryCanceled)
                else UnavailableError("a server engram needs did not answer: try again shortly")
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
            await error_response(scope, error)(scope, receive, send)


UNAVAILABLE = (psycopg.OperationalError, psycopg_pool.PoolTimeout, redis.ConnectionError)


def statement_timeout(retry_after_s: int) -> StatementTimeoutError:
    """What a statement PostgreSQL cancelled (``QueryCanceled``) answers."""
    return StatementTimeoutError(
        "the database took too long to answer this request (ENGRAM_WEB_STATEMENT_TIMEOUT)"
        " and nothing of it was kept: try again shortly",
        retry_after_s=retry_after_s,
    )


class Gate(HttpLayer):
    """Who is asking (``Authenticator``), and refuse what they may not do: a Host this
    dashboard does not answer to (a DNS-rebinding page reaching a loopback dashboard),
    anything but the public paths without signing in (a page redirects to the login
    form, the API answers 401), and a change asked for by another site.

    A request presenting a scoped token (``egt_``) is that token's and no operator's:
    its grant is verified here (401 if it is made up, revoked or expired), and the
    routes decide what it may reach (``web.scoped``). On a dashboard served open
    (``WebConfig.open``), where a request without a token is the operator ``local``,
    that holds only while no scoped token is live: a live one makes every request
    without credentials a 401, so a token holder is never more by leaving it out.
    A bearer shaped like a JWT, when OAuth is configured (``web.oauth``), is an access
    token of the operator's authorization server: verified here the same way (401
    ``invalid_token`` if refused), it gives a grant as a scoped token does.
    Every refusal of credentials is logged and counted (``web.auth_refusals``)."""

    def __init__(
        self,
        app: ASGIApp,
        auth: Authenticator,
        hosts: tuple[str, ...],
        tokens: Tokens,
        redis_client: redis.Redis | None = None,
        oauth: Verifier | None = None,
    ) -> None:
        super().__init__(app)
        self.auth = auth
        self.tokens = tokens
        self.redis = redis_client
        self.hosts = Hosts(hosts)
        self.oauth = oauth

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        conn = HTTPConnection(scope)
        try:
            self.hosts.check(conn)
            check_same_origin(conn)
        except EngramError as exc:
            await self._answer(scope, receive, send, exc)
            return
        public = scope["path"].startswith(PUBLIC_PREFIXES)
        if presented_token(conn) is not None:
            await self._scoped(conn, scope, receive, send)
            return
        given = bearer(conn.headers.get("authorization"))
        if (
            self.oauth is not None
            and given
            and looks_like_jwt(given)
            and not self.auth.is_operator_token(given)
        ):
            await self._access_token(self.oauth, given, scope, receive, send)
            return
        operator = self.auth.identify(conn)
        if (
            operator is not None
            and operator.via == "local"
            and not public
            and await run_in_threadpool(self.tokens.any_live)
        ):
            await self._refuse(scope, receive, send, UnauthorizedError(OPEN_WITH_TOKENS), "missing")
            return
        if operator is None and not public:
            if wants_json(scope) or scope["method"] not in ("GET", "HEAD"):
                given = bearer(conn.headers.get("authorization"))
                reason: Reason = (
                    "missing" if given is None else "wrong_token" if given else "malformed"
                )
                await self._refuse(scope, receive, send, UnauthorizedError(SIGN_IN_FIRST), reason)
            else:
                path = quote(scope["path"], safe="/")
                await RedirectResponse(f"/login?next={path}", status_code=303)(scope, receive, send)
            return
        scope.setdefault("state", {})["operator"] = operator
        await self.app(scope, receive, send)

    async def _scoped(
        self, conn: HTTPConnection, scope: Scope, receive: Receive, send: Send
    ) -> None:
        state = scope.setdefault("state", {})
        state["operator"] = None  # never an operator, whatever else would apply
        if not scope["path"].startswith(PUBLIC_PREFIXES):
            secret = presented_token(conn)
            grant = await run_in_threadpool(self.tokens.verify, secret) if secret else None
            if grant is None:
                reason, name = await run_in_threadpool(why_token_refused, self.tokens, secret)
                error = InvalidTokenError("this token is unknown, revoked or expired")
                await self._refuse(scope, receive, send, error, reason, name)
                return
            state["grant"] = grant
        await self.app(scope, receive, send)

    async def _access_token(
        self, oauth: Verifier, token: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """An OAuth access token: verified (``Verifier.verify``), then served as a scoped
        token's request."""
        state = scope.setdefault("state", {})
        state["operator"] = None
        if not scope["path"].startswith(PUBLIC_PREFIXES):
            try:
                state["grant"] = await run_in_threadpool(oauth.verify, token)
            except InvalidTokenError as exc:
                await self._refuse(scope, receive, send, exc, "invalid_token")
                return
            except EngramError as exc:  # the issuer's keys cannot be had: 503
                await self._answer(scope, receive, send, exc)
                return
        await self.app(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, send: Send, exc: EngramError) -> None:
        oauth = self.oauth.settings if self.oauth is not None else None
        await error_response(scope, exc, oauth)(scope, receive, send)

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        error: EngramError,
        reason: Reason,
        token_name: str | None = None,
    ) -> None:
        path = scope["path"]
        await run_in_threadpool(
            auth_refusals.note,
            self.redis,
            door=door_of(path),
            reason=reason,
            path=path,
            token_name=token_name,
        )
        await self._answer(scope, receive, send, error)


SIGN_IN_FIRST = (
    "this dashboard needs its token: send Authorization: Bearer <token>, or sign in at /login"
)
OPEN_WITH_TOKENS = (
    "this dashboard is served open (ENGRAM_DASHBOARD_OPEN), but scoped tokens are live:"
    " while one is, a request without credentials is no one. Serve it with a token"
    " (unset ENGRAM_DASHBOARD_OPEN), or revoke the scoped tokens (engram tokens revoke)"
)


def wants_json(scope: Scope) -> bool:
    path: str = scope.get("path", "")
    return path.startswith("/api/") or path == "/metrics"


def error_response(scope: Scope, exc: EngramError, oauth: OAuthSettings | None = None) -> Response:
    """The error as JSON (the API) or a plain page (before the app could render one),
    with its ``WWW-Authenticate`` challenge (``web.oauth.challenge``) when it has one."""
    response: Response
    if wants_json(scope):
        response = JSONResponse({"error": exc.to_dict()}, status_code=exc.status)
    else:
        response = Response(f"{exc.status}: {exc.message}\n", exc.status, media_type="text/plain")
    answer = challenge(exc, oauth, realm=REALM)
    if answer is not None:
        response.headers["www-authenticate"] = answer
    if isinstance(exc, RetryLaterError):
        response.headers["retry-after"] = str(exc.retry_after_s)
    return response
