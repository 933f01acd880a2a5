"""The README's ``mcp.json`` (Claude Desktop, Cursor) is one a client can use as
written: this test reads it from the README and starts exactly its command, with its
arguments and environment, as a client does, then talks MCP to it."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from engram.store import Store
from tests.mcp_support import TOOLS, ok, run, server_env
from tests.redis_fixtures import REPO, InProcessWorker


def readme_mcp_json() -> dict[str, Any]:
    text = (REPO / "README.md").read_text()
    agents = text[text.index("## Agents\n") : text.index("## The command line\n")]
    [block] = re.findall(r"^```json\n(.*?)^```$", agents, re.M | re.S)
    config: dict[str, Any] = json.loads(block)
    return config


def test_the_readme_mcp_json_is_a_server_config_with_a_scope() -> None:
    server = readme_mcp_json()["mcpServers"]["engram"]
    assert server["command"] == "engram"
    assert server["args"][:2] == ["mcp", "--scope"]
    assert json.loads(server["args"][2]) == {"user_id": "ada"}


@pytest.fixture
def worker(store: Store, start_worker: Callable[..., InProcessWorker]) -> Any:
    with start_worker(store) as running:
        yield running


def test_the_readme_mcp_json_starts_a_working_server(
    store: Store, dsn: str, redis_url: str, tmp_path: Path, worker: Any
) -> None:
    server = readme_mcp_json()["mcpServers"]["engram"]
    bin_dir = tmp_path / "bin"  # ``engram`` as pip installs it: this checkout's
    bin_dir.mkdir()
    shim = bin_dir / "engram"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m engram "$@"\n')
    shim.chmod(0o755)
    # The README's env as written; the test's servers named outright (they win over
    # the home, which is not there).
    env = {**server_env(dsn, redis_url, tmp_path / "unused"), **server["env"]}
    params = StdioServerParameters(
        command=server["command"],
        args=server["args"],
        env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin"},
        cwd=tmp_path,
    )

    async def main() -> None:
        with open(tmp_path / "mcp.log", "w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                assert tuple(t.name for t in (await session.list_tools()).tools) == TOOLS
                await ok(session, "remember", text="Ada reads the README.")
                found = await ok(session, "recall", query="Who reads the README?")
                assert [h["record"]["text"] for h in found["records"]] == ["Ada reads the README."]

    run(main)
    assert [r.text for r in store.records({"user_id": "ada"})] == ["Ada reads the README."]
