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

from engram.store import Operation
from engram.store.errors import EngramError
from engram.store.write.apply import referenced_ids

# Kinds whose request holds nothing but ids and numbers.
_CONTENT_FREE_KINDS = ("forget", "retract")


@dataclass(frozen=True, slots=True)
class Forgotten:
    record_ids: frozenset[str]
    operation_ids: frozenset[str]  # the operations that wrote those records

    @classmethod
    def of(cls, record_ids: Iterable[str], operation_ids: Iterable[str]) -> Forgotten:
        return cls(frozenset(record_ids), frozenset(operation_ids))

    def holds(self, raw_op: str | bytes | None) -> bool:
        """True when this operation (the ``op`` field as sent) may hold forgotten text."""
        data = parse(raw_op)
        if data is None or data.get("kind") in _CONTENT_FREE_KINDS:
            return False
        if data.get("operation_id") in self.operation_ids:
            return True
        try:
            named = referenced_ids(Operation.from_dict(data))
        except (EngramError, TypeError, ValueError, KeyError):
            request = data.get("request")
            named = [str(request.get("id"))] if isinstance(request, Mapping) else []
        return any(rid in self.record_ids for rid in named)


def parse(raw_op: str | bytes | None) -> dict[str, Any] | None:
    if raw_op is None:
        return None
    try:
        data = json.loads(raw_op)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
