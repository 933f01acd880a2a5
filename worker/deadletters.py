"""The dead-letter stream ``engram:dead``: entries that were never applied.

A dead letter keeps the operation as sent (so it can be inspected, fixed and
enqueued again, or redacted by a forget) with the error that stopped it. It is
never trimmed here; logs name only its ids.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import redis

from store.errors import EngramError, InvalidRequestError

from . import keys
from .defaults import STREAM_MAX_LEN
from .errors import QueueFullError
from .membership import now_ms
from .protocol import OP_FIELD

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
    # Its own fields missing or garbage (planted, damaged): shown as such, never retried.
    malformed: bool = False


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
    return [_letter(i, f) for i, f in client.xrange(keys.DEAD_LETTERS, count=count) or []]


def page(client: redis.Redis, *, before: str | None = None, count: int = 50) -> list[DeadLetter]:
    """Up to ``count`` dead letters, newest first, older than the one ``before`` names
    (keyset pagination on the dead-letter stream's ids)."""
    high = f"({check_id(before)}" if before is not None else "+"
    return [
        _letter(i, f)
        for i, f in client.xrevrange(keys.DEAD_LETTERS, max=high, min="-", count=count) or []
    ]


def get(client: redis.Redis, dead_id: str) -> DeadLetter | None:
    found = client.xrange(keys.DEAD_LETTERS, min=check_id(dead_id), max=dead_id, count=1)
    return _letter(*found[0]) if found else None


def count(client: redis.Redis) -> int:
    return int(client.xlen(keys.DEAD_LETTERS))


# Move a dead letter back onto a partition stream, in one step: XADD the op as sent,
# then XDEL the letter, unless the stream is at its cap or the letter is gone.
_RETRY = f"""
local found = redis.call('XRANGE', KEYS[2], ARGV[1], ARGV[1])
if #found == 0 then return false end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return redis.error_reply('ENGRAMFULL partition stream is full')
end
local id = redis.call('XADD', KEYS[1], '*', '{OP_FIELD}', ARGV[2])
redis.call('XDEL', KEYS[2], ARGV[1])
return id
"""


def retry(client: redis.Redis, dead_id: str, *, stream_max_len: int = STREAM_MAX_LEN) -> str | None:
    """Enqueue a dead letter's operation again, as sent, on the partition it came from, and
    remove the letter; the new entry's id, or None when there is no such letter.

    A letter that holds no operation (the entry had no ``op`` field) cannot be retried:
    ``InvalidRequestError``. A letter that is still malformed is dead-lettered again.
    """
    letter = get(client, dead_id)
    if letter is None:
        return None
    if letter.op is None:
        raise InvalidRequestError(f"dead letter {dead_id} holds no operation to enqueue again")
    try:
        new_id = client.eval(
            _RETRY,
            2,
            keys.stream(letter.partition),
            keys.DEAD_LETTERS,
            dead_id,
            letter.op,
            stream_max_len,
        )
    except redis.ResponseError as exc:
        if str(exc).startswith("ENGRAMFULL"):
            raise QueueFullError(
                f"dead letter {dead_id} not retried: partition {letter.partition} is full"
            ) from exc
        raise
    return _s(new_id) if new_id is not None else None


def discard(client: redis.Redis, dead_id: str) -> bool:
    """Delete a dead letter for good; False when there was none with that id."""
    return bool(client.xdel(keys.DEAD_LETTERS, check_id(dead_id)))


def check_id(value: str) -> str:
    """A stream entry id (``<ms>-<seq>``), or ``InvalidRequestError``."""
    if not isinstance(value, str) or not _ENTRY_ID.fullmatch(value):
        raise InvalidRequestError("a stream entry id looks like 1700000000000-0")
    return value


_ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


def _letter(raw_id: Any, fields: Any) -> DeadLetter:
    f = {_s(k): _s(v) for k, v in (fields or {}).items()}
    try:
        return _parsed(raw_id, f)
    except (KeyError, ValueError, TypeError):
        return DeadLetter(_s(raw_id), -1, "", None, MALFORMED, {}, 0, 0, None, malformed=True)


def _parsed(raw_id: Any, f: dict[str, str]) -> DeadLetter:
    error = json.loads(f["error"])
    if not isinstance(error, dict):
        raise TypeError("a dead letter's error is a JSON object")
    return DeadLetter(
        id=_s(raw_id),
        partition=int(f["partition"]),
        entry_id=f["entry"],
        operation_id=f["operation_id"] or None,
        reason=f["reason"],
        error=error,
        deliveries=int(f["deliveries"]),
        at_ms=int(f["at_ms"]),
        op=f["op"] or None,
    )


def _s(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
