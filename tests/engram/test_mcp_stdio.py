"""``engram mcp --scope`` over stdio, driven by the SDK's own client, against a real
PostgreSQL, valkey and stream worker: the tools' contract, the scope that no argument
changes, refusals a model can act on, and a server that keeps serving."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from jsonschema import Draft202012Validator

from engram.store import Scope, Store
from engram.worker import keys
from engram.worker.embedded.runtime import connect_redis
from tests.helpers import rows_containing
from tests.mcp_support import (
    TOOLS,
    call,
    ok,
    refused,
    run,
    server_env,
    stdio_session,
    texts,
)
from tests.redis_fixtures import InProcessWorker, wait_until

SCOPE_FIELDS = {"user_id", "agent_id", "run_id", "actor_id", "chat_id", "scope"}


@pytest.fixture
def env(store: Store, dsn: str, redis_url: str, tmp_path: Path) -> dict[str, str]:
    """The servers' (``store`` migrated the database)."""
    return server_env(dsn, redis_url, tmp_path / "home")


@pytest.fixture
def worker(store: Store, start_worker: Callable[..., InProcessWorker]) -> Any:
    with start_worker(store) as running:
        yield running


def test_the_tools_offered_and_no_scope_in_any_schema(env: dict[str, str], tmp_path: Path) -> None:
    async def main() -> list[Any]:
        async with stdio_session({"user_id": "lister"}, env, tmp_path / "mcp.log") as s:
            return (await s.list_tools()).tools

    tools = run(main)
    assert tuple(t.name for t in tools) == TOOLS  # extract only with a model
    for tool in tools:
        schema = tool.input_schema
        assert schema["additionalProperties"] is False, tool.name
        assert not SCOPE_FIELDS & set(schema["properties"]), tool.name
        assert "scope" not in json.dumps(schema["properties"]).lower(), tool.name
        assert tool.description and len(tool.description) > 80, tool.name
    limits = {t.name: t.input_schema["properties"] for t in tools}
    assert limits["remember"]["text"]["maxLength"] == 32_000
    assert limits["recall"]["top_k"]["maximum"] == 100


def test_remember_recall_revise_history_forget(
    env: dict[str, str], tmp_path: Path, dsn: str, worker: Any
) -> None:
    secret = "Ada keeps her spare key under the QUOKKAFERN planter."

    async def main() -> None:
        async with stdio_session({"user_id": "ada"}, env, tmp_path / "mcp.log") as s:
            remembered = await call(s, "remember", text=secret, importance=0.9)
            assert not remembered.is_error
            data = remembered.structured_content
            assert data["state"] == "committed"
            [record] = data["records"]
            rid = record["id"]
            assert record["revision"] == 1
            # The short text quotes no memory; the record's text is data, in fields.
            assert all("QUOKKAFERN" not in t for t in texts(remembered)[:1])

            found = await call(s, "recall", query="where is the spare key?")
            assert texts(found)[0] == "1 record found"
            [hit] = found.structured_content["records"]
            assert hit["record"]["id"] == rid and hit["record"]["text"] == secret

            revised = await ok(
                s, "revise", record_id=rid, text=secret + " Moved.", expected_revision=1
            )
            assert revised["records"][0]["revision"] == 2
            stale = await refused(
                s, "revise", record_id=rid, text="Someone else's idea.", expected_revision=1
            )
            assert stale["code"] == "revision_conflict"
            assert (stale["expected"], stale["actual"]) == (1, 2)

            history = await ok(s, "history", record_id=rid)
            assert [r["revision"] for r in history["revisions"]] == [1, 2]
            assert history["revisions"][0]["text"] == secret
            got = await ok(s, "get", record_id=rid)
            assert got["record"]["revision"] == 2

            forgot = await ok(s, "forget", record_id=rid, reason="asked by Ada")
            assert forgot["revisions"] == [1, 2]
            assert (await ok(s, "recall", query="spare key planter"))["records"] == []
            assert (await refused(s, "get", record_id=rid))["code"] == "not_found"
            assert (await refused(s, "history", record_id=rid))["code"] == "not_found"

    run(main)
    with psycopg.connect(dsn) as conn:
        assert rows_containing(conn, "QUOKKAFERN") == []


