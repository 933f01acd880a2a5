"""Model tools: their definitions, and the executor against a real PostgreSQL
(through a session) and through the streams (through a Producer)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from engram.store import (
    HashingEmbedder,
    InvalidRequestError,
    MemoryTools,
    Scope,
    Store,
    memory_tools,
    tool_definitions,
)
from engram.store.models.tools import tool_operation_id
from engram.worker import Producer
from engram.worker.model_tools import stream_tools
from tests.redis_fixtures import FAST, InProcessWorker


def test_definitions_in_both_shapes() -> None:
    openai = tool_definitions()
    assert [t["function"]["name"] for t in openai] == [
        "memory_remember",
        "memory_recall",
        "memory_revise",
        "memory_retract",
    ]
    remember = openai[0]
    assert remember["type"] == "function"
    assert remember["function"]["parameters"]["required"] == ["text"]
    assert remember["function"]["parameters"]["additionalProperties"] is False
    anthropic = tool_definitions(shape="anthropic", include=["retract", "recall"], prefix="mem")
    assert [t["name"] for t in anthropic] == ["mem_recall", "mem_retract"]
    assert anthropic[1]["input_schema"]["required"] == ["id", "expected_revision"]
    assert "forget" not in json.dumps(openai)  # forgetting is the host's decision
    with pytest.raises(InvalidRequestError, match="unknown memory tool"):
        tool_definitions(include=["remember", "forget"])
    with pytest.raises(InvalidRequestError, match="shape"):
        tool_definitions(shape="gemini")


def make_tools(store: Store, scope: dict[str, str], **options: Any) -> MemoryTools:
    session = store.session(scope, embedder=HashingEmbedder(64))
    return memory_tools(session, run_id="run-1", **options)


def test_remember_writes_an_inferred_record_citing_the_tool_call(
    store: Store, scope: dict[str, str]
) -> None:
    chat_scope = {**scope, "chat_id": "chat-9"}
    tools = make_tools(store, chat_scope)
    answer = tools.execute(
        "memory_remember", '{"text": "Ada prefers window seats."}', step=3, call_id="call-a"
    )
    [ref] = answer["records"]
    assert answer["operation_id"] == tool_operation_id(Scope.of(chat_scope), "run-1", 3, "call-a")
    record = store.get(chat_scope, ref["id"])
    assert record is not None and record.origin == "inferred"
    [source] = record.sources
    assert (source.kind, source.tool_call_id, source.tool_name) == (
        "assistant",
        "call-a",
        "memory_remember",
    )
    assert (source.chat_id, source.run_id) == ("chat-9", "run-1")
    # The same call replayed (after a crash, say) is applied once.
    again = tools.execute(
        "memory_remember", {"text": "Ada prefers window seats."}, step=3, call_id="call-a"
    )
    assert again["records"] == answer["records"]
    assert store.scope_revision(chat_scope) == 1


def test_recall_gives_the_model_what_it_needs_to_revise(
    store: Store, scope: dict[str, str]
) -> None:
    store.session(scope).remember("Ada lives in London.")
    tools = make_tools(store, scope)
    [hit] = tools.execute("memory_recall", {"query": "London"}, step=1, call_id="c1")["records"]
    assert set(hit) == {"id", "revision", "text", "kind", "origin", "source_kinds", "status"}
    assert (hit["revision"], hit["origin"], hit["source_kinds"], hit["status"]) == (
        1,
        "asserted",
        ["host"],
        "active",
    )


def test_revise_and_retract_refuse_asserted_records_as_data(
    store: Store, scope: dict[str, str]
) -> None:
    asserted = store.session(scope).remember("Ada lives in London.").records[0]
    tools = make_tools(store, scope)
    revise = {"id": asserted.id, "expected_revision": 1, "text": "Ada lives in Paris."}
    assert tools.execute("memory_revise", revise, step=1, call_id="c1") == {
        "error": "asserted_record"
    }
    retract = {"id": asserted.id, "expected_revision": 1}
    assert tools.execute("memory_retract", retract, step=1, call_id="c2") == {
        "error": "asserted_record"
    }
    unchanged = store.get(scope, asserted.id)
    assert unchanged is not None and (unchanged.revision, unchanged.text) == (
        1,
        "Ada lives in London.",
    )


def test_revise_and_retract_of_inferred_records_and_their_problems(
    store: Store, scope: dict[str, str]
) -> None:
    tools = make_tools(store, scope)
    made = tools.execute("memory_remember", {"text": "Ada likes tea."}, step=1, call_id="c1")
    rid = made["records"][0]["id"]
    revised = tools.execute(
        "memory_revise",
        {"id": rid, "expected_revision": 1, "text": "Ada likes green tea."},
        step=2,
        call_id="c2",
    )
    assert revised["records"] == [{"id": rid, "revision": 2, "status": "active"}]
    record = store.get(scope, rid)
    assert record is not None and record.text == "Ada likes green tea."
    assert [s.tool_call_id for s in record.sources] == ["c1", "c2"]  # both calls cited
    stale = tools.execute(
        "memory_retract", {"id": rid, "expected_revision": 1}, step=3, call_id="c3"
    )
    assert stale == {"error": "revision_conflict", "actual_revision": 2}
    done = tools.execute(
        "memory_retract", {"id": rid, "expected_revision": 2}, step=4, call_id="c4"
    )
    assert done["records"] == [{"id": rid, "revision": 3, "status": "retracted"}]
    missing = {"id": "mem_nope", "expected_revision": 1}
    assert tools.execute("memory_retract", missing, step=5, call_id="c5") == {"error": "not_found"}
    store.session(scope).forget(rid)
    gone = {"id": rid, "expected_revision": 3, "text": "Ada likes tea again."}
    assert tools.execute("memory_revise", gone, step=6, call_id="c6") == {"error": "not_found"}


@pytest.mark.parametrize(
    "name, arguments, message",
    [
        ("memory_remember", "{not json", "not JSON"),
        ("memory_remember", {}, "text must be a string"),
        ("memory_remember", {"text": "x", "origin": "asserted"}, "unknown field"),
        ("memory_remember", {"text": "x", "importance": 7}, "between 0 and 1"),
        ("memory_revise", {"id": "m", "text": "x"}, "expected_revision is required"),
        ("memory_recall", {"query": "x", "top_k": 500}, "between 1 and 20"),
    ],
)
def test_bad_arguments_are_answered_as_data(
    store: Store, scope: dict[str, str], name: str, arguments: Any, message: str
) -> None:
    answer = make_tools(store, scope).execute(name, arguments, step=1, call_id="c1")
    assert answer["error"] == "invalid_request" and message in answer["message"]
    assert store.scope_revision(scope) == 0


def test_include_prefix_and_run(store: Store, scope: dict[str, str]) -> None:
    read_only = make_tools(store, scope, include=["recall"], prefix="notes")
    assert read_only.names == ["notes_recall"]
    assert [d["function"]["name"] for d in read_only.definitions()] == ["notes_recall"]
    answer = read_only.execute("notes_remember", {"text": "x"}, step=1, call_id="c1")
    assert answer["error"] == "unknown_tool"
    with pytest.raises(InvalidRequestError, match="run_id"):
        memory_tools(store.session(scope))
    assert memory_tools(store.session({**scope, "run_id": "r7"})).run_id == "r7"


def test_through_the_streams(
    store: Store,
    start_worker: Callable[..., InProcessWorker],
    redis_url: str,
    scope: dict[str, str],
) -> None:
    producer = Producer.from_url(redis_url, partitions=FAST.partitions)
    session = store.session(scope, embedder=HashingEmbedder(64))
    asserted = session.remember("Ada lives in London.").records[0]
    tools = stream_tools(
        producer,
        scope,
        run_id="run-s",
        recall=session.recall,
    )
    with start_worker(store):
        made = tools.execute("memory_remember", {"text": "Ada likes tea."}, step=1, call_id="c1")
        again = tools.execute("memory_remember", {"text": "Ada likes tea."}, step=1, call_id="c1")
        assert made["records"] == again["records"] and store.scope_revision(scope) == 2
        refused = tools.execute(
            "memory_retract", {"id": asserted.id, "expected_revision": 1}, step=2, call_id="c2"
        )
        assert refused == {"error": "asserted_record"}
        hits = tools.execute("memory_recall", {"query": "tea"}, step=3, call_id="c3")
    best = hits["records"][0]
    assert (best["text"], best["origin"]) == ("Ada likes tea.", "inferred")
    with pytest.raises(InvalidRequestError, match="recall"):
        stream_tools(producer, scope, run_id="r")  # no reader: leave recall out
    assert stream_tools(producer, scope, run_id="r", include=["remember"]).names == [
        "memory_remember"
    ]
