"""MCP over streamable HTTP at ``/mcp``, beside the dashboard on its server.

Every request needs a live scoped token (``Authorization: Bearer egt_...``, checked
with ``Tokens.verify`` on each request, on loopback too): none, an unknown one, a
revoked or an expired one is a 401 before anything is read. The token alone decides
the scope. The dashboard's operator token is not one (it has no scope). A session
belongs to the token that opened it (the SDK refuses it to another), and each tool
call reads the grant verified for the very request that carries it, so a token
revoked mid-session is refused at its next request.

``Doors`` puts the two apps on one ASGI server: ``/mcp`` to the MCP endpoint,
everything else to the dashboard, and the lifespan runs the SDK's session manager
(its task group must outlive every request).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio.to_thread
import redis
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import ASGIApp, Receive, Scope, Send

from engram.store import Grant, Tokens
from engram.web import auth_refusals
from engram.web.errors import UnauthorizedError

from .memory import Access, Memory
from .server import Tools

log = logging.getLogger("engram.mcp")

PATH = "/mcp"
GRANT = "engram.grant"  # where a verified request's grant waits in the ASGI scope's state
SESSION_HEADER = "mcp-session-id"


def grant_of(ctx: ServerRequestContext[Any, Any]) -> Access:
    """The caller of one tool call: the grant verified for the HTTP request carrying it,
    bound to that request's MCP session."""
    request = ctx.request
    grant = request.scope.get("state", {}).get(GRANT) if request is not None else None
    if request is None or not isinstance(grant, Grant):
        raise UnauthorizedError("this request carries no verified token")
    # Checked by the session manager already: the session this token opened.
    return Access.of_grant(grant, request.headers.get(SESSION_HEADER) or "")


class Endpoint:
    """``/mcp``: the token checked, then the SDK's session manager. A refusal is logged
    at WARNING and counted (``web.auth_refusals``)."""

    def __init__(
        self,
        manager: StreamableHTTPSessionManager,
        tokens: Tokens,
        redis_client: redis.Redis | None = None,
    ) -> None:
        self.manager = manager
        self.tokens = tokens
        self.redis = redis_client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        secret = _bearer(scope)
        grant = await anyio.to_thread.run_sync(self.tokens.verify, secret) if secret else None
        if grant is None:
            await anyio.to_thread.run_sync(self._note_refusal, secret, scope["path"])
            await _unauthorized(send)
            return
        # The SDK binds a session to the principal that opened it: the token, by id.
        scope["user"] = AuthenticatedUser(
            AccessToken(
                token=f"engram-token-{grant.token_id}",  # never the secret
                client_id=grant.name,
                scopes=sorted(grant.can),
                subject=str(grant.token_id),
            )
        )
        scope.setdefault("state", {})[GRANT] = grant
        await self.manager.handle_request(scope, receive, send)

    def _note_refusal(self, secret: str | None, path: str) -> None:
        reason, name = auth_refusals.why_token_refused(self.tokens, secret)
        auth_refusals.note(self.redis, door="mcp", reason=reason, path=path, token_name=name)


class Doors:
    """The dashboard and ``/mcp`` on one server; the lifespan runs the session manager."""

    def __init__(self, web: ASGIApp, endpoint: Endpoint) -> None:
        self.web = web
        self.endpoint = endpoint

    @property
    def state(self) -> Any:
        """The dashboard's ``app.state`` (its services), as on the dashboard alone."""
        return getattr(self.web, "state")  # noqa: B009 (an ASGIApp has no typed state)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and scope["path"] in (PATH, PATH + "/"):
            await self.endpoint(scope, receive, send)
        else:
            await self.web(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        started = False
        try:
            async with self.endpoint.manager.run():
                await send({"type": "lifespan.startup.complete"})
                started = True
                while (await receive())["type"] != "lifespan.shutdown":
                    pass
        except Exception as exc:
            if not started:
                await send({"type": "lifespan.startup.failed", "message": type(exc).__name__})
            raise
        await send({"type": "lifespan.shutdown.complete"})


def mount(web: ASGIApp, memory: Memory, *, model: bool) -> Doors:
    """The dashboard with ``/mcp`` beside it, on ``memory``'s services."""
    tools = Tools(memory, grant_of, model=model)
    manager = StreamableHTTPSessionManager(
        app=tools.server(),
        # Plain JSON answers (no event stream): any HTTP client can read them.
        json_response=True,
    )
    return Doors(web, Endpoint(manager, memory.store.tokens, memory.producer.client))


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text = value.decode("latin-1")
            kind, _, secret = text.partition(" ")
            return secret.strip() if kind.lower() == "bearer" and secret.strip() else None
    return None


async def _unauthorized(send: Send) -> None:
    error = UnauthorizedError(
        "/mcp needs a live scoped token: Authorization: Bearer egt_... (docs/agents.md)"
    )
    body = json.dumps({"error": error.to_dict()}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer realm="engram mcp"'),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
