"""The export format and its conversion back into operations, without any server."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engram.store.errors import InvalidRequestError
from engram.store.limits import MAX_STORED_METADATA_BYTES
from engram.store.mem0 import from_mem0
from engram.store.portable import (
    TOMBSTONE_TEXT,
    convert,
    export_lines,
    import_operation_id,
    record_operations,
)
from engram.store.read.dump import History, ReceiptEntry, Tombstone
from engram.store.values import Link, Receipt, Record, RecordRef, Scope, Source

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SCOPE = Scope(user_id="ada")


def revision(n: int, text: str, status: str = "active", **kw: Any) -> Record:
    fields: dict[str, Any] = {
        "id": "mem_1",
        "revision": n,
        "scope": SCOPE,
        "text": text,
        "kind": "semantic",
        "importance": None,
        "metadata": {},
        "origin": "inferred",
        "sources": (Source(kind="user", message_id="m1", digest="sha256:x"),),
        "links": (),
        "status": status,
        "digest": "sha256:y",
        "operation_id": f"op_{n}",
        "recorded_at": NOW - timedelta(days=10 - n),
        "expires_at": None,
    }
    fields.update(kw)
    return Record(**fields)


def lines_of(*items: Any) -> list[dict[str, Any]]:
    return list(export_lines(items, scope=SCOPE, exported_at=NOW))


def as_text(lines: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(line) + "\n" for line in lines)


def test_an_export_has_a_header_records_tombstones_and_receipts() -> None:
    history = History("mem_1", (revision(1, "London"), revision(2, "Paris")))
    tombstone = Tombstone("mem_gone", SCOPE, NOW, "op_forget")
    receipt = Receipt("op_1", "remember", SCOPE, 1, NOW, (RecordRef("mem_1", 1, "active"),))
    lines = lines_of(history, tombstone, ReceiptEntry(receipt, {"text": "London"}))
    assert [line["type"] for line in lines] == ["export", "record", "tombstone", "receipt"]
    assert lines[0] == {
        "type": "export",
        "format": "engram",
        "version": 1,
        "scope": {"user_id": "ada"},
        "exported_at": NOW.isoformat(),
    }
    assert [r["text"] for r in lines[1]["revisions"]] == ["London", "Paris"]
    assert lines[1]["revisions"][0]["sources"] == [
        {"kind": "user", "message_id": "m1", "digest": "sha256:x"}
    ]
    assert set(lines[2]) == {"type", "id", "scope", "forgotten_at", "operation_id"}  # no text
    assert lines[3]["request"] == {"text": "London"} and lines[3]["operation_id"] == "op_1"


def test_a_revision_chain_becomes_the_operations_that_write_it_again() -> None:
    chain = History(
        "mem_1",
        (
            revision(1, "London", links=(Link("about", "mem_0"),), importance=0.5),
            revision(2, "Paris", metadata={"k": 1}, importance=0.5),
            revision(3, "Paris", status="retracted", metadata={"k": 1}, importance=0.5),
            revision(4, "Paris", metadata={"k": 1}, importance=0.5),  # restored
        ),
    )
    ops = convert(as_text(lines_of(chain)), now=NOW).operations
    assert [op.kind for op in ops] == ["remember", "revise", "retract", "revise"]
    assert [op.operation_id for op in ops] == [f"import:mem_1:{n}" for n in (1, 2, 3, 4)]
    first = ops[0].request.to_dict()
    assert first["id"] == "mem_1" and first["origin"] == "inferred"
    assert first["sources"] == [{"kind": "user", "message_id": "m1", "digest": "sha256:x"}]
    assert first["links"] == [{"relation": "about", "id": "mem_0"}]
    assert [op.request.to_dict().get("expected_revision") for op in ops[1:]] == [1, 2, 3]
    assert ops[1].request.to_dict()["metadata"] == {"k": 1}
    assert ops[1].request.to_dict()["links"] == []  # cleared, as revision 2 has none
    assert all(op.scope == SCOPE for op in ops)


def test_a_record_holding_a_document_in_its_metadata_is_imported_whole() -> None:
    """A LangGraph item keeps its value in its record's metadata, up to
    MAX_STORED_METADATA_BYTES: its export imports again, far over the 16,000 bytes of
    metadata the doors take; over the stored bound it is refused by line."""
    doc = {"langgraph": {"value": {"body": "x" * 200_000}}}
    chain = History("mem_1", (revision(1, "doc", metadata=doc), revision(2, "doc", metadata=doc)))
    ops = convert(as_text(lines_of(chain)), now=NOW).operations
    assert [op.request.to_dict()["metadata"] for op in ops] == [doc, doc]
    huge = {"body": "x" * MAX_STORED_METADATA_BYTES}
    with pytest.raises(InvalidRequestError, match=f"larger than {MAX_STORED_METADATA_BYTES}"):
        convert(as_text(lines_of(History("mem_1", (revision(1, "doc", metadata=huge),)))), now=NOW)


def test_the_same_input_gives_the_same_operations() -> None:
    expiring = revision(1, "London", expires_at=NOW + timedelta(days=1))
    text = as_text(lines_of(History("mem_1", (expiring,))))
    once, again = convert(text, now=NOW), convert(text, now=NOW + timedelta(hours=1))
    assert [(o.operation_id, o.digest) for o in once.operations] == [
        (o.operation_id, o.digest) for o in again.operations
    ]


def test_expiry_is_carried_over_as_the_time_left_and_an_expired_record_is_skipped() -> None:
    live = History("mem_1", (revision(1, "soon", expires_at=NOW + timedelta(hours=2)),))
    ops = record_operations(lines_of(live)[1], NOW)
    assert ops[0].request.to_dict()["ttl_ms"] == 2 * 3600 * 1000
    gone = History("mem_2", (revision(1, "past", expires_at=NOW - timedelta(seconds=1)),))
    converted = convert(as_text(lines_of(live, gone)), now=NOW)
    assert converted.records == 1 and converted.skipped == {"expired": 1}
    # An expiry a later revision changes again keeps the record alive meanwhile.
    extended = History(
        "mem_3",
        (
            revision(1, "a", expires_at=NOW - timedelta(days=1)),
            revision(2, "b", expires_at=NOW + timedelta(minutes=5)),
        ),
    )
    ttls = [
        op.request.to_dict().get("ttl_ms") for op in record_operations(lines_of(extended)[1], NOW)
    ]
    assert ttls == [3600 * 1000, 5 * 60 * 1000]


def test_a_tombstone_is_imported_as_a_content_free_record_forgotten_at_once() -> None:
    ops = convert(as_text(lines_of(Tombstone("mem_gone", SCOPE, NOW, "op_f"))), now=NOW).operations
    assert [op.kind for op in ops] == ["remember", "forget"]
    assert ops[0].request.to_dict()["text"] == TOMBSTONE_TEXT


def test_a_bad_line_is_refused_by_number_and_converts_nothing() -> None:
    good = as_text(lines_of(History("mem_1", (revision(1, "London"),))))
    bad_text = json.dumps(
        {
            "type": "record",
            "id": "mem_2",
            "scope": {"user_id": "ada"},
            "revisions": [{"revision": 1, "text": "Secret \ud800"}],
        }
    )
    for text, says in (
        (good + "not json\n", "line 3: not JSON"),
        (good + bad_text + "\n", "line 3: remember.text is not valid Unicode"),
        (good + '{"type": "record", "id": "x"}\n', "line 3: not a well-formed line"),
        (good + '{"type": "mystery"}\n', "line 3: unknown line type"),
        ('{"type": "export", "format": "engram", "version": 2}\n', "line 1: not an engram export"),
    ):
        with pytest.raises(InvalidRequestError) as info:
            convert(text, now=NOW)
        assert says in info.value.message
        assert "Secret" not in info.value.message and "London" not in info.value.message


def test_a_long_record_id_still_gives_a_valid_operation_id() -> None:
    op_id = import_operation_id("m" * 200, 3)
    assert len(op_id) <= 200 and op_id.endswith(":3")
    assert op_id == import_operation_id("m" * 200, 3)


MEM0 = [
    {
        "id": "f38b689d-6b24-45b7-bced-17fbb4d8bac7",
        "memory": "Travelling to Paris",
        "hash": "62bc074f56d1f909f1b4c2b639f56f6a",
        "metadata": {"category": "travel"},
        "created_at": "2023-02-25T23:57:00.108347-07:00",
        "updated_at": "2024-07-25T23:57:00.108367-07:00",
        "user_id": "alex",
        "role": "user",
    },
    {
        "id": "0b0c5d2e-8d6f-4b4a-9a7e-0d6f1f5a2b11",
        "memory": "Prefers window seats",
        "hash": "aa",
        "metadata": None,
        "created_at": "2023-02-25T23:57:00-07:00",
        "updated_at": None,
        "agent_id": "travel-bot",
        "run_id": "r1",
    },
]


@pytest.mark.parametrize(
    "shape",
    [
        lambda items: json.dumps(items),  # get_all, the list
        lambda items: json.dumps({"results": items, "relations": []}),  # the newer shape
        lambda items: "".join(json.dumps(i) + "\n" for i in items),  # one per line
    ],
)
def test_mem0_memories_become_remembers_in_their_scopes(shape: Any) -> None:
    converted = convert(shape(MEM0), now=NOW)
    assert converted.format == "mem0" and converted.records == 2
    first, second = (op.to_dict() for op in converted.operations)
    assert first["operation_id"] == "import:mem0:f38b689d-6b24-45b7-bced-17fbb4d8bac7"
    assert first["scope"] == {"user_id": "alex"}
    assert second["scope"] == {"agent_id": "travel-bot", "run_id": "r1"}
    request = first["request"]
    assert request["id"] == MEM0[0]["id"] and request["text"] == "Travelling to Paris"
    assert request["origin"] == "inferred" and request["sources"][0]["kind"] == "user"
    assert request["metadata"]["category"] == "travel"
    assert request["metadata"]["mem0"]["hash"] == MEM0[0]["hash"]
    assert second["request"]["sources"][0]["kind"] == "external"


def test_a_mem0_memory_without_a_scope_needs_one_given() -> None:
    item = {"id": "m1", "memory": "No owner"}
    with pytest.raises(InvalidRequestError, match="needs --scope"):
        from_mem0(item, None)
    assert from_mem0(item, Scope(user_id="bob")).scope == Scope(user_id="bob")
    with pytest.raises(InvalidRequestError, match="line 1: a mem0 memory needs an id"):
        convert(json.dumps([{"memory": "x", "user_id": "a"}]), now=NOW)
