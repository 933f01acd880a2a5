"""Which operations, as sent, may hold a forgotten record's text (pure logic)."""

from __future__ import annotations

import json

import pytest

from engram.jobs.listeners.matching import Forgotten
from engram.store import Scope
from engram.store.write.operations import derived_record_id

SCOPE = {"user_id": "ada"}
KEY = Scope.of(SCOPE).key
GONE = Forgotten.of(
    [(KEY, "rec-1"), (KEY, derived_record_id(KEY, "op-remember", 0))], [(KEY, "op-wrote-it")]
)


def op(
    kind: str, request: dict[str, object], operation_id: str = "op-x", scope: object = SCOPE
) -> str:
    return json.dumps(
        {"operation_id": operation_id, "kind": kind, "scope": scope, "request": request}
    )


@pytest.mark.parametrize(
    ("raw", "holds"),
    [
        (op("revise", {"id": "rec-1", "text": "t"}), True),
        (op("revise", {"id": "rec-1", "metadata": {"m": "t"}}), True),
        (op("remember", {"text": "t", "id": "rec-1"}), True),
        (op("remember", {"text": "t"}, "op-remember"), True),  # would create it
        (op("remember", {"text": "t"}, "op-wrote-it"), True),  # wrote it
        (op("revise", {"id": "rec-2", "text": "t"}), False),
        # A record id is its scope's: bob's rec-1 is another record (issue 36).
        (op("revise", {"id": "rec-1", "text": "t"}, scope={"user_id": "bob"}), False),
        # Whose it is cannot be read: held, to be safe.
        (op("revise", {"id": "rec-1", "text": "t"}, scope=42), True),
        (op("remember", {"text": "t"}, "op-other"), False),
        # The same operation ids in another scope are other operations (issue 36).
        (op("remember", {"text": "t"}, "op-wrote-it", {"user_id": "bob"}), False),
        (op("remember", {"text": "t"}, "op-remember", {"user_id": "bob"}), False),
        (op("forget", {"id": "rec-1"}), False),  # ids only
        (op("retract", {"id": "rec-1"}), False),
        # Not a valid operation (here: an unknown field), still recognised by its id.
        (op("revise", {"id": "rec-1", "text": "t", "bogus": 1}), True),
        ("not json", False),
        ("[1, 2]", False),
        (None, False),
    ],
)
def test_holds(raw: str | None, holds: bool) -> None:
    assert GONE.holds(raw) is holds


def test_an_extract_whose_derived_ids_include_the_record_holds_it() -> None:
    messages = [{"id": f"m{i}", "message": {"role": "user", "content": f"c{i}"}} for i in range(3)]
    gone = Forgotten.of([(KEY, derived_record_id(KEY, "op-extract", 2))], [])
    assert gone.holds(op("extract", {"messages": messages}, "op-extract"))
    assert not gone.holds(op("extract", {"messages": messages[:2]}, "op-extract"))


def test_a_dead_letter_is_matched_by_its_scope_and_its_operation_id() -> None:
    unreadable = json.dumps({"operation_id": "op-wrote-it", "scope": SCOPE, "kind": "nope"})
    assert GONE.wrote("op-wrote-it", unreadable)
    other = json.dumps({"operation_id": "op-wrote-it", "scope": {"user_id": "bob"}})
    assert not GONE.wrote("op-wrote-it", other)
    assert not GONE.wrote("op-wrote-it", None)
