"""Filtering the operation log: which receipts a page of ``Browse.receipts`` shows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..errors import InvalidRequestError
from ..limits import MAX_ID_CHARS, MAX_SCOPE_VALUE_CHARS
from ..values import SCOPE_FIELDS, check_string
from ..write.operations import OPERATION_KINDS

_MAX_CHAR = 0x10FFFF


@dataclass(frozen=True, slots=True)
class ReceiptFilter:
    scope_id: int | None = None
    # Scope fields and their values: receipts of every scope with these (and any others).
    scope: Mapping[str, str] = field(default_factory=dict)
    record_id: str | None = None  # receipts that wrote it, and the forget that erased it
    record_prefix: str | None = None  # the same, for every record id that begins so
    kind: str | None = None
    replayed: bool | None = None
    redacted: bool | None = None
    refused: bool | None = None  # True: only refusals; False: none; None: both
    requested_by: str | None = None
    requested_by_prefix: str | None = None
    since: datetime | None = None  # committed at or after
    until: datetime | None = None  # committed before

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in OPERATION_KINDS:
            raise InvalidRequestError(f"kind must be one of {', '.join(OPERATION_KINDS)}")
        for name in ("since", "until"):
            at = getattr(self, name)
            if at is not None and (not isinstance(at, datetime) or at.tzinfo is None):
                raise InvalidRequestError(f"{name} must be a time with a time zone")
        unknown = sorted(set(self.scope) - set(SCOPE_FIELDS))
        if unknown:
            raise InvalidRequestError(f"unknown scope field(s): {', '.join(map(str, unknown))}")
        for name, value in self.scope.items():
            check_string(value, f"scope.{name}", max_chars=MAX_SCOPE_VALUE_CHARS)
        for name in ("record_prefix", "requested_by_prefix"):
            value = getattr(self, name)
            if value is not None:
                check_string(value, name, max_chars=MAX_ID_CHARS)


def receipt_clauses(f: ReceiptFilter) -> tuple[list[str], dict[str, Any]]:
    """The filter as SQL. The rare kinds are written as the literal predicates of
    their partial indexes (migration 004), so the planner can use those."""
    clauses: list[str] = ["true"]
    params: dict[str, Any] = {}
    if f.scope_id is not None:
        # A range, not "=": the scope stays a sort key (see ``Browse.receipts``).
        clauses.append("c.scope_id BETWEEN %(scope)s AND %(scope)s")
        params["scope"] = f.scope_id
    if f.scope:
        clauses.append(_scope_clause(f.scope, params))
    if f.record_id is not None:
        clauses.append(
            "(c.scope_id, c.operation_id) IN (SELECT scope_id, operation_id"
            " FROM engram_receipt_records WHERE record_id = %(rid)s UNION ALL"
            " SELECT scope_id, operation_id FROM engram_forgotten WHERE record_id = %(rid)s"
            # A refusal touched no record: its request names the one it was about.
            " UNION ALL SELECT scope_id, operation_id FROM engram_receipts"
            " WHERE error IS NOT NULL AND request ->> 'id' = %(rid)s)"
        )
        params["rid"] = f.record_id
    if f.record_prefix is not None:
        clauses.append(
            "(c.scope_id, c.operation_id) IN (SELECT scope_id, operation_id"
            " FROM engram_receipt_records"
            f" WHERE {_begins('record_id', 'rp', f.record_prefix, params)} UNION ALL"
            " SELECT scope_id, operation_id FROM engram_forgotten"
            f" WHERE {_begins('record_id', 'rp', f.record_prefix, params, collate_c=True)})"
        )
    if f.kind is not None:  # one of OPERATION_KINDS, checked: a literal is safe
        clauses.append(f"c.kind = '{f.kind}'")
    if f.replayed is not None:
        clauses.append("c.replays > 0" if f.replayed else "c.replays = 0")
    if f.redacted is not None:
        clauses.append("c.redacted" if f.redacted else "NOT c.redacted")
    if f.refused is not None:
        clauses.append("c.error IS NOT NULL" if f.refused else "c.error IS NULL")
    if f.requested_by is not None:
        clauses.append("c.requested_by = %(by)s")
        params["by"] = f.requested_by
    if f.requested_by_prefix is not None:
        clauses.append(_begins("c.requested_by", "bp", f.requested_by_prefix, params))
    if f.since is not None:
        clauses.append("c.committed_at >= %(since)s")
        params["since"] = f.since
    if f.until is not None:
        clauses.append("c.committed_at < %(until)s")
        params["until"] = f.until
    return clauses, params


def _scope_clause(scope: Mapping[str, str], params: dict[str, Any]) -> str:
    """Every scope with these fields' values, whatever its others (the scopes' field
    indexes of migration 004 find them)."""
    found = []
    for name in SCOPE_FIELDS:  # names from our own list: safe in the SQL text
        if name in scope:
            found.append(f"f.{name} = %(s_{name})s")
            params[f"s_{name}"] = scope[name]
    return f"c.scope_id IN (SELECT f.id FROM engram_scopes f WHERE {' AND '.join(found)})"


def _begins(
    column: str, name: str, prefix: str, params: dict[str, Any], *, collate_c: bool = False
) -> str:
    """``column`` begins with ``prefix``: a range of the byte order, read through a
    ``text_pattern_ops`` index (migration 011; its operators are ``~>=~``, ``~<~``) or,
    with ``collate_c``, a ``COLLATE "C"`` one (009). No pattern to escape, whatever the
    database's collation, and the same plan for every prefix."""
    ge, lt = ("~>=~", "~<~") if not collate_c else (">=", "<")
    key = f'({column} COLLATE "C")' if collate_c else column
    params[f"{name}_low"] = prefix
    high = prefix_end(prefix)
    if high is None:
        return f"{key} {ge} %({name}_low)s"
    params[f"{name}_high"] = high
    return f"({key} {ge} %({name}_low)s AND {key} {lt} %({name}_high)s)"


def prefix_end(prefix: str) -> str | None:
    """The first string past every one that begins with ``prefix`` (in code point
    order, which is UTF-8's byte order), or None when there is none."""
    stripped = prefix.rstrip(chr(_MAX_CHAR))
    if not stripped:
        return None
    last = ord(stripped[-1]) + 1
    if 0xD800 <= last <= 0xDFFF:  # surrogates are no characters of a text
        last = 0xE000
    return stripped[:-1] + chr(last)
