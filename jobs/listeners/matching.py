"""Which operations, as sent through the streams, may carry a forgotten record's text.

Redis holds operations as producers sent them (stream entries, dead letters).
The listener never has the text it must erase, only ids: an operation is the
forgotten record's when it wrote it (its operation id is one of the record's
receipts'), or names it (``request.id``), or would create it (a remember or an
extract whose derived record ids include it). Forgets and retracts carry ids
only. Pure logic, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from engram.store import Operation, Scope
from engram.store.errors import EngramError
from engram.store.limits import MAX_STORED_METADATA_BYTES
from engram.store.write.apply import referenced_ids
from engram.store.write.operations import OpKey

# Kinds whose request holds nothing but ids and numbers.
_CONTENT_FREE_KINDS = ("forget", "retract")


@dataclass(frozen=True, slots=True)
class Forgotten:
    # The forgotten records, as (scope key, record id): a record id is its scope's, and
    # the same id in another scope is another record.
    records: frozenset[tuple[str, str]]
    # The operations that wrote those records, as (scope key, operation id): an operation
    # id is its scope's, and the same id in another scope wrote nothing of these.
    operations: frozenset[OpKey]

    @classmethod
    def of(cls, records: Iterable[tuple[str, str]], operations: Iterable[OpKey]) -> Forgotten:
        return cls(frozenset(records), frozenset(operations))

    def holds(self, raw_op: str | bytes | None) -> bool:
        """True when this operation (the ``op`` field as sent) may hold forgotten text."""
        data = parse(raw_op)
        if data is None or data.get("kind") in _CONTENT_FREE_KINDS:
            return False
        try:
            op = Operation.from_dict(data, metadata_bytes=MAX_STORED_METADATA_BYTES)
        except (EngramError, TypeError, ValueError, KeyError):
            op = None
        if op is None:
            if _key_of(data) in self.operations:
                return True
            request = data.get("request")
            named = [str(request.get("id"))] if isinstance(request, Mapping) else []
            scope = _scope_key(data)
            if scope is None:  # whose it is cannot be read: any scope's id, to be safe
                return any(rid == gone for rid in named for _, gone in self.records)
        else:
            if op.key in self.operations:
                return True
            named, scope = referenced_ids(op), op.scope.key
        return any((scope, rid) in self.records for rid in named)

    def wrote(self, operation_id: str | None, raw_op: str | bytes | None) -> bool:
        """True when a dead letter of ``operation_id`` (its ``op`` field as sent) is one
        of the operations that wrote the records, read from its scope."""
        data = parse(raw_op)
        if operation_id is None or data is None:
            return False
        key = _key_of(data)
        return key is not None and (key[0], operation_id) in self.operations


def _scope_key(data: Mapping[str, Any]) -> str | None:
    """The scope key of an operation as sent, when it can be read."""
    try:
        return Scope.of(data["scope"]).key
    except Exception:  # any shape at all: untrusted
        return None


def _key_of(data: Mapping[str, Any]) -> OpKey | None:
    """(scope key, operation id) of an operation as sent, when both can be read."""
    try:
        return (Scope.of(data["scope"]).key, str(data["operation_id"]))
    except Exception:  # any shape at all: untrusted
        return None


def parse(raw_op: str | bytes | None) -> dict[str, Any] | None:
    if raw_op is None:
        return None
    try:
        data = json.loads(raw_op)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
