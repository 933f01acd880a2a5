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
say ``redaction: complete``. It revokes again, too, every token the ledger lists
as revoked that the database has live. Idempotent: a second run finds every id
forgotten and every token revoked, and finishes the erasure of replayed forgets a
killed run left ``pending``.

Only the lines of this database are applied (``ledger.database_key``; lines from
before lines named one count as this database's): a ledger directory shared by
several databases applies to each its own. Lines are keyed by scope and record
id, as records are (a record id is its scope's): a line forgets its scope's record
and never another scope's of the same id, nor hides another scope's line. Each
line is vetted first (``_vet``), the same way with ``dry_run`` as without: a line
the store would refuse (an operation id it cannot take, or one another operation
has) is reported (``refused_at``) and skipped; the rest is applied.

``check`` compares the tombstones and revoked tokens with the ledger: those the
ledger lacks (a forget committed by a process that had no ledger, or before there
was one; appended with ``repair``) and ledger entries the database does not know
(a forget a restore lost: ``replay`` puts it back).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import audit
from .errors import InvalidRequestError
from .ledger import ForgetLedger, LedgerEntry, Revocation, Scan
from .rows import scope_from_key
from .tokens import ACTOR_PREFIX
from .values import Scope, WriteResult
from .write import forgets
from .write.operations import Operation
from .write.options import WriteOptions
from .write.requests import forget_request

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger(__name__)

# Who a replayed forget's receipt (and a replayed revocation's audit row) says asked.
REPLAY_BY = "ledger-replay"
# Forgets committed per transaction.
BATCH_SIZE = 500
# Refused lines named in a result (all are counted, and logged).
REFUSED_SHOWN = 20


@dataclass(frozen=True, slots=True)
class ReplayResult:
    in_ledger: int  # distinct (scope, record id) this database's lines list (since ``since``)
    already_forgotten: int  # the database has their tombstone: nothing to do
    reapplied: int  # the database had the record: forgotten again now
    tombstoned: int  # the database never had it: a tombstone alone
    failed: int  # lines refused (invalid, or the store would not take them): skipped
    erased: int  # replayed forgets whose rows left the files in this run (VACUUM)
    damaged_lines: int  # ledger lines skipped, torn or damaged
    other_databases: int  # lines of another database: left alone
    tokens_revoked: int  # tokens the ledger lists as revoked, live here: revoked again
    dry_run: bool
    database: str  # this database's ``database_key``
    refused_at: tuple[str, ...] = ()  # "file:line: why", the first REFUSED_SHOWN

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "refused_at": list(self.refused_at)}


@dataclass(frozen=True, slots=True)
class CheckResult:
    tombstones: int  # in the database
    in_ledger: int  # distinct (scope, record id) in this database's lines
    missing_from_ledger: int  # tombstones the ledger lacks (appended when repairing)
    unknown_to_store: int  # this database's lines with no tombstone here
    revoked_tokens: int  # in the database
    revocations_missing: int  # revoked tokens the ledger lacks (appended when repairing)
    repaired: int  # lines appended, of both kinds
    damaged_lines: int
    other_databases: int  # lines of another database sharing the directory
    database: str

    @property
    def ok(self) -> bool:
        missing = self.missing_from_ledger + self.revocations_missing
        return missing == self.repaired and self.damaged_lines == 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass(frozen=True, slots=True)
class _Line:
    """A forget line and where it is (``file:line``), and what the store would run."""

    where: str
    entry: LedgerEntry
    operation: Operation | None = None


@dataclass(slots=True)
class _Vetted:
    already: list[_Line]
    present: list[_Line]  # the record is in the line's scope: forgotten again
    absent: list[_Line]  # never in this database: a tombstone alone
    refused: list[str]  # "file:line: why"


def replay(
    store: Store,
    ledger: ForgetLedger,
    *,
    since: datetime | None = None,
    dry_run: bool = False,
    vacuum_wait_s: float = 60.0,
) -> ReplayResult:
    """Forget again in ``store`` what ``ledger`` lists for it and it does not know as
    forgotten; revoke again the tokens it lists as revoked."""
    scan = Scan()
    here = store.database_key
    wanted, others = _wanted(ledger, since, scan, here)
    already = reapplied = tombstoned = 0
    refused: list[str] = []
    forgotten_again: list[tuple[str, str]] = []  # (scope key, operation id)
    lines = list(wanted.values())
    for start in range(0, len(lines), BATCH_SIZE):
        vetted = _vet(store, lines[start : start + BATCH_SIZE])
        already += len(vetted.already)
        refused += vetted.refused
        if dry_run:
            reapplied += len(vetted.present)
            tombstoned += len(vetted.absent)
            continue
        done, not_taken = _forget(store, [*vetted.present, *vetted.absent])
        refused += not_taken
        # Counted from what the database now says, never from the store's answer alone.
        gone = _forgotten(store, [line.entry for line in vetted.present])
        for line in vetted.present:
            if line.where in done and _key(line.entry) not in gone:
                refused.append(f"{line.where}: the store did not forget record {_id(line)}")
        again = [line for line in vetted.present if _key(line.entry) in gone]
        reapplied += len(again)
        forgotten_again += [(_key(line.entry)[0], line.entry.operation_id) for line in again]
        absent = [line.entry for line in vetted.absent if line.where in done]
        tombstoned += _tombstone(store, absent)
    revoked, others_revoked = _revocations(store, ledger, since, scan, here, dry_run)
    # With those a replay killed before its VACUUM left pending: this run finishes them.
    to_erase = [] if dry_run else sorted({*forgotten_again, *_unfinished(store)})
    if to_erase:
        _erase(store, [line.entry.record_id for line in lines], to_erase, vacuum_wait_s)
    for why in refused:
        log.warning("forget ledger line refused, skipped", extra={"line": why})
    result = ReplayResult(
        in_ledger=len(wanted),
        already_forgotten=already,
        reapplied=reapplied,
        tombstoned=tombstoned,
        failed=len(refused),
        erased=len(to_erase),
        damaged_lines=scan.damaged,
        other_databases=others + others_revoked,
        tokens_revoked=revoked,
        dry_run=dry_run,
        database=here,
        refused_at=tuple(refused[:REFUSED_SHOWN]),
    )
    log.info("forget ledger replayed", extra={**result.as_dict(), "refused_at": len(refused)})
    return result


def _key(entry: LedgerEntry) -> tuple[str, str]:
    return Scope.of(entry.scope).key, entry.record_id


def _id(line: _Line) -> str:
    return line.entry.record_id


def _wanted(
    ledger: ForgetLedger, since: datetime | None, scan: Scan, here: str
) -> tuple[dict[tuple[str, str], _Line], int]:
    """This database's lines (and those naming no database), one per scope and record
    id (a repeat is the same forget; a line naming this database wins over one naming
    none); and how many lines named another database."""
    wanted: dict[tuple[str, str], _Line] = {}
    others = 0
    for where, entry in ledger.located(since, scan=scan):
        if entry.database not in (None, here):
            others += 1
            continue
        key = _key(entry)
        known = wanted.get(key)
        if known is None or (known.entry.database is None and entry.database == here):
            wanted[key] = _Line(where, entry)
    return wanted, others


def _vet(store: Store, lines: Sequence[_Line]) -> _Vetted:
    """What the store would make of each line, decided the same way for a dry run and
    a real one: the operation it would run (a line it could not take is refused), then
    the database's state in the line's scope (a record id is its scope's: the same id in
    another scope is another record, which the line never touches): forgotten already,
    the record there, or never there; an operation id whose receipt in the line's scope
    is not this forget's (another kind or record, or a refusal) is refused: the store
    would answer that receipt, forgetting nothing."""
    vetted = _Vetted([], [], [], [])
    built: list[_Line] = []
    for line in lines:
        try:
            built.append(_Line(line.where, line.entry, _operation(line.entry)))
        except InvalidRequestError as exc:
            vetted.refused.append(f"{line.where}: {exc.message}")
    keys = [_key(line.entry) for line in built]
    named = ([k[0] for k in keys], [k[1] for k in keys])
    ops = [line.entry.operation_id for line in built]
    with store.pool.connection() as conn:
        forgotten = {
            (r[0], r[1])
            for r in conn.execute(
                f"SELECT s.key, f.record_id FROM {_NAMED}"
                " JOIN engram_forgotten f ON f.scope_id = s.id AND f.record_id = k.id",
                named,
            ).fetchall()
        }
        held = {
            (r[0], r[1])
            for r in conn.execute(
                f"SELECT s.key, r.id FROM {_NAMED}"
                " JOIN engram_records r ON r.scope_id = s.id AND r.id = k.id",
                named,
            ).fetchall()
        }
        # An operation id is its scope's (the same id in another scope is another operation).
        receipts = {
            (r[0], r[1]): (r[2], r[3])
            for r in conn.execute(
                "SELECT s.key, r.operation_id, r.kind, r.error IS NOT NULL FROM engram_receipts r"
                " JOIN engram_scopes s ON s.id = r.scope_id WHERE r.operation_id = ANY(%s)",
                (ops,),
            ).fetchall()
        }
    for line in built:
        key = _key(line.entry)
        receipt = receipts.get((key[0], line.entry.operation_id))
        if key in forgotten:
            vetted.already.append(line)
        elif receipt is not None and (receipt != ("forget", False) or key in held):
            vetted.refused.append(
                f"{line.where}: operation id {line.entry.operation_id} is another operation's"
            )
        else:
            (vetted.present if key in held else vetted.absent).append(line)
    return vetted


# The records a batch of lines names, as (scope key, record id): ``k`` and its scope ``s``.
_NAMED = "unnest(%s::text[], %s::text[]) AS k(key, id) JOIN engram_scopes s ON s.key = k.key"


def _operation(entry: LedgerEntry) -> Operation:
    return Operation.build(
        "forget",
        entry.scope,
        forget_request(entry.record_id),
        entry.operation_id,
        requested_by=REPLAY_BY,
    )


def _forget(store: Store, lines: Sequence[_Line]) -> tuple[set[str], list[str]]:
    """Commit the forgets of ``lines`` (vetted) in one transaction: where the lines that
    went through are, and why the store refused the others."""
    if not lines:
        return set(), []
    ops = [line.operation or _operation(line.entry) for line in lines]
    results = store.execute(ops, None, options=WriteOptions(listeners=True))
    done: set[str] = set()
    refused: list[str] = []
    for line, result in zip(lines, results, strict=True):
        if isinstance(result, WriteResult):
            done.add(line.where)
        else:
            refused.append(f"{line.where}: refused by the store ({result.code})")
    return done, refused


def _forgotten(store: Store, entries: Sequence[LedgerEntry]) -> set[tuple[str, str]]:
    """Which of ``entries`` the database now knows as forgotten in their scope."""
    keys = [_key(e) for e in entries]
    with store.pool.connection() as conn:
        rows = conn.execute(
            f"SELECT s.key, f.record_id FROM {_NAMED}"
            " JOIN engram_forgotten f ON f.scope_id = s.id AND f.record_id = k.id",
            ([k[0] for k in keys], [k[1] for k in keys]),
        ).fetchall()
    return {(r[0], r[1]) for r in rows}


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
            " JOIN engram_scopes s ON s.key = e.key ON CONFLICT (scope_id, record_id) DO NOTHING",
            (
                [e.record_id for e in entries],
                [_key(e)[0] for e in entries],
                [e.at for e in entries],
                [e.operation_id for e in entries],
            ),
        )
        count: int = cur.rowcount
    return count