def test_another_scope_sees_nothing_and_no_argument_changes_the_scope(
    env: dict[str, str], tmp_path: Path, store: Store, worker: Any
) -> None:
    ada, eve = {"user_id": "ada-2"}, {"user_id": "eve-2"}

    async def main() -> None:
        log = tmp_path / "mcp.log"
        async with stdio_session(ada, env, log) as a:
            rid = (await ok(a, "remember", text="Ada's PIN is 4321."))["records"][0]["id"]
        async with stdio_session(eve, env, log) as e:
            theirs = await refused(e, "get", record_id=rid)
            never = await refused(e, "get", record_id="never-used-id")
            assert theirs["code"] == never["code"] == "not_found"
            assert theirs["message"].replace(rid, "X") == never["message"].replace(
                "never-used-id", "X"
            )
            assert (await refused(e, "history", record_id=rid))["code"] == "not_found"
            assert (await ok(e, "recall", query="Ada's PIN"))["records"] == []
            stale = await refused(e, "revise", record_id=rid, text="x", expected_revision=1)
            assert stale == {
                **(await refused(e, "revise", record_id="nope", text="x", expected_revision=1)),
                "message": stale["message"],
            }
            assert stale["code"] == "not_found"
            before = store.scope_revision(ada), store.scope_revision(eve)
            # A call naming a scope, or one of its fields, changes nothing.
            for extra in ({"user_id": "ada-2"}, {"scope": ada}, {"agent_id": "x"}):
                error = await refused(e, "remember", text="Eve was here.", **extra)
                assert error["code"] == "invalid_request"
                assert error["problems"][0]["field"] == next(iter(extra))
                error = await refused(e, "recall", query="PIN", **extra)
                assert error["code"] == "invalid_request"
            assert (store.scope_revision(ada), store.scope_revision(eve)) == before

    run(main)
    assert [r.text for r in store.records(ada)] == ["Ada's PIN is 4321."]


def test_bad_input_is_a_typed_error_and_the_server_keeps_serving(
    env: dict[str, str], tmp_path: Path, worker: Any
) -> None:
    async def main() -> None:
        async with stdio_session({"user_id": "bad"}, env, tmp_path / "mcp.log") as s:
            oversized = await refused(s, "remember", text="x" * 32_001)
            assert oversized["code"] == "invalid_request"
            assert oversized["problems"] == [
                {"field": "text", "problem": "String should have at most 32000 characters"}
            ]
            wrong = await refused(s, "recall", query="tea", top_k="five")
            assert wrong["problems"][0]["field"] == "top_k"
            assert (await refused(s, "recall", query="tea", top_k=101))["code"] == (
                "invalid_request"
            )
            assert (await refused(s, "get"))["problems"][0]["field"] == "record_id"
            assert (await refused(s, "remember", text="\x00"))["code"] == "invalid_request"
            deep: dict[str, Any] = {}
            for _ in range(40):
                deep = {"a": deep}
            assert (await refused(s, "remember", text="ok", metadata=deep))["code"] == (
                "invalid_request"
            )
            unknown = await refused(s, "delete_everything", record_id="x")
            assert unknown["code"] == "unknown_tool"
            # Still serving.
            assert (await ok(s, "remember", text="Tea, no sugar."))["state"] == "committed"

    run(main)


