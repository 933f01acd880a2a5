"""The Python SDK's ``Client`` speaking each protocol generation to engram's MCP
server, over stdio and over streamable HTTP: the handshake era (``initialize`` and
sessions: 2025-06-18, 2025-11-25) and the stateless era (2026-07-28: no
``initialize``, ``server/discover``, every request carrying its version in ``_meta``
and in ``MCP-Protocol-Version``, and its ``Mcp-Method``/``Mcp-Name`` headers, checked
against the body before anything runs)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from engram.store import Store
from tests.mcp_support import TOOLS, run, server_env
from tests.redis_fixtures import REPO, InProcessWorker
from tests.web_fixtures import Served

MODERN = "2026-07-28"
# How the SDK's Client is told to speak: "legacy" is the initialize handshake (it
# offers its newest handshake version, 2025-11-25), "auto" probes server/discover
# first and falls back to initialize, a version adopts it without a probe.
GENERATIONS = {"legacy": "2025-11-25", "auto": MODERN, MODERN: MODERN}
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "curl", "version": "1"},
}


@pytest.fixture
def served(
    store: Store, dsn: str, redis_url: str, tmp_path: Path, serve_web: Callable[..., Served]
) -> Served:
    env = server_env(dsn, redis_url, tmp_path / "home")
    return serve_web(database_url=dsn, redis_url=redis_url, env=env)


@pytest.fixture
def worker(store: Store, start_worker: Callable[..., InProcessWorker]) -> Any:
    with start_worker(store) as running:
        yield running


def stdio(scope: dict[str, str], env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "engram", "mcp", "--scope", json.dumps(scope)],
        env={"PATH": os.environ.get("PATH", ""), **env},
        cwd=REPO,
    )


async def remember_recall_forget(client: Client, text: str, query: str) -> None:
    """The tools a memory client uses, each answered in full on this generation."""
    assert tuple(t.name for t in (await client.list_tools()).tools) == TOOLS
    written = await client.call_tool("remember", {"text": text})
    assert not written.is_error, written.structured_content
    assert written.structured_content["state"] == "committed"
    rid = written.structured_content["records"][0]["id"]
    found = await client.call_tool("recall", {"query": query})
    [hit] = found.structured_content["records"]
    assert hit["record"]["id"] == rid and hit["record"]["text"] == text
    forgot = await client.call_tool("forget", {"record_id": rid})
    assert forgot.structured_content["revisions"] == [1]
    assert (await client.call_tool("recall", {"query": query})).structured_content["records"] == []


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_both_generations_over_stdio(
    mode: str, store: Store, dsn: str, redis_url: str, tmp_path: Path, worker: Any
) -> None:
    scope = {"user_id": f"stdio-{mode}"}
    env = server_env(dsn, redis_url, tmp_path / "home")

    async def main() -> str:
        async with Client(stdio(scope, env), mode=mode) as client:
            await remember_recall_forget(client, "Ada's bike is the green one.", "green bike")
            return client.protocol_version

    assert run(main) == GENERATIONS[mode]
    assert store.scope_revision(scope) == 2  # the remember and the forget, nothing else


@pytest.mark.parametrize("mode", list(GENERATIONS))
def test_both_generations_over_http(mode: str, served: Served, store: Store, worker: Any) -> None:
    scope = {"user_id": f"http-{mode}"}
    secret, _ = store.tokens.create(f"gen-{mode}", scope, by="test")

    async def main() -> str:
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            transport = streamable_http_client(served.url + "/mcp", http_client=http)
            async with Client(transport, mode=mode) as client:
                await remember_recall_forget(client, "Ada's kayak is yellow.", "yellow kayak")
                return client.protocol_version

    assert run(main) == GENERATIONS[mode]
    assert store.scope_revision(scope) == 2


def test_a_stateless_request_whose_headers_do_not_match_its_body_changes_nothing(
    served: Served, store: Store, worker: Any
) -> None:
    """2026-07-28: ``Mcp-Method``, ``Mcp-Name`` and ``MCP-Protocol-Version`` must say
    what the body says; a request where they do not is a 400 before any tool runs, and
    ``server/discover`` names the versions and the tools capability."""
    scope = {"user_id": "headers"}
    secret, _ = store.tokens.create("headers", scope, by="test")
    common = {"Authorization": f"Bearer {secret}", "Accept": "application/json, text/event-stream"}
    remember = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "remember", "arguments": {"text": "Planted."}, "_meta": ENVELOPE},
    }
    right = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "remember"}

    def post(body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        return httpx.post(served.url + "/mcp", json=body, headers={**common, **headers}, timeout=30)

    wrong = [
        {k: v for k, v in right.items() if k != "Mcp-Method"},
        {k: v for k, v in right.items() if k != "Mcp-Name"},
        {**right, "Mcp-Name": "recall"},
        {**right, "Mcp-Method": "tools/list"},
        {**right, "MCP-Protocol-Version": "2099-01-01"},
    ]
    for headers in wrong:
        answer = post(remember, headers)
        assert answer.status_code == 400, (headers, answer.text)
        assert answer.json()["error"]["code"] == -32020  # HEADER_MISMATCH
    assert store.scope_revision(scope) == 0

    discover = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "server/discover",
        "params": {"_meta": ENVELOPE},
    }
    found = post(discover, {"MCP-Protocol-Version": MODERN, "Mcp-Method": "server/discover"})
    assert found.status_code == 200
    result = found.json()["result"]
    assert MODERN in result["supportedVersions"]
    assert "tools" in result["capabilities"]

    answer = post(remember, right)
    assert answer.status_code == 200 and "mcp-session-id" not in answer.headers
    assert answer.json()["result"]["structuredContent"]["state"] == "committed"
    assert store.scope_revision(scope) == 1
