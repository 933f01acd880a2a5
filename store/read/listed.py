"""The rows the operator's lists hand out (``Browse``): a scope with its counts, a
record with where it lives, a tombstone, a receipt, a generation, a link back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..values import Generation, Receipt, Record, Scope


@dataclass(frozen=True, slots=True)
class ScopeRow:
    id: int
    scope: Scope
    revision: int
    records: int  # live rows, any status (forgotten ones are tombstones)
    forgotten: int
    last_write: datetime | None  # the last committed operation


@dataclass(frozen=True, slots=True)
class RecordItem:
    record: Record
    scope_id: int
    expired: bool  # at the time of the read (or of the "as of" time)


@dataclass(frozen=True, slots=True)
class Tombstone:
    record_id: str
    scope_id: int
    forgotten_at: datetime
    operation_id: str
    requested_by: str | None
    # A scoped token asked (its server vouched for the forget), as on the receipt.
    authenticated: bool = False


@dataclass(frozen=True, slots=True)
class Backlink:
    record_id: str  # the record that links
    relation: str  # supersedes | about
    status: str
    expired: bool


@dataclass(frozen=True, slots=True)
class ReceiptItem:
    receipt: Receipt
    scope_id: int
    # The record id the request named (revise, retract, forget, a remember with an id):
    # a forget's receipt lists no record written, but keeps its request, which is ids only.
    named_record: str | None = None


@dataclass(frozen=True, slots=True)
class GenerationItem:
    generation: Generation
    vectors: int
