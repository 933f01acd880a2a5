"""The audit trail of actions that are not memory operations: who retried or
discarded a dead letter, who started or cancelled a reembed, who retried a job, who
changed the number of partitions, paused or resumed, created or revoked a token,
pruned by hand. Every door (the CLI, the dashboard, the API) writes one, with who and,
when given, why (``reason`` in the detail).

A memory operation records who asked on its own receipt (``requested_by``);
these actions change Redis or start a job, so they get a row here instead.
Content-free by construction: the target is an id and the detail holds ids,
numbers and flags only, never memory text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from .errors import InvalidRequestError
from .limits import MAX_ID_CHARS
from .read.cursors import Cursors
from .read.paging import DEFAULT_PAGE_SIZE, Page, check_limit, paged
from .values import check_string

ACTIONS = (
    "dead_letter.retry",
    "dead_letter.discard",
    "record.forget",
    "reembed.start",
    "reembed.cancel",
    "job.retry",
    "job.discard",
    "partition.pause",
    "partition.resume",
    "jobs.pause",
    "jobs.resume",
    "layout.repartition",
    "token.create",
    "token.revoke",
    "prune.run",
    "database.restore",
)
# The target of a restore's row: the database itself.
DATABASE = "database"


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: datetime
    requested_by: str
    action: str
    target: str
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Which rows a page shows: of one action, by one asker, about one target, written
    in a span of time (``since`` at or after, ``until`` before); none: every row."""

    action: str | None = None
    requested_by: str | None = None
    target: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.action is not None and self.action not in ACTIONS:
            raise InvalidRequestError(f"audit action must be one of {', '.join(ACTIONS)}")
        for name, value in (("requested_by", self.requested_by), ("target", self.target)):
            if value is not None:
                check_string(value, name, max_chars=MAX_ID_CHARS)

    def where(self) -> tuple[list[str], dict[str, Any]]:
        """The SQL conditions and their parameters."""
        terms: list[str] = []
        params: dict[str, Any] = {}
        for column, value, op in (
            ("action", self.action, "="),
            ("requested_by", self.requested_by, "="),
            ("target", self.target, "="),
            ("at", self.since, ">="),
            ("at", self.until, "<"),
        ):
            if value is not None:
                name = f"f{len(params)}"
                terms.append(f"{column} {op} %({name})s")
                params[name] = value
        return terms, params


_COLUMNS = "id, at, requested_by, action, target, detail"
# The earlier attempts a dead letter shows at most.
MAX_ATTEMPTS = 50


Detail = Mapping[str, int | float | bool | str | None]


def checked(
    requested_by: str, action: str, target: str, detail: Detail | None
) -> dict[str, int | float | bool | str | None]:
    """The row's detail, once its action, names and detail are known to be content-free."""
    if action not in ACTIONS:
        raise InvalidRequestError(f"audit action must be one of {', '.join(ACTIONS)}")
    check_string(requested_by, "requested_by", max_chars=MAX_ID_CHARS)
    check_string(target, "audit target", max_chars=MAX_ID_CHARS)
    plain = dict(detail or {})
    for key, value in plain.items():
        if not isinstance(value, int | float | bool | None) and not (
            isinstance(value, str) and len(value) <= MAX_ID_CHARS
        ):
            raise InvalidRequestError(f"audit detail {key!r} must be an id, number or flag")
    return plain


def insert(
    conn: Any, requested_by: str, action: str, target: str, detail: Detail | None = None
) -> AuditEntry:
    """Write one row on ``conn``, inside whatever transaction the caller holds (a token's
    creation and its audit row commit together)."""
    plain = checked(requested_by, action, target, detail)
    row = conn.execute(
        "INSERT INTO engram_audit (requested_by, action, target, detail)"
        f" VALUES (%s, %s, %s, %s) RETURNING {_COLUMNS}",
        (requested_by, action, target, Jsonb(plain)),
    ).fetchone()
    assert row is not None
    return AuditEntry(*row)


