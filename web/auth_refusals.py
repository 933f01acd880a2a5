"""Refused credentials leave a trace: one WARNING line and a counter in ``/metrics``.

Every request refused for who it is (no credential where one is needed, a made-up,
revoked or expired scoped token, a refused OAuth access token, a wrong operator token,
a failed sign-in) is logged
at WARNING, which ``engram up``'s children keep, and counted in
``engram_auth_refused_total{door, reason}``. Content-free: never a token, a code or a
query string; a scoped token that exists (revoked, expired) is named by its name,
which is not a secret. A dashboard page asked for without a session is not a refusal
but the way to the sign-in page, and is not counted.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Literal, cast
from urllib.parse import quote

import redis

from engram.store.tokens import Tokens
from engram.worker.admin import metrics

log = logging.getLogger("engram.web.auth")

Door = Literal["api", "dashboard", "mcp"]
# Why: nothing presented, a scoped token that is no token's, one revoked or expired,
# a bearer that is not the operator's token, a sign-in link used, expired or forged, an
# OAuth access token refused (web.oauth: its signature, issuer, audience, time, claims).
Reason = Literal[
    "missing", "malformed", "unknown", "revoked", "expired", "wrong_token", "link", "invalid_token"
]


def door_of(path: str) -> Door:
    if path.startswith("/mcp"):
        return "mcp"
    return "api" if path.startswith("/api/") or path == "/metrics" else "dashboard"


def why_token_refused(tokens: Tokens, secret: str | None) -> tuple[Reason, str | None]:
    """Why a scoped token was refused, and its name if it has one (database: a thread)."""
    if secret is None:
        return "missing", None
    reason, name = tokens.refusal(secret)
    return cast(Reason, reason), name


def note(
    client: redis.Redis | None,
    *,
    door: Door,
    reason: Reason,
    path: str,
    token_name: str | None = None,
) -> None:
    """Log and count one refusal. A Redis that does not answer loses the count, never
    the refusal (nor the log line)."""
    log.warning(
        "credentials refused",
        extra={
            "door": door,
            "reason": reason,
            "path": quote(path)[:300],
            **({"token": token_name} if token_name is not None else {}),
        },
    )
    if client is not None:
        with contextlib.suppress(redis.RedisError):
            metrics.record_refusal(client, door, reason)
