"""MCP over streamable HTTP at ``/mcp``, beside the dashboard on its server.

Every request needs a live scoped token (``Authorization: Bearer egt_...``, checked
with ``Tokens.verify`` on each request, on loopback too) or, when OAuth is configured
(``web.oauth``), an access token of the operator's authorization server: none, an
unknown one, a revoked, expired or otherwise refused one is a 401 before anything is
read, with the ``WWW-Authenticate`` challenge that says where this resource's metadata
is; an access token granting no capability at all is a 403 ``insufficient_scope``,
and so is its ``tools/call`` of a tool it has no capability for (an ``egt_``
token's is the ``forbidden`` tool error, as before). The token alone decides the
scope.

A refusal's body is a JSON-RPC error (code ``REFUSED``, engram's error and the HTTP
status in its ``data``), so an MCP client shows it as what it is (the Python SDK raises
``MCPError`` with it) rather than as a server failure.

The dashboard's operator token is not one (it has no scope). A session belongs to
the token that opened it (the SDK refuses it to another), and each tool call reads
the grant verified for the very request that carries it, so a token
revoked mid-session is refused at its next request.

Before the token, the Host and the Origin are checked as the dashboard's are
(``web.origins``, against DNS rebinding): a Host the server does not answer to is a
400, an Origin of another site a 403. A token holds at most
``ENGRAM_MCP_SESSIONS_PER_TOKEN`` sessions open at once (past it, its ``initialize``
is a 429 ``too_many_sessions``, and no other token's is touched), and a session idle
for ``ENGRAM_MCP_SESSION_IDLE`` is closed and its memory freed (the SDK reaps it).

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
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, AuthorizationContext
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram.store import Grant, Tokens
from engram.store.errors import EngramError, InvalidRequestError
from engram.store.limits import MAX_ID_CHARS
from engram.store.tokens import CAPABILITIES, TOKEN_PREFIX
from engram.web import auth_refusals
from engram.web.errors import UnauthorizedError
from engram.web.oauth import (
    InsufficientScopeError,
    InvalidTokenError,
    OAuthSettings,
    Verifier,
    challenge,
    looks_like_jwt,
)
from engram.web.origins import Hosts, check_origin
from engram.web.ratelimit import Limiter
from engram.web.scoped import refusal

from .memory import Access, Memory
from .server import Tools
from .settings import McpSettings

log = logging.getLogger("engram.mcp")

PATH = "/mcp"
GRANT = "engram.grant"  # where a verified request's grant waits in the ASGI scope's state
SESSION_HEADER = "mcp-session-id"
# The id a client names itself by, so its derived operation ids are its own (opids).
CLIENT_HEADER = "engram-client-id"
# The JSON-RPC error code of a request refused before it reached the MCP server (its
# credentials, its Host or Origin, a session cap): the HTTP status and engram's error
# are in the error's ``data``.
REFUSED = -32040
REALM = "engram mcp"


def grant_of(ctx: ServerRequestContext[Any, Any]) -> Access:
    """The caller of one tool call: the grant verified for the HTTP request carrying it,
    bound to that request's MCP session."""
    request = ctx.request
    grant = request.scope.get("state", {}).get(GRANT) if request is not None else None
    if request is None or not isinstance(grant, Grant):
        raise UnauthorizedError("this request carries no verified token")
    # Checked by the session manager already: the session this token opened.
    return Access.of_grant(
        grant, request.headers.get(SESSION_HEADER), client_id(request.headers.get(CLIENT_HEADER))
    )


def client_id(value: str | None) -> str | None:
    """The id a client names itself by (``Engram-Client-Id``): 1 to 200 printable
    characters, or a refusal; none, None."""
    if value is None:
        return None
    if not 0 < len(value) <= MAX_ID_CHARS or not value.isprintable():
        raise InvalidRequestError(
            f"{CLIENT_HEADER} is 1 to {MAX_ID_CHARS} printable characters: the id this"
            " client names itself by"
        )
    return value


class TooManySessionsError(EngramError):
    """A token already holds as many MCP sessions as it may (ENGRAM_MCP_SESSIONS_PER_TOKEN)."""

    code = "too_many_sessions"
    status = 429


class Sessions(StreamableHTTPSessionManager):
    """The SDK's session manager with a cap per token. The SDK admits a session under
    its lock and keeps each session's owner (the token, by id, as ``subject``) until the
    session ends, however it ends (DELETE, idle, crash): counted there, concurrent
    ``initialize`` requests of one token cannot pass the cap, and a closed session
    frees its place."""

    def __init__(self, app: Any, *, per_token: int, idle_s: float, max_sessions: int) -> None:
        super().__init__(
            app,
            # Plain JSON answers (no event stream): any HTTP client can read them.
            json_response=True,
            session_idle_timeout=idle_s,
            max_sessions=max_sessions,
        )
        self.per_token = per_token

    def held_by(self, subject: str | None) -> int:
        """How many open sessions the token ``subject`` holds."""
        return sum(1 for owner in self._session_owners.values() if owner["subject"] == subject)

    def _admit_session(
        self, requestor: AuthorizationContext | None
    ) -> StreamableHTTPServerTransport | None:
        if requestor is not None and self.held_by(requestor["subject"]) >= self.per_token:
            raise TooManySessionsError(
                f"this token holds {self.per_token} open MCP sessions, as many as it may"
                " (ENGRAM_MCP_SESSIONS_PER_TOKEN): end one (DELETE /mcp with its"
                " Mcp-Session-Id) or wait for an idle one to close"
                f" (ENGRAM_MCP_SESSION_IDLE, {self.session_idle_timeout:g} s)"
            )
        return super()._admit_session(requestor)


