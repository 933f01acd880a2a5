"""Forget: tombstones, redacted receipts, listeners, and no text left anywhere."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from engram.store import ForgetEvent, HashingEmbedder, Operation, RevisionConflictError, Store
from tests.helpers import rows_containing

SECRET = "Ada's diagnosis is zanthoxylum-7."


def test_forget_leaves_the_text_in_no_table(fresh_store: Store, fresh_dsn: str) -> None:
    scope = {"user_id": "ada"}
    mem = fresh_store.session(scope, embedder=HashingEmbedder(64))
    fact = mem.remember(SECRET, metadata={"note": "zanthoxylum"}).records[0]
    mem.revise(fact.id, text=SECRET + " Confirmed zanthoxylum.", expected_revision=1)
    mem.retract(fact.id)
    keep = mem.remember("Ada likes tea.").records[0]
    extracted = mem.extract(
        [{"id": "m1", "message": {"role": "user", "content": "zanthoxylum again"}}], infer=False
    ).records[0]
    with psycopg.connect(fresh_dsn) as conn:
        assert rows_containing(conn, "zanthoxylum"), "the scan must see the text before"

    result = mem.forget(fact.id)
    assert result.revisions == (1, 2, 3) and not result.already_forgotten
    mem.forget(extracted.id)

    with psycopg.connect(fresh_dsn) as conn:
        assert rows_containing(conn, "zanthoxylum") == []
        assert rows_containing(conn, "diagnosis") == []
        # Tombstones hold ids only; the unrelated record is untouched.
        assert conn.execute("SELECT count(*) FROM engram_forgotten").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM engram_vectors").fetchone()[0] == 1
    assert mem.get(keep.id).text == "Ada likes tea."  # type: ignore[union-attr]


def test_receipts_that_wrote_a_forgotten_record_are_redacted(store: Store, scope: dict) -> None:
    mem = store.session(scope)
    fact = mem.remember(SECRET).records[0]
    revise = mem.revise(fact.id, text="Ada is fine.")
    other = mem.remember("Ada likes tea.")
    forget = mem.forget(fact.id)

    receipts = {r.operation_id: r for r in store.receipts(scope=scope)}
    assert receipts[revise.receipt.operation_id].redacted
    assert not receipts[other.receipt.operation_id].redacted
    assert receipts[forget.receipt.operation_id].kind == "forget"
    assert receipts[forget.receipt.operation_id].forgotten_revisions == (1, 2)
    # Receipts keep their ids and revision numbers: the audit trail stays.
    assert [(r.id, r.revision) for r in receipts[revise.receipt.operation_id].records] == [
        (fact.id, 2)
    ]


def test_a_forgotten_id_can_never_come_back(store: Store, scope: dict) -> None:
    mem = store.session(scope)
    op_id = f"{scope['user_id']}:remember"
    fact = mem.remember(SECRET, operation_id=op_id).records[0]
    mem.forget(fact.id)

    # The same operation redelivered replays its (redacted) receipt: nothing comes back.
    again = mem.remember(SECRET, operation_id=op_id)
    assert again.replayed and again.records == ()
    assert mem.get(fact.id) is None

    with pytest.raises(RevisionConflictError):
        mem.revise(fact.id, text="back again", expected_revision=0)
    with pytest.raises(RevisionConflictError):
        mem.revise(fact.id, text="back again")
    with pytest.raises(RevisionConflictError):
        mem.remember("back again", id=fact.id)
    # In its own scope: another scope's record of that id is another record (issue 36).
    other = store.session({"user_id": scope["user_id"] + "-x"})
    assert other.remember("theirs", id=fact.id).records[0].text == "theirs"
    assert mem.get(fact.id) is None

    # Even with its receipt pruned, the redelivery aims at the same id and meets the tombstone.
    store.prune_operations(datetime.now(UTC) + timedelta(seconds=1))
    with pytest.raises(RevisionConflictError):
        mem.remember(SECRET, operation_id=op_id)
    assert mem.get(fact.id) is None


def test_repeating_a_forget_deletes_nothing_more(store: Store, scope: dict) -> None:
    mem = store.session(scope)
    fact = mem.remember("Ada likes tea.").records[0]
    first = mem.forget(fact.id, operation_id=f"{scope['user_id']}:forget")
    assert (first.revisions, first.already_forgotten) == ((1,), False)
    for op_id in (f"{scope['user_id']}:forget", None):
        again = mem.forget(fact.id, operation_id=op_id)
        assert (again.revisions, again.already_forgotten) == ((), True)
    # Every new forget commits and raises the scope revision, even deleting nothing.
    assert store.scope_revision(scope) == 3


def test_forget_listeners_run_in_order_and_report_redaction(store: Store, scope: dict) -> None:
    seen: list[tuple[str, ForgetEvent]] = []

    def first(event: ForgetEvent) -> None:
        seen.append(("first", event))

    def second(event: ForgetEvent) -> None:
        seen.append(("second", event))

    mem = store.session(scope, on_forget=[first, second])
    fact = mem.remember("Ada likes tea.").records[0]
    result = mem.forget(fact.id)
    assert result.redaction == "complete"
    assert [name for name, _ in seen] == ["first", "second"]
    event = seen[0][1]
    assert (event.record_id, event.revisions, event.already_forgotten) == (fact.id, (1,), False)
    assert event.operation_id == result.receipt.operation_id
    assert store.receipt(result.receipt.operation_id).redaction == "complete"  # type: ignore[union-attr]


def test_a_failing_listener_marks_redaction_failed_and_a_repeat_finishes_it(
    store: Store, scope: dict, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[bool] = []
    broken = {"yes": True}

    def flaky(event: ForgetEvent) -> None:
        calls.append(event.already_forgotten)
        if broken["yes"]:
            raise RuntimeError("listener down")

    after: list[str] = []
    mem = store.session(scope, on_forget=[flaky, lambda e: after.append(e.record_id)])
    fact = mem.remember(SECRET).records[0]
    with caplog.at_level(logging.ERROR):
        failed = mem.forget(fact.id)
    assert failed.redaction == "failed"
    assert after == [fact.id], "later listeners still run"
    assert mem.get(fact.id) is None, "the forget is never undone"
    assert "zanthoxylum" not in caplog.text

    broken["yes"] = False
    repeated = mem.forget(fact.id)
    assert (repeated.redaction, repeated.already_forgotten) == ("complete", True)
    assert calls == [False, True]


def test_redaction_is_none_when_no_listener_ran(store: Store, scope: dict) -> None:
    ran: list[str] = []
    mem = store.session(scope, on_forget=[lambda e: ran.append(e.record_id)])
    assert mem.forget("never-had-it").redaction == "none"
    assert store.session(scope).forget("never-had-it-either").redaction == "none"
    assert ran == []


def test_forget_inside_one_batch_drops_what_the_batch_wrote(store: Store, scope: dict) -> None:
    ops = [
        Operation.build("remember", scope, {"text": SECRET, "id": f"{scope['user_id']}-b"}),
        Operation.build("revise", scope, {"id": f"{scope['user_id']}-b", "text": "changed"}),
        Operation.build("forget", scope, {"id": f"{scope['user_id']}-b"}),
        Operation.build("remember", scope, {"text": "again", "id": f"{scope['user_id']}-b"}),
    ]
    results = store.execute(ops)
    assert [type(r).__name__ for r in results] == [
        "WriteResult",
        "WriteResult",
        "WriteResult",
        "RevisionConflictError",
    ]
    assert results[2].revisions == (1, 2)  # type: ignore[union-attr]
    assert store.history(scope, f"{scope['user_id']}-b") == []
    receipts = store.receipts(scope=scope)
    assert [(r.kind, r.redacted) for r in receipts] == [
        ("forget", False),
        ("revise", True),
        ("remember", True),
    ]
    assert store.scope_revision(scope) == 3


def test_an_operation_id_repeated_in_one_batch(store: Store, scope: dict) -> None:
    rid = f"{scope['user_id']}-dup"
    bad = Operation.build("revise", scope, {"id": rid, "text": "x"}, "dup-1")
    good = Operation.build(
        "revise", scope, {"id": rid, "text": "x", "expected_revision": 0}, "dup-2"
    )
    other = Operation.build("remember", scope, {"text": "y"}, "dup-2")
    results = store.execute([bad, bad, good, good, other])
    names = [type(r).__name__ for r in results]
    assert names == [
        "NotFoundError",
        "NotFoundError",
        "WriteResult",
        "WriteResult",
        "OperationConflictError",
    ]
    assert [results[2].replayed, results[3].replayed] == [False, True]  # type: ignore[union-attr]
    assert store.scope_revision(scope) == 1
