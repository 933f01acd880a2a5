"""The operation id of a write whose client gave none: derived, so that the client's
retry of the same request (a lost answer, a timeout) applies once, and never shared
with another client's.

What a retry keeps: the scope, the tool, the arguments, and the client it comes from.
Which client is what it owns: over stdio, the one server process it talks to; over
HTTP, its token, and the MCP session it is sent in (the ``Mcp-Session-Id`` of
streamable HTTP, which the SDK's client sends again with every request and after a
dropped connection) and the id it names itself by (the ``Engram-Client-Id`` header),
whichever it has. What a retry does not keep: the JSON-RPC request id (a retry is a new
request, with a new id) nor the time. So the id is a hash of the four.

A request over HTTP with neither a session nor a client id (the stateless protocol,
a client that names no id) has nothing of its own to tell it from another client's
identical request of the same token: it gets a fresh id, so two clients' identical
writes are two operations, never one "replayed" answer (and a retry of it applies
again: a client that must not duplicate a write passes its own ``operation_id``).

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping
from typing import Any

from engram.store import Scope

PREFIX = "mcp:"


def derive(scope: Scope, tool: str, arguments: Mapping[str, Any], client: str) -> str:
    """``mcp:`` and 40 hex digits of sha256 over the canonical JSON of the four."""
    canonical = json.dumps(
        {"scope": scope.key, "tool": tool, "arguments": arguments, "session": client},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return PREFIX + hashlib.sha256(canonical.encode()).hexdigest()[:40]


def fresh() -> str:
    """An id no other request has: ``mcp:`` and 40 random hex digits."""
    return PREFIX + secrets.token_hex(20)


def client_of(token_id: int, session: str | None, client_id: str | None) -> str | None:
    """What identifies an HTTP client: its token and its session or named id; None when
    it has neither (nothing of its own)."""
    if not session and not client_id:
        return None
    return json.dumps([token_id, session or "", client_id or ""], separators=(",", ":"))
