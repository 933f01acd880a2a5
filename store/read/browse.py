"""Reading the whole store, for the dashboard and the HTTP API: pages of scopes,
records, tombstones and receipts, a scope as of a past time, a record with its
history, the generations with their vector counts.

Unlike ``Session``, which sees one scope, this is the operator's view of every
scope. Every list is read by keyset pagination (the sort key of the last row
shown, in an opaque cursor; never OFFSET), each in the order of an index
(migration 004), so a page costs the same anywhere in a list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ..errors import InvalidRequestError, OperationAmbiguousError, RecordAmbiguousError
from ..limits import MAX_SCOPE_VALUE_CHARS
from ..rows import (
    RECEIPT_COLUMNS,
    RECEIPT_WIDTH,
    REVISION_COLUMNS,
    VOUCHED,
    receipt_from_row,
    record_from_row,
    scope_from_key,
    superseded_by,
)
from ..values import SCOPE_FIELDS, Generation, Receipt, Record, Scope, check_string
from .cursors import Cursors, InvalidCursorError
from .listed import Backlink, GenerationItem, ReceiptItem, RecordItem, ScopeRow, Tombstone
from .paging import DEFAULT_PAGE_SIZE, Page, check_limit, paged
from .receipt_filter import ReceiptFilter, receipt_clauses
from .routing import ReadRoute, routed

RecordStatus = Literal["active", "retracted", "expired", "all"]
RECORD_STATUSES: tuple[RecordStatus, ...] = ("active", "retracted", "expired", "all")

# Which records each status shows (an expired record is only in "expired").
_STATUS_CLAUSES: dict[str, str] = {
    "active": "r.status = 'active' AND (r.expires_at IS NULL OR r.expires_at > now())",
    "retracted": "r.status = 'retracted' AND (r.expires_at IS NULL OR r.expires_at > now())",
    "expired": "r.expires_at IS NOT NULL AND r.expires_at <= now()",
    "all": "true",
}


@dataclass(frozen=True, slots=True)
class HistoryPage:
    items: list[Record]
    next: str | None  # the cursor of the next page; None on the last one
    past: Record | None  # the revision just past the page (the next page's first)


class Browse:
    """Every read but the receipts' goes through ``reads`` (a replica when the store
    has one). The receipts are read on the primary: they answer whether an operation
    committed, and an operation that just did must not look unknown."""

    def __init__(self, reads: ReadRoute, cursors: Cursors) -> None:
        self.pool = reads
        self.primary = reads.primary
        self.cursors = cursors

    # -- scopes ---------------------------------------------------------------------

    @routed
    def scopes(
        self,
        match: Mapping[str, str] | None = None,
        *,
        exact: bool = False,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
    ) -> Page[ScopeRow]:
        """Scopes in key order; ``match`` keeps those whose fields begin with (or, with
        ``exact``, equal) the values given."""
        limit = check_limit(limit)
        clauses, params = _scope_match(match or {}, exact)
        if cursor is not None:
            (after,) = self.cursors.decode(cursor, "scopes", (str,))
            clauses.append("s.key > %(after)s")
            params["after"] = after
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"{_SCOPE_ROW} WHERE {' AND '.join(clauses)} ORDER BY s.key LIMIT %(n)s",
                {**params, "n": limit + 1},
            ).fetchall()
        return paged(rows, limit, (self.cursors, "scopes"), lambda r: (r[1],), _scope_row)

    @routed
    def scope(self, scope_id: int) -> ScopeRow | None:
        with self.pool.connection() as conn:
            row = conn.execute(f"{_SCOPE_ROW} WHERE s.id = %s", (scope_id,)).fetchone()
        return _scope_row(row) if row else None

    # -- records --------------------------------------------------------------------

    @routed
    def records(
        self,
        scope_id: int,
        status: RecordStatus = "active",
        *,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
    ) -> Page[RecordItem]:
        """A scope's current records with this status, most recently changed first."""
        limit = check_limit(limit)
        if status not in _STATUS_CLAUSES:
            raise InvalidRequestError(f"status must be one of {', '.join(RECORD_STATUSES)}")
        params: dict[str, Any] = {"scope": scope_id, "n": limit + 1}
        after = ""
        if cursor is not None:
            params["at"], params["id"] = self.cursors.decode(cursor, "records", (datetime, str))
            after = "AND (r.updated_at, r.id) < (%(at)s, %(id)s)"
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"""SELECT {REVISION_COLUMNS}, r.scope_id,
                           r.expires_at IS NOT NULL AND r.expires_at <= now(), r.updated_at
                    FROM engram_records r
                    JOIN engram_scopes s ON s.id = r.scope_id
                    JOIN engram_revisions v
                      ON v.scope_id = r.scope_id AND v.record_id = r.id AND v.revision = r.revision
                    WHERE r.scope_id = %(scope)s AND {_STATUS_CLAUSES[status]} {after}
                    ORDER BY r.updated_at DESC, r.id DESC LIMIT %(n)s""",
                params,
            ).fetchall()
            links = superseded_by(conn, [scope_id], [r[0] for r in rows[:limit]])
        return paged(
            rows,
            limit,
            (self.cursors, "records"),
            lambda r: (r[17], r[0]),
            lambda r: RecordItem(record_from_row(r, links.get(r[0], ())), r[15], r[16]),
        )

    @routed
    def records_as_of(
        self,
        scope_id: int,
        at: datetime,
        *,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
    ) -> Page[RecordItem]:
        """The scope as the store knew it at ``at``: each record's revision current then,
        most recently recorded first. Forgotten records have no history to show."""
        limit = check_limit(limit)
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise InvalidRequestError("an 'as of' time needs a time zone")
        params: dict[str, Any] = {"scope": scope_id, "as_of": at, "n": limit + 1}
        after = ""
        if cursor is not None:
            params["at"], params["id"] = self.cursors.decode(cursor, "as_of", (datetime, str))
            after = "AND (v.recorded_at, v.record_id) < (%(at)s, %(id)s)"
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"""SELECT {REVISION_COLUMNS}, v.scope_id,
                           v.expires_at IS NOT NULL AND v.expires_at <= %(as_of)s
                    FROM engram_revisions v JOIN engram_scopes s ON s.id = v.scope_id
                    WHERE v.scope_id = %(scope)s AND v.recorded_at <= %(as_of)s {after}
                      AND NOT EXISTS (
                          SELECT 1 FROM engram_revisions w
                          WHERE w.scope_id = v.scope_id AND w.record_id = v.record_id
                          AND w.revision > v.revision AND w.recorded_at <= %(as_of)s)
                    ORDER BY v.recorded_at DESC, v.record_id DESC LIMIT %(n)s""",
                params,
            ).fetchall()
        return paged(
            rows,
            limit,
            (self.cursors, "as_of"),
            lambda r: (r[13], r[0]),
            lambda r: RecordItem(record_from_row(r), r[15], r[16]),
        )

    @routed
    def tombstones(
        self, scope_id: int, *, cursor: str | None = None, limit: int = DEFAULT_PAGE_SIZE
    ) -> Page[Tombstone]:
        """A scope's forgotten ids, most recently forgotten first."""
        limit = check_limit(limit)
        params: dict[str, Any] = {"scope": scope_id, "n": limit + 1}
        after = ""
        if cursor is not None:
            params["at"], params["id"] = self.cursors.decode(cursor, "tombstones", (datetime, str))
            after = "AND (f.forgotten_at, f.record_id) < (%(at)s, %(id)s)"
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"""{_TOMBSTONE} WHERE f.scope_id = %(scope)s {after}
                    ORDER BY f.forgotten_at DESC, f.record_id DESC LIMIT %(n)s""",
                params,
            ).fetchall()
        return paged(rows, limit, (self.cursors, "tombstones"), lambda r: (r[2], r[0]), _tombstone)

    @routed
    def holders(self, record_id: str) -> list[ScopeRow]:
        """The scopes that hold ``record_id``, live or forgotten, oldest scope first: a
        record id identifies a record within its scope, so the same id may be in several
        (the operator's look-up of a bare id chooses among them)."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"""{_SCOPE_ROW} WHERE s.id IN (
                        SELECT scope_id FROM engram_records WHERE id = %(id)s
                        UNION SELECT scope_id FROM engram_forgotten WHERE record_id = %(id)s)
                    ORDER BY s.id LIMIT 100""",
                {"id": record_id},
            ).fetchall()
        return [_scope_row(r) for r in rows]

    def holder(self, record_id: str) -> ScopeRow | None:
        """The one scope that holds ``record_id`` (live or forgotten), None if none does;
        ``RecordAmbiguousError`` naming the scopes when several do."""
        found = self.holders(record_id)
        if len(found) > 1:
            raise RecordAmbiguousError(
                f"record {record_id} is in {len(found)} scopes: name its scope",
                scopes=[row.scope.as_dict() for row in found],
            )
        return found[0] if found else None

    @routed
    def record(self, scope_id: int, record_id: str) -> RecordItem | None:
        """A record's current revision in its scope, whatever its status or expiry."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"""SELECT {REVISION_COLUMNS}, r.scope_id,
                           r.expires_at IS NOT NULL AND r.expires_at <= now()
                    FROM engram_records r
                    JOIN engram_scopes s ON s.id = r.scope_id
                    JOIN engram_revisions v
                      ON v.scope_id = r.scope_id AND v.record_id = r.id AND v.revision = r.revision
                    WHERE r.scope_id = %s AND r.id = %s""",
                (scope_id, record_id),
            ).fetchall()
            if not rows:
                return None
            links = superseded_by(conn, [scope_id], [record_id])
        row = rows[0]
        return RecordItem(record_from_row(row, links.get(record_id, ())), row[15], row[16])

    @routed
    def history(self, scope_id: int, record_id: str) -> list[Record]:
        """Every stored revision of a record of the scope, oldest first (a record has few)."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"""SELECT {REVISION_COLUMNS} FROM engram_revisions v
                    JOIN engram_scopes s ON s.id = v.scope_id
                    WHERE v.scope_id = %s AND v.record_id = %s ORDER BY v.revision""",
                (scope_id, record_id),
            ).fetchall()
        return [record_from_row(r) for r in rows]

    @routed
    def history_page(
        self,
        scope_id: int,
        record_id: str,
        *,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
        newest_first: bool = True,
    ) -> HistoryPage:
        """A page of a record's stored revisions (of the scope) by keyset on the revision
        (the primary key's order), and the revision just past the page, if any: what the
        page's last one changed from, when newest first."""
        limit = check_limit(limit)
        kind = "history" if newest_first else "history-asc"
        after: int | None = None
        if cursor is not None:
            held, revision = self.cursors.decode(cursor, kind, (str, int))
            after = int(revision)  # type: ignore[arg-type]  # decoded as an int
            if held != record_id:
                raise InvalidCursorError("the cursor is for another record's history")
        op, order = ("<", "DESC") if newest_first else (">", "ASC")
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"""SELECT {REVISION_COLUMNS} FROM engram_revisions v
                    JOIN engram_scopes s ON s.id = v.scope_id
                    WHERE v.scope_id = %(scope)s AND v.record_id = %(id)s
                      AND (%(after)s::integer IS NULL OR v.revision {op} %(after)s::integer)
                    ORDER BY v.revision {order} LIMIT %(n)s""",
                {"scope": scope_id, "id": record_id, "after": after, "n": limit + 1},
            ).fetchall()
        found = [record_from_row(r) for r in rows]
        shown, past = found[:limit], (found[limit] if len(found) > limit else None)
        next_cursor = (
            self.cursors.encode(kind, (record_id, shown[-1].revision)) if past is not None else None
        )
        return HistoryPage(shown, next_cursor, past)

    @routed
    def revision_count(self, scope_id: int, record_id: str) -> int:
        """How many revisions of a record of the scope are stored (counted by the database)."""
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT count(*) FROM engram_revisions WHERE scope_id = %s AND record_id = %s",
                (scope_id, record_id),
            ).fetchone()
        return int(row[0]) if row else 0

    @routed
    def linked_from(self, record_id: str, scope_id: int, limit: int = 100) -> list[Backlink]:
        """The records of the scope whose current revision links to this one (the way
        back of ``supersedes`` and ``about``), whatever their status."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT l.record_id, l.relation, r.status,
                          r.expires_at IS NOT NULL AND r.expires_at <= now()
                   FROM engram_links l
                   JOIN engram_records r ON r.scope_id = l.scope_id AND r.id = l.record_id
                   WHERE l.scope_id = %s AND l.target_id = %s
                   ORDER BY l.relation, l.record_id LIMIT %s""",
                (scope_id, record_id, check_limit(limit)),
            ).fetchall()
        return [Backlink(*r) for r in rows]

    @routed
    def tombstone(self, scope_id: int, record_id: str) -> Tombstone | None:
        """The tombstone of a record the scope forgot, if it did."""
        with self.pool.connection() as conn:
            row = conn.execute(
                f"{_TOMBSTONE} WHERE f.scope_id = %s AND f.record_id = %s", (scope_id, record_id)
            ).fetchone()
        return _tombstone(row) if row else None

    # -- receipts -------------------------------------------------------------------

    def receipts(
        self,
        where: ReceiptFilter | None = None,
        *,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
    ) -> Page[ReceiptItem]:
        """Receipts (refusals included unless filtered out), newest first."""
        limit = check_limit(limit)
        where = where or ReceiptFilter()
        clauses, params = receipt_clauses(where)
        # One scope's receipts are read through the (scope, time) index, ordered by scope
        # first: with the scope only equal to itself, the planner would count on finding
        # them early in the time index, wrong for a scope whose last write is old.
        # An operation id is its scope's: the same id in two scopes may share a commit
        # time (one batch), so across scopes the scope breaks the tie.
        keys, values = ["c.committed_at", "c.operation_id"], ["%(at)s", "%(op)s"]
        if where.scope_id is not None:
            keys, values = ["c.scope_id", *keys], ["%(scope)s", *values]
        else:
            keys, values = [*keys, "c.scope_id"], [*values, "%(sid)s"]
        if cursor is not None:
            params["at"], params["op"], params["sid"] = self.cursors.decode(
                cursor, "receipts", (datetime, str, int)
            )
            clauses.append(f"({', '.join(keys)}) < ({', '.join(values)})")
        order = ", ".join(f"{k} DESC" for k in keys)
        with self.primary.connection() as conn:
            rows = conn.execute(
                f"""SELECT {RECEIPT_COLUMNS}, c.scope_id, c.request->>'id' FROM engram_receipts c
                    JOIN engram_scopes s ON s.id = c.scope_id
                    WHERE {" AND ".join(clauses)}
                    ORDER BY {order} LIMIT %(n)s""",
                {**params, "n": limit + 1},
            ).fetchall()
        return paged(
            rows,
            limit,
            (self.cursors, "receipts"),
            lambda r: (r[4], r[0], r[RECEIPT_WIDTH]),
            lambda r: ReceiptItem(receipt_from_row(r), r[RECEIPT_WIDTH], r[RECEIPT_WIDTH + 1]),
        )

    def asked_by(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Receipt]:
        """The receipt of each operation, as (scope key, operation id): who asked for it
        (``requested_by``), and whether that name is authenticated (a scoped token's) or
        only claimed, read as the receipts API reads it."""
        with self.primary.connection() as conn:
            rows = conn.execute(
                f"""SELECT {RECEIPT_COLUMNS}
                    FROM unnest(%s::text[], %s::text[]) AS k(scope_key, op)
                    JOIN engram_scopes s ON s.key = k.scope_key
                    JOIN engram_receipts c ON c.scope_id = s.id AND c.operation_id = k.op""",
                ([k[0] for k in keys], [k[1] for k in keys]),
            ).fetchall()
        receipts = [receipt_from_row(r) for r in rows]
        return {(r.scope.key, r.operation_id): r for r in receipts}

    def receipt(self, operation_id: str, scope: Scope | None = None) -> ReceiptItem | None:
        """The receipt of ``operation_id`` in ``scope`` (an operation id identifies an
        operation within its scope). Without a scope, the operator's look-up in every
        scope: the one that holds it, or ``OperationAmbiguousError`` naming the scopes
        when several do."""
        found = self.receipts_of(operation_id, scope)
        if len(found) > 1:
            raise OperationAmbiguousError(
                f"operation {operation_id} is in {len(found)} scopes: name its scope",
                scopes=[item.receipt.scope.as_dict() for item in found],
            )
        return found[0] if found else None

    def receipts_of(self, operation_id: str, scope: Scope | None = None) -> list[ReceiptItem]:
        """Every receipt of ``operation_id``: in ``scope`` (one at most), or in every
        scope (the operator's), oldest scope first."""
        clause, params = "c.operation_id = %(op)s", {"op": operation_id}
        if scope is not None:
            clause += " AND s.key = %(key)s"
            params["key"] = scope.key
        with self.primary.connection() as conn:
            rows = conn.execute(
                f"""SELECT {RECEIPT_COLUMNS}, c.scope_id, c.request->>'id' FROM engram_receipts c
                    JOIN engram_scopes s ON s.id = c.scope_id WHERE {clause}
                    ORDER BY c.scope_id LIMIT 100""",
                params,
            ).fetchall()
        return [
            ReceiptItem(receipt_from_row(row), row[RECEIPT_WIDTH], row[RECEIPT_WIDTH + 1])
            for row in rows
        ]

    # -- generations ----------------------------------------------------------------

    @routed
    def generations(
        self, *, cursor: str | None = None, limit: int = DEFAULT_PAGE_SIZE
    ) -> Page[GenerationItem]:
        """Every generation, newest first, with how many vectors it holds."""
        limit = check_limit(limit)
        params: dict[str, Any] = {"n": limit + 1, "before": 2**31 - 1}
        if cursor is not None:
            (params["before"],) = self.cursors.decode(cursor, "generations", (int,))
        with self.pool.connection() as conn:
            rows = conn.execute(
                """SELECT g.id, g.model_id, g.dims, g.status, g.created_at, g.activated_at,
                          g.progress,
                          (SELECT count(*) FROM engram_vectors x WHERE x.generation_id = g.id)
                   FROM engram_generations g WHERE g.id < %(before)s
                   ORDER BY g.id DESC LIMIT %(n)s""",
                params,
            ).fetchall()
        return paged(
            rows,
            limit,
            (self.cursors, "generations"),
            lambda r: (r[0],),
            lambda r: GenerationItem(Generation(*r[:7]), r[7]),
        )