def _revocations(
    store: Store,
    ledger: ForgetLedger,
    since: datetime | None,
    scan: Scan,
    here: str,
    dry_run: bool,
) -> tuple[int, int]:
    """Revoke again the tokens this database's revocation lines name and it has live:
    how many, and how many lines named another database."""
    mine: list[Revocation] = []
    others = 0
    for _, revocation in ledger.revocations(since, scan=scan):
        if revocation.database == here:
            mine.append(revocation)
        else:
            others += 1
    revoked = 0
    with store.pool.connection() as conn:
        for r in mine:
            with conn.transaction():
                row = conn.execute(
                    "SELECT id FROM engram_tokens WHERE name = %s AND created_at = %s"
                    " AND revoked_at IS NULL FOR UPDATE",
                    (r.token, r.created_at),
                ).fetchone()
                if row is None:
                    continue
                revoked += 1
                if dry_run:
                    continue
                conn.execute(
                    "UPDATE engram_tokens SET revoked_at = %s, revoked_by = %s WHERE id = %s",
                    (r.at, r.by, row[0]),
                )
                detail = {"revoked_by": r.by, "revoked_at": r.at.isoformat()}
                audit.insert(conn, REPLAY_BY, "token.revoke", ACTOR_PREFIX + r.token, detail)
    return revoked, others


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
    """Tombstones and revoked tokens the ledger lacks (appended with ``repair``), and
    this database's ledger entries it does not know."""
    scan = Scan()
    here = store.database_key
    wanted, others = _wanted(ledger, None, scan, here)
    listed = set()
    for _, r in ledger.revocations(scan=scan):
        if r.database == here:
            listed.add((r.token, r.created_at))
        else:
            others += 1
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT f.record_id, s.key, f.operation_id, f.forgotten_at FROM engram_forgotten f"
            " JOIN engram_scopes s ON s.id = f.scope_id ORDER BY f.forgotten_at"
        ).fetchall()
        tokens = conn.execute(
            "SELECT name, created_at, revoked_by, revoked_at FROM engram_tokens"
            " WHERE revoked_at IS NOT NULL ORDER BY revoked_at"
        ).fetchall()
    tombstones = {(key, rid) for rid, key, _, _ in rows}
    missing: list[LedgerEntry | Revocation] = [
        LedgerEntry(rid, _scope_of(key), op, at, here)
        for rid, key, op, at in rows
        if (key, rid) not in wanted
    ]
    forgets_missing = len(missing)
    missing += [
        Revocation(name, created, by or "", at, here)
        for name, created, by, at in tokens
        if (name, created) not in listed
    ]
    if repair and missing:
        ledger.append(missing)
        log.warning("forget ledger repaired", extra={"appended": len(missing)})
    return CheckResult(
        tombstones=len(tombstones),
        in_ledger=len(wanted),
        missing_from_ledger=forgets_missing,
        unknown_to_store=len(wanted.keys() - tombstones),
        revoked_tokens=len(tokens),
        revocations_missing=len(missing) - forgets_missing,
        repaired=len(missing) if repair else 0,
        damaged_lines=scan.damaged,
        other_databases=others,
        database=here,
    )


def _scope_of(key: str) -> dict[str, str]:
    return scope_from_key(key).as_dict()
