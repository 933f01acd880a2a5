"""The layers every request goes through, outermost first: the access log, the
security headers, the Host check, then the gate (who is asking, and may they).
Pure ASGI: no buffering of bodies, nothing per request but what each layer needs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import quote

from starlette.datastructures import MutableHeaders
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from store.errors import EngramError

from .auth import Authenticator
from .csrf import check_same_origin
from .errors import BadRequestError, UnauthorizedError

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
PUBLIC_PREFIXES = ("/healthz", "/static/", "/login")


class SecurityHeaders:
    """The usual security headers on every response. Pages hold memory text: nothing
    but the static files may be cached, by the browser or anything in between."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = scope["path"].startswith("/static/")
        https = scope.get("scheme") == "https"

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                headers["cache-control"] = "public, max-age=3600" if static else "no-store"
                if https:
                    headers["strict-transport-security"] = "max-age=31536000"
            await send(message)

        await self.app(scope, receive, send_with_headers)


class AccessLog:
    """One line per request: method, path, status, time, operator. Never the query
    string (it can hold a scope's values or search text) nor any body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            state: MutableMapping[str, Any] = scope.get("state", {})
            operator = state.get("operator")
            access_log.info(
                "request",
                extra={
                    "method": scope["method"],
                    "path": quote(scope["path"])[:300],
                    "status": status,
                    "ms": round((time.perf_counter() - started) * 1000, 1),
                    "operator": operator.name if operator is not None else None,
                },
            )


class Gate:
    """Who is asking (``Authenticator``), and refuse what they may not do: a Host this
    dashboard does not answer to (a DNS-rebinding page reaching a loopback dashboard),
    anything but the public paths without signing in (a page redirects to the login
    form, the API answers 401), and a change asked for by another site."""

    def __init__(self, app: ASGIApp, auth: Authenticator, hosts: tuple[str, ...]) -> None:
        self.app = app
        self.auth = auth
        self.hosts = None if "*" in hosts else {h.lower() for h in hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        try:
            self._check_host(conn)
            check_same_origin(conn)
        except EngramError as exc:
            await error_response(scope, exc)(scope, receive, send)
            return
        path = scope["path"]
        operator = self.auth.identify(conn)
        if operator is None and not path.startswith(PUBLIC_PREFIXES):
            await _sign_in_first(scope)(scope, receive, send)
            return
        scope.setdefault("state", {})["operator"] = operator
        await self.app(scope, receive, send)

    def _check_host(self, conn: HTTPConnection) -> None:
        if self.hosts is None:
            return
        host = conn.headers.get("host", "").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name not in self.hosts:
            raise BadRequestError(
                "this dashboard does not answer to that Host: see ENGRAM_DASHBOARD_HOSTS"
            )


def wants_json(scope: Scope) -> bool:
    path: str = scope.get("path", "")
    return path.startswith("/api/") or path == "/metrics"


def error_response(scope: Scope, exc: EngramError) -> Response:
    """The error as JSON (the API) or a plain page (before the app could render one)."""
    if wants_json(scope):
        return JSONResponse({"error": exc.to_dict()}, status_code=exc.status)
    return Response(f"{exc.status}: {exc.message}\n", exc.status, media_type="text/plain")


def _sign_in_first(scope: Scope) -> Response:
    if wants_json(scope) or scope["method"] not in ("GET", "HEAD"):
        response = error_response(
            scope,
            UnauthorizedError(
                "this dashboard needs its token: send Authorization: Bearer <token>, "
                "or sign in at /login"
            ),
        )
        response.headers["www-authenticate"] = 'Bearer realm="engram"'
        return response
    path = scope["path"]
    return RedirectResponse(f"/login?next={quote(path, safe='/')}", status_code=303)