_SCOPE_ROW = """
    SELECT s.id, s.key, s.revision,
           (SELECT count(*) FROM engram_records r WHERE r.scope_id = s.id),
           (SELECT count(*) FROM engram_forgotten f WHERE f.scope_id = s.id),
           (SELECT max(c.committed_at) FROM engram_receipts c
            WHERE c.scope_id = s.id AND c.error IS NULL)
    FROM engram_scopes s
"""

_TOMBSTONE = f"""
    SELECT f.record_id, f.scope_id, f.forgotten_at, f.operation_id, c.requested_by,
        c.operation_id IS NOT NULL AND {VOUCHED}
    FROM engram_forgotten f
    JOIN engram_scopes s ON s.id = f.scope_id
    LEFT JOIN engram_receipts c ON c.scope_id = f.scope_id AND c.operation_id = f.operation_id
"""


def _scope_row(row: Any) -> ScopeRow:
    return ScopeRow(row[0], scope_from_key(row[1]), row[2], row[3], row[4], row[5])


def _tombstone(row: Any) -> Tombstone:
    return Tombstone(*row)


def _scope_match(match: Mapping[str, str], exact: bool) -> tuple[list[str], dict[str, Any]]:
    unknown = sorted(set(match) - set(SCOPE_FIELDS))
    if unknown:
        raise InvalidRequestError(f"unknown scope field(s): {', '.join(unknown)}")
    clauses: list[str] = ["true"]
    params: dict[str, Any] = {}
    for name in SCOPE_FIELDS:  # names from our own list: safe in the SQL text
        value = match.get(name)
        if value is None:
            continue
        check_string(value, f"scope.{name}", max_chars=MAX_SCOPE_VALUE_CHARS)
        if exact:
            clauses.append(f"s.{name} = %({name})s")
            params[name] = value
        else:
            clauses.append(f"s.{name} LIKE %({name})s")
            params[name] = _like_prefix(value)
    return clauses, params


def _like_prefix(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
