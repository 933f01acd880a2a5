"""The dead-letter stream ``engram:dead``: entries that were never applied.

A dead letter keeps the operation as sent (so it can be inspected, fixed and
enqueued again, or redacted by a forget) with the error that stopped it. It is
never trimmed here; logs name only its ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from store.errors import EngramError

from . import keys
from .membership import now_ms

# Why an entry was dead-lettered.
MALFORMED = "malformed"  # not a valid operation for its partition
DELIVERIES = "deliveries"  # delivered too many times without a commit
FAILED = "failed"  # its commit raised an unexpected error on its own


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: str  # in the dead-letter stream
    partition: int
    entry_id: str  # in the partition stream
    operation_id: str | None
    reason: str
    error: dict[str, Any]
    deliveries: int
    at_ms: int
    op: str | None  # the op field as sent


def add(
    pipe: Any,
    *,
    partition: int,
    entry_id: str,
    operation_id: str | None,
    raw: str | None,
    reason: str,
    error: EngramError,
    deliveries: int,
) -> None:
    """XADD a dead letter, in the caller's pipeline."""
    pipe.xadd(
        keys.DEAD_LETTERS,
        {
            "partition": partition,
            "entry": entry_id,
            "operation_id": operation_id or "",
            "reason": reason,
            "error": json.dumps(error.to_dict()),
            "deliveries": deliveries,
            "at_ms": now_ms(),
            "op": raw or "",
        },
    )


def read(client: redis.Redis, count: int = 100) -> list[DeadLetter]:
    """The oldest ``count`` dead letters."""
    out = []
    for raw_id, fields in client.xrange(keys.DEAD_LETTERS, count=count) or []:
        f = {_s(k): _s(v) for k, v in (fields or {}).items()}
        out.append(
            DeadLetter(
                id=_s(raw_id),
                partition=int(f["partition"]),
                entry_id=f["entry"],
                operation_id=f["operation_id"] or None,
                reason=f["reason"],
                error=json.loads(f["error"]),
                deliveries=int(f["deliveries"]),
                at_ms=int(f["at_ms"]),
                op=f["op"] or None,
            )
        )
    return out


def _s(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
