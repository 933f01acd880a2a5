"""Filtering the operation log: which receipts a page of ``Browse.receipts`` shows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .errors import InvalidRequestError
from .operations import OPERATION_KINDS


@dataclass(frozen=True, slots=True)
class ReceiptFilter:
    scope_id: int | None = None
    record_id: str | None = None  # receipts that wrote it, and the forget that erased it
    kind: str | None = None
    replayed: bool | None = None
    redacted: bool | None = None
    refused: bool | None = None  # True: only refusals; False: none; None: both
    requested_by: str | None = None
    since: datetime | None = None  # committed at or after
    until: datetime | None = None  # committed before

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in OPERATION_KINDS:
            raise InvalidRequestError(f"kind must be one of {', '.join(OPERATION_KINDS)}")
        for name in ("since", "until"):
            at = getattr(self, name)
            if at is not None and (not isinstance(at, datetime) or at.tzinfo is None):
                raise InvalidRequestError(f"{name} must be a time with a time zone")


def receipt_clauses(f: ReceiptFilter) -> tuple[list[str], dict[str, Any]]:
    """The filter as SQL. The rare kinds are written as the literal predicates of
    their partial indexes (migration 004), so the planner can use those."""
    clauses: list[str] = ["true"]
    params: dict[str, Any] = {}
    if f.scope_id is not None:
        # A range, not "=": the scope stays a sort key (see ``Browse.receipts``).
        clauses.append("c.scope_id BETWEEN %(scope)s AND %(scope)s")
        params["scope"] = f.scope_id
    if f.record_id is not None:
        clauses.append(
            "c.operation_id IN (SELECT operation_id FROM engram_receipt_records"
            " WHERE record_id = %(rid)s UNION ALL"
            " SELECT operation_id FROM engram_forgotten WHERE record_id = %(rid)s)"
        )
        params["rid"] = f.record_id
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
    if f.since is not None:
        clauses.append("c.committed_at >= %(since)s")
        params["since"] = f.since
    if f.until is not None:
        clauses.append("c.committed_at < %(until)s")
        params["until"] = f.until
    return clauses, params
