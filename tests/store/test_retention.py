"""prune_history and prune_operations: exclusive cutoffs, counts, the warning."""

from __future__ import annotations

import logging

import psycopg
import pytest

from engram.store import Store


def _recorded_at(dsn: str, record_id: str) -> list:
    with psycopg.connect(dsn) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT recorded_at FROM engram_revisions WHERE record_id = %s ORDER BY revision",
                (record_id,),
            )
        ]


def test_prune_history_keeps_current_revisions_and_live_records(
    fresh_store: Store, fresh_dsn: str
) -> None:
    mem = fresh_store.session({"user_id": "ada"})
    live = mem.remember("live v1").records[0]
    mem.revise(live.id, text="live v2")
    gone = mem.remember("gone v1").records[0]
    mem.revise(gone.id, text="gone v2")
    mem.retract(gone.id)
    stamps = _recorded_at(fresh_dsn, gone.id)

    # Exclusive cutoff: a revision stamped exactly at older_than stays.
    assert fresh_store.prune_history(stamps[0]) == 0
    assert fresh_store.prune_history(stamps[1]) == 1
    assert [r.revision for r in mem.history(gone.id)] == [2, 3]
    assert fresh_store.prune_history(stamps[2]) == 1
    assert [r.revision for r in mem.history(gone.id)] == [3]
    assert [r.revision for r in mem.history(live.id)] == [1, 2], "live records keep history"
    # Receipts stay and keep deduplicating.
    assert len(fresh_store.receipts(record_id=gone.id)) == 3


def test_prune_history_can_be_limited_to_one_scope(fresh_store: Store, fresh_dsn: str) -> None:
    ids = {}
    for user in ("a", "b"):
        mem = fresh_store.session({"user_id": user})
        rid = mem.remember("v1").records[0].id
        mem.retract(rid)
        ids[user] = rid
    cutoff = _recorded_at(fresh_dsn, ids["b"])[-1]
    assert fresh_store.prune_history(cutoff, scope={"user_id": "a"}) == 1
    assert len(fresh_store.history({"user_id": "b"}, ids["b"])) == 2


def test_prune_operations_warns_and_stops_deduplication(
    fresh_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    mem = fresh_store.session({"user_id": "ada"})
    first = mem.remember("tea", id="r1", operation_id="op-1")
    cutoff = first.receipt.committed_at
    assert fresh_store.prune_operations(cutoff) == 0, "exclusive cutoff"
    later = mem.forget("r1", operation_id="op-2").receipt.committed_at
    with caplog.at_level(logging.WARNING, logger="engram.store.write.retention"):
        assert fresh_store.prune_operations(later) == 1
    warning = [r for r in caplog.records if "no longer deduplicate" in r.getMessage()][-1]
    assert warning.count == 1 and warning.older_than == later.isoformat()  # type: ignore[attr-defined]
    assert fresh_store.receipt("op-1") is None and fresh_store.receipt("op-2") is not None
    # The tombstone is not a receipt: the forgotten id stays forgotten.
    assert mem.get("r1") is None
    assert fresh_store.prune_operations(later.replace(year=later.year + 1)) == 1
    again = mem.forget("r1")
    assert again.already_forgotten
