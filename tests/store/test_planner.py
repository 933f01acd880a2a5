"""The planner without a database: a scope's state and a batch of operations in, the
plan out (``store.write.planner.plan_batch`` is pure). Each row of the table is what a
user relies on: a revision rule, a conflict, a replay, a forget."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from engram.store import Operation, Scope
from engram.store.errors import EngramError, OperationConflictError, RevisionConflictError
from engram.store.values import Source
from engram.store.write.planner import (
    Applied,
    Current,
    PlanContext,
    Replayed,
    ScopeState,
    StoredReceipt,
    plan_batch,
)

SCOPE = {"user_id": "ada"}
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
CTX = PlanContext(now=NOW, digest_key=b"k" * 32)


def current(record_id: str, text: str, *, revision: int = 1, status: str = "active") -> Current:
    return Current(
        id=record_id, revision=revision, status=status, text=text, kind="fact",
        importance=None, metadata={}, origin="asserted",
        sources=(Source(kind="host", digest="sha256:0"),), links=(), digest="sha256:0",
        expires_at=None, created_at=NOW, revisions=tuple(range(1, revision + 1)),
    )  # fmt: skip


def state(*records: Current, receipts: dict[str, StoredReceipt] | None = None) -> ScopeState:
    return ScopeState(
        scope_id=1, scope=Scope.of(SCOPE), revision=7,
        records={r.id: r for r in records}, forgotten={"mem_forgotten"},
        receipts=dict(receipts or {}),
    )  # fmt: skip


def op(kind: str, request: dict[str, Any], op_id: str | None = None) -> Operation:
    return Operation.build(kind, SCOPE, request, op_id)


@dataclass
class Row:
    why: str
    records: list[Current]
    ops: list[Operation]
    # Per operation: ("applied", {record id: (revision, status, text)}) or an error class
    # or "replayed".
    expect: list[Any]
    scope_revision: int
    receipts: dict[str, StoredReceipt] = field(default_factory=dict)


ADA = current("mem_ada", "Ada lives in London.")
RETRACTED = current("mem_old", "Ada had a dog.", revision=2, status="retracted")
SAME_ID = "op_same"

TABLE = [
    Row(
        "a remember creates revision 1 and moves the scope on",
        [],
        [op("remember", {"id": "mem_new", "text": "Ada likes tea."})],
        [("applied", {"mem_new": (1, "active", "Ada likes tea.")})],
        8,
    ),
    Row(
        "a revise at the expected revision writes the next one",
        [ADA],
        [op("revise", {"id": "mem_ada", "text": "Ada lives in Paris.", "expected_revision": 1})],
        [("applied", {"mem_ada": (2, "active", "Ada lives in Paris.")})],
        8,
    ),
    Row(
        "a stale expected revision is a conflict and changes nothing",
        [ADA],
        [op("revise", {"id": "mem_ada", "text": "Ada lives in Rome.", "expected_revision": 3})],
        [RevisionConflictError],
        7,
    ),
    Row(
        "two revises in one batch: the second sees the first",
        [ADA],
        [
            op("revise", {"id": "mem_ada", "text": "Paris.", "expected_revision": 1}),
            op("revise", {"id": "mem_ada", "text": "Rome.", "expected_revision": 2}),
        ],
        [
            ("applied", {"mem_ada": (2, "active", "Paris.")}),
            ("applied", {"mem_ada": (3, "active", "Rome.")}),
        ],
        9,
    ),
    Row(
        "a retract writes a retracted revision; a revise restores it",
        [RETRACTED, ADA],
        [
            op("retract", {"id": "mem_ada", "expected_revision": 1}),
            op("revise", {"id": "mem_old", "text": "Ada has a cat.", "expected_revision": 2}),
        ],
        [
            ("applied", {"mem_ada": (2, "retracted", "Ada lives in London.")}),
            ("applied", {"mem_old": (3, "active", "Ada has a cat.")}),
        ],
        9,
    ),
    Row(
        "revise with expected revision 0 creates, and refuses an id that exists",
        [ADA],
        [
            op("revise", {"id": "mem_fresh", "text": "New.", "expected_revision": 0}),
            op("revise", {"id": "mem_ada", "text": "Again.", "expected_revision": 0}),
        ],
        [("applied", {"mem_fresh": (1, "active", "New.")}), RevisionConflictError],
        8,
    ),
    Row(
        "an id forgotten in this scope cannot be created again",
        [],
        [op("revise", {"id": "mem_forgotten", "text": "Mine.", "expected_revision": 0})],
        [RevisionConflictError],
        7,
    ),
    Row(
        "an operation id already committed replays; with another request it conflicts",
        [ADA],
        [
            op("remember", {"text": "Ada likes tea."}, SAME_ID),
            op("remember", {"text": "Ada likes coffee."}, "op_other"),
        ],
        ["replayed", OperationConflictError],
        7,
        receipts={},
    ),
]


@pytest.mark.parametrize("row", TABLE, ids=[r.why for r in TABLE])
def test_the_planner_table(row: Row) -> None:
    receipts = dict(row.receipts)
    if row.expect and row.expect[0] == "replayed":
        # What was committed before under these ids: the same request, another request.
        receipts[SAME_ID] = StoredReceipt(SAME_ID, CTX.request_digest(row.ops[0]))
        receipts["op_other"] = StoredReceipt("op_other", CTX.request_digest(row.ops[0]))
    plan = plan_batch(state(*row.records, receipts=receipts), row.ops, CTX)
    assert len(plan.outcomes) == len(row.expect)
    for outcome, expected in zip(plan.outcomes, row.expect, strict=True):
        if expected == "replayed":
            assert isinstance(outcome, Replayed)
        elif isinstance(expected, type) and issubclass(expected, EngramError):
            assert isinstance(outcome, expected), outcome
        else:
            assert isinstance(outcome, Applied), outcome
            written = {w.record.id: (w.record.revision, w.record.status, w.record.text)
                       for w in outcome.written}  # fmt: skip
            assert written == expected[1]
    assert plan.scope_revision == row.scope_revision


def test_a_forget_leaves_a_tombstone_and_every_revision_to_delete() -> None:
    ada = current("mem_ada", "Ada lives in London.", revision=3)
    plan = plan_batch(state(ada), [op("forget", {"id": "mem_ada"})], CTX)
    [outcome] = plan.outcomes
    assert isinstance(outcome, Applied)
    assert outcome.receipt.forgotten_revisions == [1, 2, 3]
    assert [rid for rid, _ in plan.tombstones] == ["mem_ada"]
    assert plan.forgotten_stored == ["mem_ada"] and "mem_ada" not in plan.final


def test_a_refusal_is_kept_so_a_redelivery_answers_the_same() -> None:
    stale = op("revise", {"id": "mem_ada", "text": "Rome.", "expected_revision": 9})
    plan = plan_batch(state(ADA), [stale, stale], CTX)
    first, again = plan.outcomes
    assert isinstance(first, RevisionConflictError)
    assert isinstance(again, (RevisionConflictError, Replayed))
    [receipt] = plan.receipts
    # Content-free: of its request, only the id of the record it named.
    assert receipt.error is not None and receipt.request == {"id": "mem_ada"}
