"""Everything the store holds about one scope, read in one snapshot: the answer to a
person's request for their data, and the input of ``engram export``.

Every record with every stored revision (oldest record first, each record's
revisions in order), the content-free tombstones of forgotten records, and
the receipts with the requests they still hold (a redacted receipt holds none).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..rows import (
    RECEIPT_COLUMNS,
    REVISION_COLUMNS,
    receipt_from_row,
    record_from_row,
    scope_from_key,
)
from ..store import Store
from ..values import Receipt, Record, Scope

# Rows are streamed through a server-side cursor this many at a time.
_FETCH = 500


@dataclass(frozen=True, slots=True)
class History:
    """One record: its stored revisions, oldest first."""

    id: str
    revisions: tuple[Record, ...]


@dataclass(frozen=True, slots=True)
class Tombstone:
    id: str
    scope: Scope
    forgotten_at: datetime
    operation_id: str


@dataclass(frozen=True, slots=True)
class ReceiptEntry:
    receipt: Receipt
    request: dict[str, Any] | None  # None once redacted by a forget


Item = History | Tombstone | ReceiptEntry


def dump_scope(store: Store, scope: Scope | Mapping[str, Any]) -> Iterator[Item]:
    """Histories, then tombstones, then receipts (oldest first), all from one snapshot
    (a repeatable-read transaction): a write committed meanwhile is wholly in or out."""
    key = Scope.of(scope).key
    with store.pool.connection() as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        revisions = conn.cursor(name="engram_dump_revisions")
        revisions.itersize = _FETCH
        revisions.execute(
            f"""SELECT {REVISION_COLUMNS} FROM engram_revisions v
                JOIN engram_scopes s ON s.id = v.scope_id WHERE s.key = %s
                ORDER BY min(v.recorded_at) OVER (PARTITION BY v.record_id), v.record_id,
                         v.revision""",
            (key,),
        )
        yield from _histories(record_from_row(row) for row in revisions)
        revisions.close()
        for rid, skey, forgotten_at, op_id in conn.execute(
            "SELECT f.record_id, s.key, f.forgotten_at, f.operation_id FROM engram_forgotten f"
            " JOIN engram_scopes s ON s.id = f.scope_id WHERE s.key = %s"
            " ORDER BY f.forgotten_at, f.record_id",
            (key,),
        ):
            yield Tombstone(rid, scope_from_key(skey), forgotten_at, op_id)
        receipts = conn.cursor(name="engram_dump_receipts")
        receipts.itersize = _FETCH
        receipts.execute(
            f"SELECT {RECEIPT_COLUMNS}, c.request FROM engram_receipts c"
            " JOIN engram_scopes s ON s.id = c.scope_id WHERE s.key = %s"
            " ORDER BY c.committed_at, c.scope_revision, c.operation_id",
            (key,),
        )
        for row in receipts:
            yield ReceiptEntry(receipt_from_row(row[:-1]), row[-1])
        receipts.close()


def _histories(revisions: Iterator[Record]) -> Iterator[History]:
    current: list[Record] = []
    for revision in revisions:
        if current and current[0].id != revision.id:
            yield History(current[0].id, tuple(current))
            current = []
        current.append(revision)
    if current:
        yield History(current[0].id, tuple(current))