def test_the_same_operation_applies_once(
    env: dict[str, str], tmp_path: Path, store: Store, worker: Any
) -> None:
    scope = {"user_id": "once"}

    async def main() -> None:
        async with stdio_session(scope, env, tmp_path / "mcp.log") as s:
            first = await ok(s, "remember", text="Likes jasmine tea.", operation_id="op-jasmine")
            again = await ok(s, "remember", text="Likes jasmine tea.", operation_id="op-jasmine")
            assert (first["replayed"], again["replayed"]) == (False, True)
            assert first["records"] == again["records"]
            other = await refused(s, "remember", text="Likes coffee.", operation_id="op-jasmine")
            assert other["code"] == "operation_conflict"
            # No id given: the same request in the same session is the same operation.
            derived = await ok(s, "remember", text="Likes green tea.")
            retried = await ok(s, "remember", text="Likes green tea.")
            assert derived["operation_id"] == retried["operation_id"]
            assert derived["operation_id"].startswith("mcp:")
            assert retried["replayed"] is True
            state = await ok(s, "operation", operation_id="op-jasmine")
            assert state["state"] == "committed"
            assert state["receipt"]["records"] == first["records"]

    run(main)
    texts_kept = sorted(r.text for r in store.records(scope))
    assert texts_kept == ["Likes green tea.", "Likes jasmine tea."]


def test_a_write_past_the_bound_is_queued_and_operation_tells_the_rest(
    env: dict[str, str],
    tmp_path: Path,
    store: Store,
    start_worker: Callable[..., InProcessWorker],
    redis_url: str,
) -> None:
    env = {**env, "ENGRAM_MCP_WAIT_S": "0.2"}
    other = {"user_id": "someone-else"}

    async def main() -> None:
        log = tmp_path / "mcp.log"
        async with stdio_session({"user_id": "queued"}, env, log) as s:
            queued = await ok(s, "remember", text="Written while no worker runs.")
            assert queued["state"] == "queued"
            op_id = queued["operation_id"]
            assert (await ok(s, "operation", operation_id=op_id))["state"] == "queued"
            async with stdio_session(other, env, log) as e:
                # Another scope's operation: as unknown as one never sent.
                assert (await refused(e, "operation", operation_id=op_id))["code"] == "not_found"
            with start_worker(store):
                client = connect_redis(redis_url)
                try:
                    reply = keys.reply(Scope.of({"user_id": "queued"}).key, op_id)
                    wait_until(lambda: client.exists(reply) == 1, timeout=30)
                finally:
                    client.close()
            state = await ok(s, "operation", operation_id=op_id)
            assert state["state"] == "committed"
            assert state["receipt"]["records"][0]["revision"] == 1
            async with stdio_session(other, env, log) as e:
                assert (await refused(e, "operation", operation_id=op_id))["code"] == "not_found"

    run(main)


def test_logs_go_to_stderr_and_hold_no_memory_text(
    env: dict[str, str], tmp_path: Path, worker: Any
) -> None:
    log = tmp_path / "mcp.log"

    async def main() -> None:
        async with stdio_session({"user_id": "logs"}, env, log) as s:
            await ok(s, "remember", text="The WOMBATLANTERN is in the attic.")
            await ok(s, "recall", query="WOMBATLANTERN")
            await refused(s, "remember", text="WOMBATLANTERN", user_id="x")

    run(main)
    logged = log.read_text()
    assert "tool call" in logged  # stderr carried the logs (stdout only the protocol)
    assert "WOMBATLANTERN" not in logged


def test_an_operation_id_of_another_scope_is_another_operation(
    env: dict[str, str], tmp_path: Path, store: Store, worker: Any
) -> None:
    """Issue 36: bob remembers under an id, then forgets the record (its receipt is
    redacted); ada's remember under the same id is applied as hers, not answered with
    bob's receipt as a replay, and her ``operation`` shows her receipt, not his. Ada's
    forget of bob's record is a no-op that writes no audit row naming it."""
    log = tmp_path / "mcp.log"
    bob_scope, ada_scope = {"user_id": "mcp-ids-bob"}, {"user_id": "mcp-ids-ada"}

    async def main() -> tuple[dict[str, Any], dict[str, Any], str]:
        async with stdio_session(bob_scope, env, log) as b:
            kept = await ok(b, "remember", text="Bob's alarm code is 7316.", operation_id="chat-7")
            rid = kept["records"][0]["id"]
            await ok(b, "forget", record_id=rid)
            bobs_record = await ok(b, "remember", text="Bob's other note.")
        async with stdio_session(ada_scope, env, log) as a:
            mine = await ok(a, "remember", text="Ada cycles to work.", operation_id="chat-7")
            state = await ok(a, "operation", operation_id="chat-7")
            noop = await ok(a, "forget", record_id=bobs_record["records"][0]["id"])
            assert noop["revisions"] == [] and noop["already_forgotten"] is False
        return mine, state, bobs_record["records"][0]["id"]

    mine, state, bobs = run(main)
    assert mine["state"] == "committed" and mine["replayed"] is False
    [written] = mine["records"]
    ada_record = store.get(ada_scope, written["id"])
    assert ada_record is not None and ada_record.text == "Ada cycles to work."
    assert state["state"] == "committed" and state["receipt"]["records"] == mine["records"]
    bob_receipt = store.receipt("chat-7", bob_scope)
    assert bob_receipt is not None and bob_receipt.redacted and bob_receipt.replays == 0
    assert store.audit.about(bobs) == []  # item 9: nothing names bob's record
    assert store.get(bob_scope, bobs) is not None


