"""MCP over streamable HTTP at ``/mcp`` of a real ``engram web``: a scoped token on
every request (none, made up, the dashboard's, revoked, expired: 401), the token's
scope and capabilities the only ones, its writes authenticated, its reads logged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from mcp import MCPError

from engram.store import Store
from engram.store.tokens import CAPABILITIES
from tests.helpers import rows_containing
from tests.mcp_support import TOOLS, http_session, ok, refused, run, server_env
from tests.redis_fixtures import InProcessWorker, wait_until
from tests.web_fixtures import Served

DASHBOARD_TOKEN = "the-operators-dashboard-token-0123"
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


@pytest.fixture
def served(
    store: Store, dsn: str, redis_url: str, tmp_path: Path, serve_web: Callable[..., Served]
) -> Served:
    """``engram web`` with /mcp, the dashboard behind its own operator token."""
    env = server_env(dsn, redis_url, tmp_path / "home", ENGRAM_DASHBOARD_TOKEN=DASHBOARD_TOKEN)
    return serve_web(database_url=dsn, redis_url=redis_url, env=env)


@pytest.fixture
def worker(store: Store, start_worker: Callable[..., InProcessWorker]) -> Any:
    with start_worker(store) as running:
        yield running


def initialize(url: str, token: str | None) -> httpx.Response:
    headers = {"Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(url + "/mcp", json=INITIALIZE, headers=headers, timeout=10)


def test_every_request_needs_a_live_scoped_token(served: Served, store: Store) -> None:
    scope = {"user_id": "http-auth"}
    live, _ = store.tokens.create("auth-live", scope, by="test")
    revoked, _ = store.tokens.create("auth-revoked", scope, by="test")
    expiring, _ = store.tokens.create("auth-expiring", scope, expires_in_s=0.5, by="test")
    assert store.tokens.revoke("auth-revoked", by="test")
    wait_until(lambda: store.tokens.verify(expiring) is None, what="the token to expire")
    made_up = "egt_" + "A" * 43

    assert initialize(served.url, live).status_code == 200
    for token in (None, made_up, revoked, expiring, DASHBOARD_TOKEN, live + "x"):
        answer = initialize(served.url, token)
        assert answer.status_code == 401, token
        assert answer.json()["error"]["code"] == "unauthorized"
        assert answer.headers["www-authenticate"].startswith("Bearer")
    # Nor is an egt_ token the dashboard's operator.
    api = httpx.get(
        served.url + "/api/v1/scopes", headers={"Authorization": f"Bearer {live}"}, timeout=10
    )
    assert api.status_code == 403


def test_a_token_revoked_mid_session_is_refused_at_its_next_request(
    served: Served, store: Store, worker: Any
) -> None:
    secret, _ = store.tokens.create("mid-session", {"user_id": "mid"}, by="test")

    statuses: list[int] = []

    async def main() -> None:
        async with http_session(served.url + "/mcp", secret, statuses) as s:
            assert (await ok(s, "recall", query="anything"))["records"] == []
            assert 401 not in statuses
            assert store.tokens.revoke("mid-session", by="test")
            with pytest.raises(MCPError):
                await s.call_tool("recall", {"query": "anything"})
            assert statuses[-1] == 401

    run(main)


def test_the_tools_through_a_token(served: Served, store: Store, dsn: str, worker: Any) -> None:
    scope = {"user_id": "http-ada", "agent_id": "helper"}
    secret, grant = store.tokens.create("ada-helper", scope, by="test")
    other, _ = store.tokens.create("eve-helper", {"user_id": "http-eve"}, by="test")
    secret_text = "Ada's locker code is PANGOLINSTAR 9."

    async def main() -> str:
        async with http_session(served.url + "/mcp", secret) as s:
            tools = (await s.list_tools()).tools
            assert tuple(t.name for t in tools) == TOOLS
            written = await ok(s, "remember", text=secret_text)
            assert written["state"] == "committed"
            rid: str = written["records"][0]["id"]
            [hit] = (await ok(s, "recall", query="locker code"))["records"]
            assert hit["record"]["id"] == rid
            assert (await ok(s, "get", record_id=rid))["record"]["text"] == secret_text
            changed = secret_text + " Changed."
            await ok(s, "revise", record_id=rid, text=changed, expected_revision=1)
            stale = await refused(s, "revise", record_id=rid, text="x", expected_revision=1)
            assert stale["code"] == "revision_conflict"
            assert (stale["expected"], stale["actual"]) == (1, 2)
            history = await ok(s, "history", record_id=rid)
            assert [r["revision"] for r in history["revisions"]] == [1, 2]
            # Naming a scope in a call changes nothing: refused, nothing written.
            before = store.scope_revision(scope)
            for extra in ({"user_id": "http-eve"}, {"scope": {"user_id": "http-eve"}}):
                error = await refused(s, "remember", text="Planted.", **extra)
                assert error["code"] == "invalid_request"
            assert store.scope_revision(scope) == before
            assert store.scope_revision({"user_id": "http-eve"}) == 0
        async with http_session(served.url + "/mcp", other) as e:
            assert (await refused(e, "get", record_id=rid))["code"] == "not_found"
            assert (await refused(e, "history", record_id=rid))["code"] == "not_found"
            assert (await ok(e, "recall", query="locker code PANGOLINSTAR"))["records"] == []
        async with http_session(served.url + "/mcp", secret) as s:
            forgot = await ok(s, "forget", record_id=rid)
            assert forgot["revisions"] == [1, 2]
            assert (await ok(s, "recall", query="locker code"))["records"] == []
            assert (await refused(s, "get", record_id=rid))["code"] == "not_found"
        return rid

    rid = run(main)
    # Its writes name the token, authenticated; its reads are logged, content-free.
    receipts = store.receipts(scope=scope, limit=10, refused=True)
    assert {r.requested_by for r in receipts} == {grant.actor}
    assert all(r.authenticated for r in receipts)
    reads = store.tokens.reads_by_token("ada-helper")
    assert sorted({(r.tool, r.record_id, r.revision) for r in reads}) == [
        ("get", rid, 1),
        ("history", rid, 1),
        ("history", rid, 2),
        ("recall", rid, 1),
    ]
    assert store.tokens.reads_by_token("eve-helper") == []
    with psycopg.connect(dsn) as conn:
        assert rows_containing(conn, "PANGOLINSTAR") == []


def test_a_token_without_the_capability_gets_a_tool_error(
    served: Served, store: Store, worker: Any
) -> None:
    scope = {"user_id": "reader-only"}
    reads = [c for c in CAPABILITIES if c in ("recall", "get", "history", "operation")]
    secret, _ = store.tokens.create("reader", scope, can=reads, by="test")

    async def main() -> None:
        async with http_session(served.url + "/mcp", secret) as s:
            for tool, arguments in (
                ("remember", {"text": "Not allowed."}),
                ("forget", {"record_id": "x"}),
                ("revise", {"record_id": "x", "text": "y", "expected_revision": 1}),
            ):
                error = await refused(s, tool, **arguments)
                assert error["code"] == "forbidden"
                assert tool in error["message"]
            assert (await ok(s, "recall", query="anything"))["records"] == []

    run(main)
    assert store.scope_revision(scope) == 0


def test_bad_input_over_http_and_the_server_keeps_serving(
    served: Served, store: Store, worker: Any
) -> None:
    secret, _ = store.tokens.create("bad-input", {"user_id": "http-bad"}, by="test")

    async def main() -> None:
        async with http_session(served.url + "/mcp", secret) as s:
            assert (await refused(s, "remember", text="x" * 32_001))["code"] == "invalid_request"
            assert (await refused(s, "recall", query=["not", "text"]))["code"] == (
                "invalid_request"
            )
            assert (await refused(s, "no_such_tool"))["code"] == "unknown_tool"
            assert (await ok(s, "remember", text="Still serving."))["state"] == "committed"
        # A body that is not JSON-RPC at all: an error answer, the server still up.
        broken = httpx.post(
            served.url + "/mcp",
            content=b"{not json",
            headers={
                "Authorization": f"Bearer {secret}",
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
            timeout=10,
        )
        assert 400 <= broken.status_code < 500
        async with http_session(served.url + "/mcp", secret) as s:
            assert len((await ok(s, "recall", query="serving"))["records"]) == 1

    run(main)


def test_a_refused_token_is_a_warning_without_its_secret_and_a_count(
    served: Served, store: Store
) -> None:
    scope = {"user_id": "http-refusals"}
    revoked, _ = store.tokens.create("refused-revoked", scope, by="test")
    assert store.tokens.revoke("refused-revoked", by="test")
    made_up = "egt_" + "R" * 43
    for token in (None, made_up, revoked, DASHBOARD_TOKEN):
        assert initialize(served.url, token).status_code == 401
    said = wait_until(
        lambda: (
            [
                line
                for line in served.log().splitlines()
                if "credentials refused door=mcp" in line and "WARNING" in line
            ]
            if served.log().count("credentials refused door=mcp") == 4
            else None
        ),
        what="four refusals in the log",
    )
    reasons = sorted(line.split("reason=")[1].split()[0] for line in said)
    assert reasons == ["malformed", "missing", "revoked", "unknown"]
    assert any("reason=revoked path=/mcp token=refused-revoked" in line for line in said)
    for secret in (revoked, made_up, DASHBOARD_TOKEN):
        assert secret not in served.log()
    operator = {"Authorization": f"Bearer {DASHBOARD_TOKEN}"}
    metrics = httpx.get(served.url + "/metrics", headers=operator, timeout=10).text
    for reason in ("missing", "unknown", "revoked", "malformed"):
        assert f'engram_auth_refused_total{{door="mcp",reason="{reason}"}} 1' in metrics
