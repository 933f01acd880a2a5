"""The operation id of a write whose client gave none: derived, so that the client's
retry of the same request (a lost answer, a timeout) applies once.

What a retry keeps: the scope, the tool, the arguments, and the MCP session it is sent
in (the ``Mcp-Session-Id`` of streamable HTTP, which the SDK's client sends again with
every request and after a dropped connection; over stdio, the one server process the
client talks to). What it does not keep: the JSON-RPC request id (a retry is a new
request, with a new id) nor the time. So the id is a hash of those four. The same
write twice in one session applies once (its answer says ``replayed``); the same
write in a new session is a new operation: a client that must not duplicate a
remember across restarts passes its own ``operation_id``.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from engram.store import Scope

PREFIX = "mcp:"


def derive(scope: Scope, tool: str, arguments: Mapping[str, Any], session: str) -> str:
    """``mcp:`` and 40 hex digits of sha256 over the canonical JSON of the four."""
    canonical = json.dumps(
        {"scope": scope.key, "tool": tool, "arguments": arguments, "session": session},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return PREFIX + hashlib.sha256(canonical.encode()).hexdigest()[:40]
