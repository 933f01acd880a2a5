"""Who is asking: the dashboard's token, a person's session, or loopback.

Bound to loopback with no ``ENGRAM_DASHBOARD_TOKEN``, everyone who can reach
the port is the operator ``local``. With a token, every page and API call
needs it: programs send ``Authorization: Bearer <token>`` (and may name
themselves with ``X-Engram-Operator``), people sign in with a name and the
token and get a session cookie signed with a key derived from the token (so
changing the token ends every session). Tokens and signatures are compared
in constant time. The operator's name goes on what they ask for: the
receipt of a forget, the audit row of a retry.
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

from .config import WebConfig
from .errors import BadRequestError

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


class Authenticator:
    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self.keys = Keys(config.token)
        self._token = config.token.encode() if config.token is not None else None

    def identify(self, conn: HTTPConnection) -> Operator | None:
        """The operator making this request, or None when it must sign in first."""
        if self._token is None:
            return Operator("local", "local")
        bearer = _bearer(conn.headers.get("authorization"))
        if bearer is not None:
            if not hmac.compare_digest(bearer.encode(), self._token):
                return None
            named = conn.headers.get(OPERATOR_HEADER)
            try:
                name = operator_name(named) if named else "api"
            except BadRequestError:
                name = "api"
            return Operator(name, "token")
        return self._session(conn.cookies.get(SESSION_COOKIE))

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


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else ""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")