class Audit:
    def __init__(self, pool: Any, cursors: Cursors) -> None:
        self.pool = pool
        self.cursors = cursors

    def record(
        self,
        requested_by: str,
        action: str,
        target: str,
        detail: Detail | None = None,
    ) -> AuditEntry:
        with self.pool.connection() as conn:
            return insert(conn, requested_by, action, target, detail)

    def retries_of(self, operation_id: str, *, limit: int = MAX_ATTEMPTS) -> list[AuditEntry]:
        """The retries of an operation's dead letters, oldest first: what each letter
        went through before it was sent again (migration 012's index)."""
        where = "action = 'dead_letter.retry' AND detail ->> 'operation_id' = %s"
        return self._oldest_first(where, operation_id, limit)

    def last_letter_action(self, operation_id: str, scope_key: str) -> AuditEntry | None:
        """The latest retry or discard of this operation's dead letters in its scope
        (migration 012's index; a row from before operation ids were their scope's names
        none, and counts for any), or None: what became of its last failure."""
        with self.pool.connection() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM engram_audit WHERE detail ->> 'operation_id' = %s"
                " AND action IN ('dead_letter.retry', 'dead_letter.discard')"
                " AND coalesce(detail ->> 'scope', %s) = %s"
                " ORDER BY at DESC, id DESC LIMIT 1",
                (operation_id, scope_key, scope_key),
            ).fetchone()
        return AuditEntry(*row) if row is not None else None

    def letter_scopes(self, operation_id: str) -> set[str]:
        """The scope keys the retried or discarded dead letters of ``operation_id`` named
        (an operation id is its scope's): whose operation a letter that is gone was."""
        with self.pool.connection() as conn:
            rows = conn.execute(
                "SELECT DISTINCT detail ->> 'scope' FROM engram_audit"
                " WHERE detail ->> 'operation_id' = %s"
                " AND action IN ('dead_letter.retry', 'dead_letter.discard')"
                " AND detail ? 'scope' LIMIT 100",
                (operation_id,),
            ).fetchall()
        return {r[0] for r in rows if isinstance(r[0], str)}

    def about(self, target: str, *, limit: int = MAX_ATTEMPTS) -> list[AuditEntry]:
        """The rows about ``target`` (a record id, a job id...), oldest first."""
        return self._oldest_first("target = %s", target, limit)

    def last_restore(self) -> datetime | None:
        """When ``engram restore`` last finished bringing this database back (its audit
        row, written before anything served it again): whatever committed before that
        and is not in the database was lost to it (migration 012's target index)."""
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT at FROM engram_audit WHERE target = %s AND action = 'database.restore'"
                " ORDER BY at DESC, id DESC LIMIT 1",
                (DATABASE,),
            ).fetchone()
        return row[0] if row else None

    def _oldest_first(self, where: str, value: str, limit: int) -> list[AuditEntry]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM engram_audit WHERE {where} ORDER BY at, id LIMIT %s",
                (value, limit),
            ).fetchall()
        return [AuditEntry(*r) for r in rows]

    def page(
        self,
        *,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
        where: AuditFilter | None = None,
    ) -> Page[AuditEntry]:
        """Newest first, the rows ``where`` admits (a cursor goes on with the same filter)."""
        limit = check_limit(limit)
        terms, params = (where or AuditFilter()).where()
        params["n"] = limit + 1
        if cursor is not None:
            params["at"], params["id"] = self.cursors.decode(cursor, "audit", (datetime, int))
            terms.append("(at, id) < (%(at)s, %(id)s)")
        condition = f"WHERE {' AND '.join(terms)}" if terms else ""
        with self.pool.connection() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM engram_audit {condition} ORDER BY at DESC, id DESC"
                " LIMIT %(n)s",
                params,
            ).fetchall()
        return paged(
            rows, limit, (self.cursors, "audit"), lambda r: (r[1], r[0]), lambda r: AuditEntry(*r)
        )
