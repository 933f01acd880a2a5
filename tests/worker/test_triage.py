"""The consumer's pure halves, without Redis or PostgreSQL: which entries a cycle
commits and which go to the dead letters (``worker.triage``), and what its outcomes
count and acknowledge (``worker.outcomes``)."""

from __future__ import annotations

from engram.store import Operation
from engram.store.errors import RevisionConflictError
from engram.worker.admin import deadletters
from engram.worker.causes import Cause
from engram.worker.consuming.leases import Lease
from engram.worker.consuming.outcomes import Outcomes, acknowledged, batch_stats
from engram.worker.consuming.partition import Partition
from engram.worker.consuming.triage import Read, Triage, triage
from engram.worker.protocol import Entry, encode_entry, partition_of

PARTITIONS = 4
SCOPE = {"user_id": "ada"}
HOME = partition_of(SCOPE, PARTITIONS)


def _partition(number: int = HOME) -> Partition:
    return Partition(Lease(number, "w1", 7), valid_until=float("inf"), partitions=PARTITIONS)


def _entry(text: str) -> tuple[Operation, dict[str, str]]:
    op = Operation.build("remember", SCOPE, {"text": text})
    return op, encode_entry(op)


def _sort(reads: list[Read], *, in_hand: frozenset[str] = frozenset()) -> Triage:
    return triage(
        reads,
        max_deliveries=3,
        in_hand=lambda p, entry_id: entry_id in in_hand,
    )


def test_good_entries_keep_their_stream_order_and_their_op_as_sent() -> None:
    p = _partition()
    (a, fa), (b, fb) = _entry("one"), _entry("two")
    out = _sort([Read(p, [("1-0", fa), ("2-0", fb)], {})])
    assert [(q, e.entry_id, e.operation.operation_id) for q, e in out.good] == [
        (p, "1-0", a.operation_id),
        (p, "2-0", b.operation_id),
    ]
    assert out.dead == []
    assert out.raws[(HOME, "2-0")] == fb["op"]


def test_malformed_over_delivered_and_misrouted_entries_are_dead_with_their_reason() -> None:
    p = _partition()
    _, good = _entry("kept")
    over_op, over = _entry("delivered too often")
    elsewhere = _partition((HOME + 1) % PARTITIONS)
    _, misrouted = _entry("sent to the wrong partition")
    out = _sort(
        [
            Read(p, [("1-0", {"op": "{not json"}), ("2-0", over), ("3-0", good)], {"2-0": 4}),
            Read(elsewhere, [("1-0", misrouted)], {}),
        ]
    )
    assert [e.entry_id for _, e in out.good] == ["3-0"]
    dead = {(d.partition.number, d.entry_id): d for d in out.dead}
    assert dead[(HOME, "1-0")].reason == deadletters.MALFORMED
    assert dead[(HOME, "1-0")].raw == "{not json"
    assert dead[(HOME, "2-0")].reason == deadletters.DELIVERIES
    assert dead[(HOME, "2-0")].operation_id == over_op.operation_id
    assert dead[(HOME, "2-0")].deliveries == 4
    assert dead[(elsewhere.number, "1-0")].reason == deadletters.MALFORMED


def test_an_entry_in_hand_for_its_model_is_neither_committed_nor_dead() -> None:
    p = _partition()
    _, fields = _entry("waits for its model")
    out = _sort([Read(p, [("1-0", fields)], {"1-0": 9})], in_hand=frozenset({"1-0"}))
    assert out.good == [] and out.dead == []


def test_an_entry_no_commit_could_take_is_dead_with_its_op_and_deliveries() -> None:
    p = _partition()
    op, fields = _entry("breaks the batch")
    out = _sort([Read(p, [("5-0", fields)], {"5-0": 2})])
    [(q, entry)] = out.good
    out.failed([(q, entry, Cause("database_error", "DataError (SQLSTATE 22P02)"))])
    [d] = out.dead
    assert (d.reason, d.operation_id, d.raw, d.deliveries) == (
        deadletters.FAILED,
        op.operation_id,
        fields["op"],
        2,
    )
    assert "DataError (SQLSTATE 22P02)" in d.error.message
    assert d.error.to_dict()["cause"] == "database_error"


def test_outcomes_count_and_acknowledge_every_answered_entry() -> None:
    p = _partition()
    op, _ = _entry("refused")
    sorted_ = _sort([Read(p, [("2-0", {"op": "{"})], {})])
    conflict = RevisionConflictError("stale", expected=1, actual=2)
    outcomes: Outcomes = [((p, Entry("1-0", op)), conflict)]
    stats = batch_stats(outcomes, sorted_.dead, entries=2, model_calls=[])
    assert (stats.entries, stats.committed, stats.replayed) == (2, 0, 0)
    assert stats.failed == {"revision_conflict": 1}
    assert stats.dead == {deadletters.MALFORMED: 1}
    assert acknowledged(outcomes, sorted_.dead) == {p: ["1-0", "2-0"]}
