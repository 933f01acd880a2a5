"""Signing the operator in without typing a token: the home's own token, and
one-time sign-in links.

A home keeps the dashboard's operator token (``ENGRAM_HOME/dashboard.token``,
readable by its owner only, made once and kept across restarts, as valkey's
password is). ``engram up`` and ``engram web`` use it when ENGRAM_DASHBOARD_TOKEN
is not set, so the dashboard and ``/api/v1`` always ask who is there: a program
sends it as ``Authorization: Bearer``, a person follows a sign-in link.

A sign-in link is ``/login?code=CODE``: a random nonce and an expiry, signed with
a key derived from the operator token (``Keys.signin``), so only whoever holds the
token mints one, and changing the token voids them all. It signs in once: the
server spends its nonce in Redis (``SET NX``, kept until the link would have
expired) before it sets the session cookie, then redirects, so the code leaves the
address bar, and a link left in a terminal's scrollback, a browser's history or a
log is worth nothing once used.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from engram.store import home as homes
from engram.store.errors import ConfigError
from engram.worker import keys
from engram.worker.embedded.private import open_private

from .auth import Keys
from .config import MIN_TOKEN_CHARS

TOKEN_FILE = "dashboard.token"
# How long a link signs in, once: as long as the session it opens.
LINK_TTL_S = 12 * 3600
_NONCE_BYTES = 16
_SIGNATURE_BYTES = 16
_CODE_BYTES = _NONCE_BYTES + 8 + _SIGNATURE_BYTES


def token_path(home: Path) -> Path:
    return Path(home) / TOKEN_FILE


def home_token(home: Path) -> str:
    """The operator token of ``home``: the one it keeps, else a new one, kept (0600).
    The home is made its owner's first (``store.home.make_private``)."""
    homes.make_private(Path(home))
    path = token_path(home)
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    made = path.with_suffix(f".{os.getpid()}.tmp")
    with open_private(made) as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    try:
        os.link(made, path)  # never over one another process made meanwhile
    except FileExistsError:
        pass
    finally:
        made.unlink()
    return _read(path)


def _read(path: Path) -> str:
    token = path.read_text().strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"{path} holds no dashboard token of {MIN_TOKEN_CHARS} characters or more:"
            " remove it, and engram makes a new one"
        )
    return token


@dataclass(frozen=True, slots=True)
class Code:
    """A sign-in code whose signature holds: its nonce, and when it expires."""

    nonce: bytes
    expires_s: int


def mint(token: str, *, now_s: float | None = None, ttl_s: int = LINK_TTL_S) -> str:
    """A new sign-in code for the dashboard whose operator token is ``token``."""
    now_s = time.time() if now_s is None else now_s
    body = secrets.token_bytes(_NONCE_BYTES) + struct.pack(">q", int(now_s) + ttl_s)
    raw = body + _sign(Keys(token).signin, body)
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def link(url: str, token: str, *, now_s: float | None = None) -> str:
    """A one-time sign-in link to the dashboard at ``url`` (``http://host:port/``)."""
    return f"{url.rstrip('/')}/login?code={mint(token, now_s=now_s)}"


def read(key: bytes, code: str, *, now_s: float) -> Code | None:
    """The code, if this dashboard signed it and it has not expired; else None."""
    if not 0 < len(code) <= 80:
        return None
    try:
        raw = base64.urlsafe_b64decode(code + "=" * (-len(code) % 4))
    except ValueError:
        return None
    if len(raw) != _CODE_BYTES:
        return None
    body, signature = raw[:-_SIGNATURE_BYTES], raw[-_SIGNATURE_BYTES:]
    if not hmac.compare_digest(signature, _sign(key, body)):
        return None
    (expires_s,) = struct.unpack(">q", body[_NONCE_BYTES:])
    if now_s >= expires_s:
        return None
    return Code(body[:_NONCE_BYTES], expires_s)


def spend(client: redis.Redis, code: Code, *, now_s: float) -> bool:
    """Spend the code's one use: True the first time, False ever after."""
    ttl_s = max(1, int(code.expires_s - now_s) + 1)
    return bool(client.set(keys.signin_spent(code.nonce.hex()), b"1", nx=True, ex=ttl_s))


def _sign(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest()[:_SIGNATURE_BYTES]
