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

from engram.mcp.http import REFUSED
from engram.store import Operation, Store, WriteResult
from tests.helpers import rows_containing
from tests.mcp_support import INITIALIZE, TOOLS, http_session, ok, refused, run, server_env
from tests.redis_fixtures import InProcessWorker, wait_until
from tests.web_fixtures import EMBEDDER, Served

DASHBOARD_TOKEN = "the-operators-dashboard-token-0123"


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
        # A JSON-RPC error (engram's in its data), so an MCP client reads it as one.
        assert answer.json()["error"]["code"] == REFUSED
        assert answer.json()["error"]["data"]["code"] == "unauthorized"
        challenge = answer.headers["www-authenticate"]
        assert challenge.startswith("Bearer")
        # A token was sent and refused: invalid_token (RFC 6750); none sent: no error.
        assert ('error="invalid_token"' in challenge) == (token is not None), token
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
            with pytest.raises(MCPError) as refused_call:
                await s.call_tool("recall", {"query": "anything"})
            assert statuses[-1] == 401
            # The SDK shows the refusal as what it is, not -32603 "Server returned an
            # error response".
            assert refused_call.value.error.code == REFUSED
            assert refused_call.value.error.data["code"] == "unauthorized"

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


def test_a_revise_creating_another_scopes_id_creates_the_callers_own_record(
    served: Served, store: Store, worker: Any
) -> None:
    """A record id is its scope's (issue 36 item 3): ada's revise(expected_revision=0)
    of the id bob uses (or forgot) is neither a not_found that says the id is used nor
    a way to his record: it creates ada's own, and bob's is untouched."""
    ada_scope, bob_scope = {"user_id": "rid-ada"}, {"user_id": "rid-bob"}
    ada, _ = store.tokens.create("rid-ada", ada_scope, by="test")
    bob, _ = store.tokens.create("rid-bob", bob_scope, by="test")

    async def main() -> None:
        async with http_session(served.url + "/mcp", bob) as b:
            for text, expected in (("Bob's plan is quokkaz.", 0), ("Bob's plan is quokkaz v2.", 1)):
                await ok(b, "revise", record_id="plan", text=text, expected_revision=expected)
            await ok(b, "revise", record_id="old-note", text="Bob's note.", expected_revision=0)
            await ok(b, "forget", record_id="old-note")
        async with http_session(served.url + "/mcp", ada) as a:
            for rid in ("plan", "old-note"):
                made = await ok(
                    a, "revise", record_id=rid, text=f"Ada's {rid}.", expected_revision=0
                )
                assert made["state"] == "committed" and made["records"][0]["revision"] == 1
                got = (await ok(a, "get", record_id=rid))["record"]
                assert (got["text"], got["revision"]) == (f"Ada's {rid}.", 1)
        async with http_session(served.url + "/mcp", bob) as b:
            history = await ok(b, "history", record_id="plan")
            assert [(r["revision"], r["text"]) for r in history["revisions"]] == [
                (1, "Bob's plan is quokkaz."),
                (2, "Bob's plan is quokkaz v2."),
            ]
            assert (await refused(b, "get", record_id="old-note"))["code"] == "not_found"

    run(main)
    plan = store.get(bob_scope, "plan")
    assert plan is not None and plan.text == "Bob's plan is quokkaz v2." and plan.revision == 2
    assert store.get(ada_scope, "plan").text == "Ada's plan."  # type: ignore[union-attr]
    assert store.history(bob_scope, "old-note") == []


def test_a_token_is_offered_only_its_tools_and_told_why_another_is_refused(
    served: Served, store: Store, worker: Any
) -> None:
    scope = {"user_id": "reader-only"}
    secret, _ = store.tokens.create("adaro", scope, can=["recall", "get"], by="test")

    async def main() -> None:
        async with http_session(served.url + "/mcp", secret) as s:
            assert [t.name for t in (await s.list_tools()).tools] == ["recall", "get"]
            for tool, arguments in (
                ("remember", {"text": "Not allowed."}),
                ("forget", {"record_id": "x"}),
                ("revise", {"record_id": "x", "text": "y", "expected_revision": 1}),
                ("history", {"record_id": "x"}),
            ):
                error = await refused(s, tool, **arguments)
                assert error["code"] == "forbidden"
                assert error["message"].startswith(f"the {tool} tool was refused: token adaro")
                assert "it may use recall, get." in error["message"]
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


