"""Applying the forget ledger to a database, and checking one against the other.

``replay`` forgets again, through the store, every record the ledger lists that the
database does not know as forgotten: a database restored from a backup taken before
those forgets. Each is a real forget (revisions, vectors and links deleted, the
receipts that wrote it redacted, a tombstone), committed under the ledger's own
operation id with ``requested_by`` = ``ledger-replay`` on its receipt, so that it
reads as a replay and a second run finds it done. A record the database never had
(its backup predates it) gets the tombstone alone, so that a redelivered old
operation can never create it. Then the deleted row versions leave the tables'
pages (``forgets.vacuum``, the full-text index rebuilt), and the replayed forgets
say ``redaction: complete``. Idempotent: a second run finds every id forgotten, and
finishes the erasure of replayed forgets a killed run left ``pending``.

``check`` compares the tombstones with the ledger: tombstones the ledger lacks (a
forget committed by a process that had no ledger, or before there was one; appended
with ``repair``) and ledger entries the database does not know (a forget of another
database that shared the ledger, or one a restore lost: ``replay`` puts it back).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .ledger import ForgetLedger, LedgerEntry, Scan
from .rows import scope_from_key
from .values import Scope, WriteResult
from .write import forgets
from .write.operations import Operation
from .write.options import WriteOptions
from .write.requests import forget_request

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger(__name__)

# Who a replayed forget's receipt says asked for it.
REPLAY_BY = "ledger-replay"
# Forgets committed per transaction.
BATCH_SIZE = 500


@dataclass(frozen=True, slots=True)
class ReplayResult:
    in_ledger: int  # distinct record ids the ledger lists (since ``since``)
    already_forgotten: int  # the database has their tombstone: nothing to do
    reapplied: int  # the database had the record: forgotten again now
    tombstoned: int  # the database never had it: a tombstone alone
    failed: int  # refused by the store (an id another scope holds): see the log
    erased: int  # replayed forgets whose rows left the files in this run (VACUUM)
    damaged_lines: int  # ledger lines skipped, torn or damaged
    dry_run: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class CheckResult:
    tombstones: int  # in the database
    in_ledger: int  # distinct record ids in the ledger
    missing_from_ledger: int  # tombstones the ledger lacks (appended when repairing)
    unknown_to_store: int  # ledger ids with no tombstone in the database
    repaired: int
    damaged_lines: int

    @property
    def ok(self) -> bool:
        return self.missing_from_ledger == self.repaired and self.damaged_lines == 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def replay(
    store: Store,
    ledger: ForgetLedger,
    *,
    since: datetime | None = None,
    dry_run: bool = False,
    vacuum_wait_s: float = 60.0,
) -> ReplayResult:
    """Forget again in ``store`` what ``ledger`` lists and it does not know as forgotten."""
    scan = Scan()
    wanted = _first_by_record(ledger, since, scan)
    already = reapplied = tombstoned = failed = 0
    forgotten_again: list[tuple[str, str]] = []  # (scope key, operation id)
    ids = list(wanted)
    for start in range(0, len(ids), BATCH_SIZE):
        batch = [wanted[i] for i in ids[start : start + BATCH_SIZE]]
        known_forgotten, present = _known(store, [e.record_id for e in batch])
        todo = [e for e in batch if e.record_id not in known_forgotten]
        already += len(batch) - len(todo)
        if dry_run:
            reapplied += sum(1 for e in todo if e.record_id in present)
            tombstoned += sum(1 for e in todo if e.record_id not in present)
            continue
        done, refused = _forget(store, todo)
        failed += refused
        reapplied += sum(1 for e in done if e.record_id in present)
        tombstoned += _tombstone(store, [e for e in done if e.record_id not in present])
        forgotten_again += [(_scope_key(e), e.operation_id) for e in done if e.record_id in present]
    # With those a replay killed before its VACUUM left pending: this run finishes them.
    to_erase = [] if dry_run else sorted({*forgotten_again, *_unfinished(store)})
    if to_erase:
        _erase(store, [e.record_id for e in wanted.values()], to_erase, vacuum_wait_s)
    result = ReplayResult(
        in_ledger=len(wanted),
        already_forgotten=already,
        reapplied=reapplied,
        tombstoned=tombstoned,
        failed=failed,
        erased=len(to_erase),
        damaged_lines=scan.damaged,
        dry_run=dry_run,
    )
    log.info("forget ledger replayed", extra=result.as_dict())
    return result


def _first_by_record(
    ledger: ForgetLedger, since: datetime | None, scan: Scan
) -> dict[str, LedgerEntry]:
    """One entry per record id: its first forget (a repeat is the same forget)."""
    wanted: dict[str, LedgerEntry] = {}
    for entry in ledger.entries(since, scan=scan):
        wanted.setdefault(entry.record_id, entry)
    return wanted


def _known(store: Store, record_ids: list[str]) -> tuple[set[str], set[str]]:
    """Of ``record_ids``: those with a tombstone, and those with a record row."""
    with store.pool.connection() as conn:
        tombstoned = conn.execute(
            "SELECT record_id FROM engram_forgotten WHERE record_id = ANY(%s)", (record_ids,)
        ).fetchall()
        present = conn.execute(
            "SELECT id FROM engram_records WHERE id = ANY(%s)", (record_ids,)
        ).fetchall()
    return {r[0] for r in tombstoned}, {r[0] for r in present}


def _forget(store: Store, entries: Sequence[LedgerEntry]) -> tuple[list[LedgerEntry], int]:
    """Commit the forgets of ``entries`` in one transaction: those that went through,
    and how many the store refused."""
    if not entries:
        return [], 0
    ops = [
        Operation.build(
            "forget",
            e.scope,
            forget_request(e.record_id),
            e.operation_id,
            requested_by=REPLAY_BY,
        )
        for e in entries
    ]
    results = store.execute(ops, None, options=WriteOptions(listeners=True))
    done, refused = [], 0
    for entry, result in zip(entries, results, strict=True):
        if isinstance(result, WriteResult):
            done.append(entry)
        else:
            refused += 1
            log.error(
                "ledger forget refused by the store",
                extra={"record_id": entry.record_id, "error": result.code},
            )
    return done, refused


def _tombstone(store: Store, entries: Sequence[LedgerEntry]) -> int:
    """Tombstones for records this database never had (their forget committed a receipt
    and deleted nothing): how many were made."""
    if not entries:
        return 0
    with store.pool.connection() as conn:
        cur = conn.execute(
            "INSERT INTO engram_forgotten (record_id, scope_id, forgotten_at, operation_id)"
            " SELECT e.id, s.id, e.at, e.op FROM unnest(%s::text[], %s::text[],"
            " %s::timestamptz[], %s::text[]) AS e(id, key, at, op)"
            " JOIN engram_scopes s ON s.key = e.key ON CONFLICT (record_id) DO NOTHING",
            (
                [e.record_id for e in entries],
                [_scope_key(e) for e in entries],
                [e.at for e in entries],
                [e.operation_id for e in entries],
            ),
        )
        count: int = cur.rowcount
    return count


def _scope_key(entry: LedgerEntry) -> str:
    return Scope.of(entry.scope).key


def _unfinished(store: Store) -> list[tuple[str, str]]:
    """Replayed forgets still ``pending`` (scope key, operation id): committed by a replay
    that did not get to its VACUUM (killed, or held)."""
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT s.key, c.operation_id FROM engram_receipts c"
            " JOIN engram_scopes s ON s.id = c.scope_id WHERE c.kind = 'forget'"
            " AND c.requested_by = %s AND c.redaction = 'pending'",
            (REPLAY_BY,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def _erase(
    store: Store, record_ids: list[str], operation_ids: list[tuple[str, str]], wait_s: float
) -> None:
    """The deleted row versions leave the tables and the text index; then the replayed
    forgets are ``complete`` (until then ``pending``: the sweeper of a running jobs
    worker would finish them)."""
    forgets.vacuum(store.pool, wait_s=wait_s, record_ids=record_ids)
    forgets.reindex_text(store.pool)
    forgets.set_redaction(store.pool, operation_ids, "complete")


def check(store: Store, ledger: ForgetLedger, *, repair: bool = False) -> CheckResult:
    """Tombstones the ledger lacks (appended with ``repair``), and ledger entries the
    database does not know."""
    scan = Scan()
    in_ledger = {e.record_id for e in ledger.entries(scan=scan)}
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT f.record_id, s.key, f.operation_id, f.forgotten_at FROM engram_forgotten f"
            " JOIN engram_scopes s ON s.id = f.scope_id ORDER BY f.forgotten_at"
        ).fetchall()
    tombstones = {r[0] for r in rows}
    missing = [
        LedgerEntry(record_id=rid, scope=_scope_of(key), operation_id=op, at=at)
        for rid, key, op, at in rows
        if rid not in in_ledger
    ]
    if repair and missing:
        ledger.append(missing)
        log.warning("forget ledger repaired", extra={"appended": len(missing)})
    return CheckResult(
        tombstones=len(tombstones),
        in_ledger=len(in_ledger),
        missing_from_ledger=len(missing),
        unknown_to_store=len(in_ledger - tombstones),
        repaired=len(missing) if repair else 0,
        damaged_lines=scan.damaged,
    )


def _scope_of(key: str) -> dict[str, str]:
    return scope_from_key(key).as_dict()