class Endpoint:
    """``/mcp``: the Host, the Origin and the token checked, then the SDK's session
    manager. A refused token is logged at WARNING and counted (``web.auth_refusals``)."""

    def __init__(
        self,
        manager: Sessions,
        tokens: Tokens,
        hosts: Hosts,
        redis_client: redis.Redis | None = None,
        oauth: Verifier | None = None,
    ) -> None:
        self.manager = manager
        self.tokens = tokens
        self.hosts = hosts
        self.redis = redis_client
        self.oauth = oauth

    @property
    def oauth_settings(self) -> OAuthSettings | None:
        return self.oauth.settings if self.oauth is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        conn = HTTPConnection(scope)
        try:
            self.hosts.check(conn)
            check_origin(conn)
        except EngramError as exc:
            log.warning(
                "mcp request refused: its Host or Origin",
                extra={"status": exc.status, "code": exc.code},
            )
            await self._refuse(send, exc)
            return
        secret = _bearer(scope)
        grant: Grant | None
        if (
            self.oauth is not None
            and secret
            and not secret.startswith(TOKEN_PREFIX)
            and looks_like_jwt(secret)
        ):
            try:
                grant = await anyio.to_thread.run_sync(self.oauth.verify, secret)
            except InvalidTokenError as exc:
                await anyio.to_thread.run_sync(self._note_oauth_refusal, scope["path"])
                await self._refuse(send, exc)
                return
            except EngramError as exc:  # the issuer's keys cannot be had: 503
                await self._refuse(send, exc)
                return
            if grant is None or not grant.can:
                await self._refuse(send, NO_CAPABILITY)
                return
        else:
            grant = await anyio.to_thread.run_sync(self.tokens.verify, secret) if secret else None
            if grant is None:
                await anyio.to_thread.run_sync(self._note_refusal, secret, scope["path"])
                await self._refuse(send, UNAUTHORIZED if secret is None else INVALID_TOKEN)
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
        if grant.via == "oauth" and scope["method"] == "POST":
            receive, missing = await _peek_tool(scope, receive)
            if missing is not None and missing in CAPABILITIES and not grant.allows(missing):
                await self._refuse(
                    send,
                    InsufficientScopeError(refusal(grant, missing), capability=missing),
                )
                return
        try:
            await self.manager.handle_request(scope, receive, send)
        except TooManySessionsError as exc:  # raised before anything was sent
            log.warning("mcp session refused: too many", extra={"status": exc.status})
            await self._refuse(send, exc)

    def _note_refusal(self, secret: str | None, path: str) -> None:
        reason, name = auth_refusals.why_token_refused(self.tokens, secret)
        auth_refusals.note(self.redis, door="mcp", reason=reason, path=path, token_name=name)

    def _note_oauth_refusal(self, path: str) -> None:
        auth_refusals.note(self.redis, door="mcp", reason="invalid_token", path=path)

    async def _refuse(self, send: Send, error: EngramError) -> None:
        """Answer ``error`` before the MCP server: its HTTP status, its challenge, and a
        JSON-RPC error body an MCP client reads as it is."""
        data = {**error.to_dict(), "status": error.status}
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": None,
                "error": {
                    "code": REFUSED,
                    "message": f"{error.code}: {error.message}",
                    "data": data,
                },
            }
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        answer = challenge(error, self.oauth_settings, realm=REALM)
        if answer is not None:
            headers.append((b"www-authenticate", answer.encode()))
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


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


def mount(
    web: ASGIApp,
    memory: Memory,
    settings: McpSettings,
    *,
    model: bool,
    hosts: Hosts,
    limiter: Limiter,
    oauth: Verifier | None = None,
) -> Doors:
    """The dashboard with ``/mcp`` beside it, on ``memory``'s services, answering the
    dashboard's Host names and counting against its rate limits."""
    tools = Tools(memory, grant_of, model=model, limiter=limiter)
    manager = Sessions(
        tools.server(),
        per_token=settings.sessions_per_token,
        idle_s=settings.session_idle_s,
        max_sessions=settings.max_sessions,
    )
    return Doors(web, Endpoint(manager, memory.store.tokens, hosts, memory.producer.client, oauth))


# The largest request body read ahead of the SDK to see which tool it calls: a tool
# call of an OAuth token is a few kilobytes; a larger one goes on unread (its tool
# then answers a capability it lacks with the ``forbidden`` tool error).
PEEK_BYTES = 1024 * 1024


async def _peek_tool(scope: Scope, receive: Receive) -> tuple[Receive, str | None]:
    """The tool a ``tools/call`` request calls (None for any other request), and a
    ``receive`` that hands the SDK the body again, as it came."""
    length = dict(scope.get("headers", ())).get(b"content-length", b"")
    if not length.isdigit() or int(length) > PEEK_BYTES:
        return receive, None
    messages: list[Message] = []
    body = b""
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        body += message.get("body", b"")
        if not message.get("more_body", False) or len(body) > PEEK_BYTES:
            break

    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()

    try:
        request = json.loads(body)
    except ValueError:
        return replay, None
    if not isinstance(request, dict) or request.get("method") != "tools/call":
        return replay, None
    params = request.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return replay, name if isinstance(name, str) else None


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text = value.decode("latin-1")
            kind, _, secret = text.partition(" ")
            return secret.strip() if kind.lower() == "bearer" and secret.strip() else None
    return None


UNAUTHORIZED = UnauthorizedError(
    "/mcp needs a live scoped token: Authorization: Bearer egt_... (docs/agents.md)"
)
INVALID_TOKEN = InvalidTokenError(
    "this token is unknown, revoked or expired: /mcp needs a live one (docs/agents.md)"
)
NO_CAPABILITY = InsufficientScopeError(
    "this access token grants no engram capability: ask the authorization server for one"
    " of the scopes this resource's metadata lists"
)