# -- sessions: a cap per token, idle ones closed ---------------------------------------


def opened(url: str, token: str, **headers: str) -> httpx.Response:
    """An ``initialize`` with extra headers (Host, Origin, ...)."""
    sent = {
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {token}",
        **headers,
    }
    return httpx.post(url + "/mcp", json=INITIALIZE, headers=sent, timeout=10)


def ping(url: str, token: str, session: str) -> httpx.Response:
    headers = {
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {token}",
        "Mcp-Session-Id": session,
        "Mcp-Protocol-Version": "2025-06-18",
    }
    body = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    return httpx.post(url + "/mcp", json=body, headers=headers, timeout=10)


def test_a_token_at_its_session_cap_is_refused_and_another_token_is_not(
    store: Store, dsn: str, redis_url: str, tmp_path: Path, serve_web: Callable[..., Served]
) -> None:
    env = server_env(dsn, redis_url, tmp_path / "home", ENGRAM_MCP_SESSIONS_PER_TOKEN="2")
    served = serve_web(database_url=dsn, redis_url=redis_url, env=env)
    adaro, _ = store.tokens.create(
        "cap-adaro", {"user_id": "ada"}, can=["recall", "get"], by="test"
    )
    bob, _ = store.tokens.create("cap-bob", {"user_id": "bob"}, by="test")

    sessions = []
    for _ in range(2):
        answer = opened(served.url, adaro)
        assert answer.status_code == 200
        sessions.append(answer.headers["mcp-session-id"])
    over = opened(served.url, adaro)
    assert over.status_code == 429
    assert over.json()["error"]["data"]["code"] == "too_many_sessions"
    assert "mcp-session-id" not in over.headers
    # Its sessions are untouched, and bob's initialize is not refused.
    assert all(ping(served.url, adaro, s).status_code == 200 for s in sessions)
    assert opened(served.url, bob).status_code == 200
    # A session ended (DELETE) frees its place.
    ended = httpx.delete(
        served.url + "/mcp",
        headers={"Authorization": f"Bearer {adaro}", "Mcp-Session-Id": sessions[0]},
        timeout=10,
    )
    assert ended.status_code == 200
    assert opened(served.url, adaro).status_code == 200
    assert opened(served.url, adaro).status_code == 429


def test_an_idle_session_is_closed_and_frees_its_place(
    store: Store, dsn: str, redis_url: str, tmp_path: Path, serve_web: Callable[..., Served]
) -> None:
    env = server_env(
        dsn,
        redis_url,
        tmp_path / "home",
        ENGRAM_MCP_SESSIONS_PER_TOKEN="1",
        ENGRAM_MCP_SESSION_IDLE="1s",
    )
    served = serve_web(database_url=dsn, redis_url=redis_url, env=env)
    ada, _ = store.tokens.create("idle-ada", {"user_id": "ada"}, by="test")
    first = opened(served.url, ada)
    assert first.status_code == 200
    # Refused while the first is open; admitted once the server closed it for idling
    # (the refused attempts are not requests of that session: they do not keep it up).
    wait_until(
        lambda: opened(served.url, ada).status_code == 200,
        timeout=30,
        interval=0.5,
        what="the idle session to be closed",
    )
    assert ping(served.url, ada, first.headers["mcp-session-id"]).status_code == 404


# -- Host and Origin, against DNS rebinding --------------------------------------------


def test_a_foreign_host_or_origin_is_refused_before_any_session(
    store: Store, dsn: str, redis_url: str, tmp_path: Path, serve_web: Callable[..., Served]
) -> None:
    env = server_env(dsn, redis_url, tmp_path / "home", ENGRAM_MCP_SESSIONS_PER_TOKEN="1")
    served = serve_web(database_url=dsn, redis_url=redis_url, env=env)
    ada, _ = store.tokens.create("origin-ada", {"user_id": "ada"}, by="test")
    port = served.url.rsplit(":", 1)[1]

    rebound = opened(served.url, ada, Host=f"evil.example:{port}", Origin="http://evil.example")
    assert rebound.status_code == 400
    assert rebound.json()["error"]["data"]["code"] == "invalid_request"
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null"):
        foreign = opened(served.url, ada, Origin=origin)
        assert foreign.status_code == 403, origin
        assert foreign.json()["error"]["data"]["code"] == "forbidden"
    # None of them opened a session (the token's one place is free), and the server's
    # own names pass, with or without an Origin.
    own = opened(served.url, ada, Host=f"localhost:{port}", Origin=f"http://localhost:{port}")
    assert own.status_code == 200
    assert opened(served.url, ada).status_code == 429  # its one session is that one


