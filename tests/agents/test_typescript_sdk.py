"""A client nobody here wrote: the official TypeScript MCP SDK
(``@modelcontextprotocol/sdk``, locked in ``tests/agents/ts/package-lock.json``), run
by node, on engram's MCP server over stdio and over streamable HTTP. Its script
(``ts/client.mjs``) lists the tools, remembers and waits for the receipt, recalls,
tries to name another scope, and forgets; this test checks what it saw against the
database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engram.store import Store
from tests.helpers import rows_containing
from tests.mcp_support import TOOLS, server_env
from tests.node_support import node_with_packages
from tests.redis_fixtures import REPO, InProcessWorker
from tests.web_fixtures import Served

TS = Path(__file__).parent / "ts"


@pytest.fixture(scope="session")
def node() -> str:
    """node, with the SDK installed as the lock file says."""
    return node_with_packages(TS, "@modelcontextprotocol/sdk")


@pytest.fixture
def worker(store: Store, start_worker: Callable[..., InProcessWorker]) -> Any:
    with start_worker(store) as running:
        yield running


def run_client(node: str, config: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [node, str(TS / "client.mjs"), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=TS,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def check(report: dict[str, Any], text: str, store: Store, dsn: str, scope: dict[str, str]) -> None:
    assert tuple(report["tools"]) == TOOLS
    # Every tool has an outputSchema, and the SDK checked each answer against it.
    assert tuple(report["outputSchemas"]) == TOOLS
    assert report["server"] == "engram"
    remembered = report["remembered"]
    assert remembered["state"] == "committed"
    [record] = remembered["records"]
    assert record["revision"] == 1
    assert report["recalled"] == [{"id": record["id"], "text": text}]
    assert report["recallSummary"] == "1 record found"
    # Naming another scope: refused as the contract says, and nothing written there.
    assert report["planted"] == {"isError": True, "code": "invalid_request"}
    assert store.scope_revision({"user_id": "someone-else"}) == 0
    assert report["forgot"]["revisions"] == [1]
    assert report["forgetSummary"] == f"forgot {record['id']} (1 revision)"
    assert report["afterForget"] == 0
    # The remember and the forget: the refused call wrote nothing.
    assert store.scope_revision(scope) == 2
    with psycopg.connect(dsn) as conn:
        assert rows_containing(conn, text.split()[-1].strip(".")) == []


def test_the_typescript_sdk_over_stdio(
    node: str, store: Store, dsn: str, redis_url: str, tmp_path: Path, worker: Any
) -> None:
    scope = {"user_id": "ts-stdio"}
    text = "Ada's umbrella is in the blue WOMBATCLOSET."
    env = {
        "PATH": os.environ.get("PATH", ""),
        **server_env(dsn, redis_url, tmp_path / "home"),
    }
    report = run_client(
        node,
        {
            "transport": "stdio",
            "command": sys.executable,
            "args": ["-m", "engram", "mcp", "--scope", json.dumps(scope)],
            "env": env,
            "cwd": str(REPO),
            "text": text,
            "query": "where is the umbrella?",
        },
    )
    check(report, text, store, dsn, scope)


def test_the_typescript_sdk_over_streamable_http(
    node: str,
    store: Store,
    dsn: str,
    redis_url: str,
    tmp_path: Path,
    serve_web: Callable[..., Served],
    worker: Any,
) -> None:
    scope = {"user_id": "ts-http"}
    text = "Ada's passport is in the KOALADRAWER."
    secret, _ = store.tokens.create("ts-http", scope, by="test")
    served = serve_web(
        database_url=dsn, redis_url=redis_url, env=server_env(dsn, redis_url, tmp_path / "home")
    )
    report = run_client(
        node,
        {
            "transport": "http",
            "url": served.url + "/mcp",
            "token": secret,
            "text": text,
            "query": "where is the passport?",
        },
    )
    check(report, text, store, dsn, scope)
    assert report["protocolVersion"] == "2025-11-25"