def described(schema: Any, where: str = "") -> list[str]:
    """The properties, anywhere in a JSON Schema, that have no description."""
    missing: list[str] = []
    if isinstance(schema, dict):
        for name, prop in schema.get("properties", {}).items():
            if "description" not in prop:
                missing.append(f"{where}.{name}")
        for key, value in schema.items():
            missing += described(value, f"{where}.{key}" if key != "properties" else where)
    elif isinstance(schema, list):
        for item in schema:
            missing += described(item, where)
    return missing


def test_every_answer_fits_its_output_schema_and_says_what_happened(
    env: dict[str, str], tmp_path: Path, worker: Any
) -> None:
    """Each tool publishes an outputSchema, every field of its input and output is
    described, every answer (refusals too) fits the schema, and the text summary says
    what happened in words a model that reads text only can act on."""

    async def main() -> None:
        async with stdio_session({"user_id": "answers"}, env, tmp_path / "mcp.log") as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert tuple(tools) == TOOLS
            for tool in tools.values():
                assert tool.output_schema is not None, tool.name
                assert tool.output_schema["type"] == "object"
                Draft202012Validator.check_schema(tool.output_schema)
                assert described(tool.input_schema) == [], tool.name
                assert described(tool.output_schema) == [], tool.name

            async def said(tool: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
                result = await call(s, tool, **arguments)
                data = result.structured_content
                Draft202012Validator(tools[tool].output_schema).validate(data)
                return texts(result)[0], data

            text, data = await said("remember", text="Ada walks to work.")
            rid = data["records"][0]["id"]
            assert text == f"remembered {rid} (revision 1)"
            assert (await said("recall", query="walks"))[0] == "1 record found"
            assert (await said("get", record_id=rid))[0] == f"record {rid}, revision 1, active"
            text, _ = await said("revise", record_id=rid, text="Ada cycles.", expected_revision=1)
            assert text == f"revised {rid}: now revision 2"
            text, data = await said("retract", record_id=rid, expected_revision=2)
            assert text == f"retracted {rid} (revision 3): no longer recalled"
            text, data = await said("operation", operation_id=data["operation_id"])
            assert text == (
                f"operation {data['operation_id']} committed:"
                f" retracted {rid} (revision 3): no longer recalled"
            )
            assert (await said("history", record_id=rid))[0] == f"3 revisions of record {rid}"
            text, data = await said("forget", record_id=rid)
            assert text == f"forgot {rid} (3 revisions)"
            assert data["revisions"] == [1, 2, 3]
            text, _ = await said("forget", record_id=rid)  # a retry: the same operation
            assert text == (
                f"forgot {rid} (a replay: it had already committed; nothing was written again)"
            )
            text, data = await said("revise", record_id=rid, text="x", expected_revision=3)
            assert data["error"]["code"] == "not_found" and text.startswith("refused: not_found")
        async with stdio_session({"user_id": "answers"}, env, tmp_path / "mcp.log") as s:
            text, _ = await said("forget", record_id=rid)  # another client: a new operation
            assert text == f"{rid} was already forgotten: nothing more to erase"
            text, _ = await said("forget", record_id="mem_never")
            assert text == "no record mem_never in this memory: nothing forgotten"

    run(main)
