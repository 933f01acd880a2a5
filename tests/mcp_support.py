"""A real MCP client (the SDK's ``ClientSession``) on engram's MCP server: over stdio,
spawning ``python -m engram mcp --scope ...``, or over streamable HTTP at ``/mcp`` of
a real ``engram web``. Tests call ``run(main)`` with an async ``main``."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.redis_fixtures import FAST, REPO

T = TypeVar("T")

# A JSON-RPC initialize as a hand-written client (curl) sends it, for raw HTTP tests.
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "curl", "version": "1"},
    },
}

TOOLS = ("remember", "recall", "get", "history", "revise", "retract", "forget", "operation")


def run(main: Callable[[], Awaitable[T]]) -> T:
    return anyio.run(main)


def server_env(database_url: str, redis_url: str, home: Path, **extra: str) -> dict[str, str]:
    """What an ``engram mcp`` or ``engram web`` of the tests runs with."""
    return {
        "PYTHONPATH": str(REPO),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "ENGRAM_HOME": str(home),
        "ENGRAM_EMBEDDER": "hashing:64",  # the workers' (tests.redis_fixtures)
        "ENGRAM_PARTITIONS": str(FAST.partitions),
        **extra,
    }


@contextlib.asynccontextmanager
async def stdio_session(
    scope: dict[str, str] | str, env: dict[str, str], log_path: Path
) -> AsyncIterator[ClientSession]:
    """``python -m engram mcp --scope SCOPE``, spawned and connected; its stderr (the
    server's logs) in ``log_path``. The client closes its stdin at the end: it exits."""
    scope_arg = scope if isinstance(scope, str) else json.dumps(scope)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "engram", "mcp", "--scope", scope_arg],
        env={"PATH": os.environ.get("PATH", ""), **env},
        cwd=REPO,
    )
    with open(log_path, "a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


@contextlib.asynccontextmanager
async def http_session(
    url: str, token: str | None, statuses: list[int] | None = None
) -> AsyncIterator[ClientSession]:
    """A session on ``url`` (``.../mcp``) with ``Authorization: Bearer token``; the HTTP
    status of each answer goes into ``statuses`` (the SDK's errors do not say it)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}

    async def note(response: httpx2.Response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    async with (
        httpx2.AsyncClient(headers=headers, timeout=30, event_hooks={"response": [note]}) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> types.CallToolResult:
    result = await session.call_tool(tool, arguments)
    assert isinstance(result, types.CallToolResult), result
    return result


async def ok(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """The structured answer of a call that must succeed."""
    result = await call(session, tool, **arguments)
    assert not result.is_error, result.structured_content
    data: dict[str, Any] = result.structured_content
    return data


async def refused(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """The error of a call that must be refused: ``{"code": ..., "message": ...}``."""
    result = await call(session, tool, **arguments)
    assert result.is_error, result.structured_content
    error: dict[str, Any] = result.structured_content["error"]
    return error


def texts(result: types.CallToolResult) -> list[str]:
    return [c.text for c in result.content if isinstance(c, types.TextContent)]