# -- derived operation ids without a session -------------------------------------------

MODERN = "2026-07-28"


def stateless_call(
    url: str, token: str, tool: str, arguments: dict[str, Any], client: str | None = None
) -> dict[str, Any]:
    """A ``tools/call`` of the stateless protocol: no initialize, no session id."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {token}",
        "Mcp-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
        **({"Engram-Client-Id": client} if client is not None else {}),
    }
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta},
    }
    answer = httpx.post(url + "/mcp", json=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert "mcp-session-id" not in answer.headers
    result: dict[str, Any] = answer.json()["result"]
    assert not result.get("isError"), result
    structured: dict[str, Any] = result["structuredContent"]
    return structured


def test_identical_writes_of_two_clients_without_a_session_are_both_applied(
    served: Served, store: Store, worker: Any
) -> None:
    scope = {"user_id": "two-clients"}
    laptop, _ = store.tokens.create("ada-laptop", scope, by="test")
    phone, _ = store.tokens.create("ada-phone", scope, by="test")
    note = {"text": "Ada takes her tea without sugar."}

    # Two tokens of one scope, each its own client.
    first = stateless_call(served.url, laptop, "remember", note)
    second = stateless_call(served.url, phone, "remember", note)
    # One token, two clients naming themselves.
    third = stateless_call(served.url, laptop, "remember", note, client="laptop-1")
    fourth = stateless_call(served.url, laptop, "remember", note, client="laptop-2")
    # One token, a client naming nothing: each write its own operation.
    fifth = stateless_call(served.url, laptop, "remember", note)
    answers = [first, second, third, fourth, fifth]
    assert all(a["state"] == "committed" and not a["replayed"] for a in answers)
    assert len({a["operation_id"] for a in answers}) == 5
    assert len({a["records"][0]["id"] for a in answers}) == 5
    # A named client's retry of the same write applies once.
    again = stateless_call(served.url, laptop, "remember", note, client="laptop-1")
    assert again["replayed"] and again["operation_id"] == third["operation_id"]
    assert store.scope_revision(scope) == 5


# -- bounded reads ---------------------------------------------------------------------


def test_history_answers_a_bounded_page_and_pages_back(
    served: Served, store: Store, worker: Any
) -> None:
    scope = {"user_id": "long-history"}
    [made] = store.execute([Operation.build("remember", scope, {"text": "v1"})], EMBEDDER)
    assert isinstance(made, WriteResult)
    rid = made.records[0].id
    revises = [
        Operation.build("revise", scope, {"id": rid, "text": f"v{n}", "expected_revision": n - 1})
        for n in range(2, 131)
    ]
    store.execute(revises, EMBEDDER)
    secret, _ = store.tokens.create("long-reader", scope, by="test")

    async def main() -> list[int]:
        async with http_session(served.url + "/mcp", secret) as s:
            page = await ok(s, "history", record_id=rid)
            assert [r["revision"] for r in page["revisions"]] == list(range(111, 131))
            assert page["truncated"] and page["next_before_revision"] == 111
            widest = await ok(s, "history", record_id=rid, limit=100)
            assert [r["revision"] for r in widest["revisions"]] == list(range(31, 131))
            assert (await refused(s, "history", record_id=rid, limit=101))["code"] == (
                "invalid_request"
            )
            seen: list[int] = []
            before = None
            while True:  # paging back, oldest page last
                args = {"before_revision": before} if before is not None else {}
                page = await ok(s, "history", record_id=rid, limit=50, **args)
                seen = [r["revision"] for r in page["revisions"]] + seen
                before = page["next_before_revision"]
                if not page["truncated"]:
                    return seen

    assert run(main) == list(range(1, 131))
    # The read log holds what was returned, each page's revisions once.
    logged = [r.revision for r in store.tokens.reads_by_token("long-reader", limit=1000)]
    assert len(logged) == 20 + 100 + 130


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
