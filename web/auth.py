"""Who is asking: the operator's token, a person's session, or no one.

The operator authenticates: every page and API call needs the dashboard's token
(``ENGRAM_DASHBOARD_TOKEN``, else the home's, ``web.signin``). Programs send
``Authorization: Bearer <token>`` (and may name themselves with
``X-Engram-Operator``); people sign in with a name and the token, or follow a
one-time sign-in link, and get a session cookie signed with a key derived from the
token (so changing the token ends every session). Tokens and signatures are
compared in constant time. The operator's name goes on what they ask for: the
receipt of a forget, the audit row of a retry. Only a dashboard served open on
purpose (``WebConfig.open``, a throwaway local demo) takes everyone who reaches
its port for the operator ``local``, and the gate only while no scoped token is live.

A scoped token (``Authorization: Bearer egt_...``, store.tokens) is never an
operator, whatever else is configured: it acts on its own scope through the
routes that take one (``web.scoped``), and every other route refuses it. The
gate verifies it once per request; ``grant_of`` and ``require_grant`` hand its
grant to the views and to whatever else is mounted (``/mcp``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from starlette.requests import HTTPConnection

from engram.store.tokens import TOKEN_PREFIX, Grant

from .config import WebConfig
from .errors import BadRequestError, UnauthorizedError

SESSION_COOKIE = "engram_session"
OPERATOR_HEADER = "x-engram-operator"
_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,64}")


@dataclass(frozen=True, slots=True)
class Operator:
    name: str
    via: Literal["local", "session", "token"]
    # What this operator's CSRF tokens are bound to (a session's own nonce).
    nonce: str = ""


def operator_name(value: str) -> str:
    """An operator's name: 1 to 64 printable characters, trimmed."""
    name = value.strip()
    if not _NAME.fullmatch(name):
        raise BadRequestError("an operator name is 1 to 64 printable characters")
    return name


class Keys:
    """The secrets derived from the token (or, without one, made at start-up)."""

    def __init__(self, token: str | None) -> None:
        seed = token.encode() if token is not None else secrets.token_bytes(32)
        self.session = hmac.new(seed, b"engram-dashboard-session", hashlib.sha256).digest()
        self.csrf = hmac.new(seed, b"engram-dashboard-csrf", hashlib.sha256).digest()
        # Signs the lists' cursors, so every process serving the dashboard accepts them.
        self.cursor = hmac.new(seed, b"engram-dashboard-cursor", hashlib.sha256).digest()
        # Signs the one-time sign-in links (``web.signin``), so one minted by ``engram up``
        # or ``engram signin`` is this dashboard's.
        self.signin = hmac.new(seed, b"engram-dashboard-signin", hashlib.sha256).digest()


class Authenticator:
    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self.keys = Keys(config.token)
        self._token = config.token.encode() if config.token is not None else None

    def identify(self, conn: HTTPConnection) -> Operator | None:
        """The operator making this request, or None when it must sign in first."""
        if self._token is None:  # served open on purpose (WebConfig.open): no one signs in
            return Operator("local", "local")
        given = bearer(conn.headers.get("authorization"))
        if given is not None:
            if not hmac.compare_digest(given.encode(), self._token):
                return None
            named = conn.headers.get(OPERATOR_HEADER)
            try:
                name = operator_name(named) if named else "api"
            except BadRequestError:
                name = "api"
            return Operator(name, "token")
        return self._session(conn.cookies.get(SESSION_COOKIE))

    def is_operator_token(self, given: str) -> bool:
        """Whether ``given`` is the operator's token (False when there is none)."""
        return self._token is not None and hmac.compare_digest(given.encode(), self._token)

    def check_token(self, given: str) -> bool:
        if self._token is None:
            return True
        return hmac.compare_digest(given.encode(), self._token)

    # -- sessions -------------------------------------------------------------------

    def new_session(self, name: str) -> str:
        payload = _b64(
            json.dumps(
                {"n": name, "t": int(time.time()), "k": secrets.token_urlsafe(16)},
                separators=(",", ":"),
            ).encode()
        )
        return f"{payload}.{self._sign(payload)}"

    def _session(self, cookie: str | None) -> Operator | None:
        if not cookie or len(cookie) > 1024 or cookie.count(".") != 1:
            return None
        payload, signature = cookie.split(".")
        if not hmac.compare_digest(signature, self._sign(payload)):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            name, issued, nonce = str(data["n"]), int(data["t"]), str(data["k"])
        except (ValueError, KeyError, TypeError):
            return None
        if not 0 <= time.time() - issued <= self.config.session_ttl_s:
            return None
        return Operator(name, "session", nonce)

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self.keys.session, payload.encode(), hashlib.sha256).digest())


# -- scoped tokens ------------------------------------------------------------------


def presented_token(conn: HTTPConnection) -> str | None:
    """The scoped token a request presents (an ``egt_`` bearer), or None."""
    given = bearer(conn.headers.get("authorization"))
    return given if given and given.startswith(TOKEN_PREFIX) else None


def grant_of(conn: HTTPConnection) -> Grant | None:
    """The verified scoped token this request presented (the gate put it there), or
    None for an operator's request."""
    grant: Grant | None = conn.scope.get("state", {}).get("grant")
    return grant


def require_grant(conn: HTTPConnection) -> Grant:
    """The request's verified scoped token, or ``UnauthorizedError`` (401): for what
    only a scoped token may use (``/mcp``), an operator included."""
    grant = grant_of(conn)
    if grant is None:
        raise UnauthorizedError(
            "this needs a scoped token: send Authorization: Bearer egt_... (engram tokens create)"
        )
    return grant


def bearer(header: str | None) -> str | None:
    """An Authorization header's bearer: None without the header, "" for another scheme."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else ""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")
