"""The dead-letter stream ``engram:dead``: entries that were never applied.

A dead letter keeps the operation as sent (so it can be inspected, fixed and
enqueued again, or redacted by a forget) with the error that stopped it. It is
never trimmed here; logs name only its ids.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import redis

from engram.store import Scope
from engram.store.errors import (
    EmbedderUnavailableError,
    EngramError,
    InvalidRequestError,
    ModelOutputError,
    ModelUnavailableError,
    NotFoundError,
)
from engram.worker import cluster, keys, layout
from engram.worker.admin import streams
from engram.worker.consuming.membership import now_ms
from engram.worker.defaults import STREAM_MAX_LEN
from engram.worker.errors import QueueFullError, QueueUnavailableError
from engram.worker.layout import Epoch
from engram.worker.protocol import OP_FIELD, Entry, decode_entry, partition_of

if TYPE_CHECKING:
    from engram.store.audit import Audit

# Why an entry was dead-lettered.
MALFORMED = "malformed"  # not a valid operation for its partition
DELIVERIES = "deliveries"  # delivered too many times without a commit
FAILED = "failed"  # its commit raised an unexpected error on its own
REASONS = (MALFORMED, DELIVERIES, FAILED)

TOO_MANY_DELIVERIES = "too_many_deliveries"

# A letter of a failed commit written before causes named its error's class only.
_APPLIED = re.compile(r"could not be applied \(([A-Za-z_][A-Za-z0-9_]{0,63})\)")
_LEGACY = {
    cls.__name__: cls.code
    for cls in (EmbedderUnavailableError, ModelUnavailableError, ModelOutputError)
}

# An operator's why for a retry or discard: free text, kept in the audit row.
MAX_WHY_CHARS = 200


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
    epoch: int = 0  # the layout epoch of ``partition`` (``layout``)

    @property
    def code(self) -> str:
        """What stopped it, as a code that tells the causes apart: the error's ``cause``
        (``invalid_json``, ``too_many_deliveries``, ``embedder_unavailable``...), else its
        ``code``, read back as well as it can be from a letter written before causes."""
        cause = self.error.get("cause")
        if isinstance(cause, str) and cause:
            return cause[:64]
        code = self.error.get("code")
        code = code[:64] if isinstance(code, str) else ""
        if code == "dead_lettered" and self.reason == DELIVERIES:
            return TOO_MANY_DELIVERIES
        if code == "dead_lettered" and self.reason == FAILED:
            found = _APPLIED.search(str(self.error.get("message", "")))
            return _LEGACY.get(found.group(1), code) if found else code
        return code

    @property
    def scope(self) -> Scope | None:
        """The scope of the operation as sent, when it can be read (an operation id is
        its scope's: the letter's operation is found by both)."""
        if not self.op:
            return None
        try:
            data = json.loads(self.op)
            return Scope.of(data["scope"]) if isinstance(data, dict) else None
        except Exception:  # anything at all: what was sent is untrusted
            return None

    @property
    def detail(self) -> str | None:
        """The root cause: its error's type and content-free message, when it was kept."""
        detail = self.error.get("detail")
        return detail if isinstance(detail, str) and detail else None

    def as_dict(self) -> dict[str, Any]:
        """The letter as JSON, one shape for the API and the CLI."""
        at = datetime.fromtimestamp(self.at_ms / 1000, tz=UTC)
        return {
            "id": self.id,
            "partition": self.partition,
            "entry": self.entry_id,
            "operation_id": self.operation_id,
            "reason": self.reason,
            "code": self.code,
            "detail": self.detail,
            "error": self.error,
            "deliveries": self.deliveries,
            "at_ms": self.at_ms,
            "at": at.isoformat(),
            "op": self.op,
            "malformed": self.malformed,
        }


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
    epoch: int = 0,
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
            # Epoch 0's letters keep the fields they had before any repartition.
            **({"epoch": epoch} if epoch else {}),
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
# then XDEL the letter, unless the letter is gone, the stream is at its cap or a
# repartition closed it (KEYS[3], as for the producers: ``layout``). The reply the
# failed delivery left (KEYS[4], when the letter names its operation) goes in the same
# step: the operation is waiting again, and whoever reads its reply (the dashboard's
# operation page, a producer's ``wait``) must not take the first delivery's failure
# for the retry's outcome.
_RETRY = f"""
local found = redis.call('XRANGE', KEYS[2], ARGV[1], ARGV[1])
if #found == 0 then return false end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return redis.error_reply('ENGRAMMOVED partition closed by a repartition')
end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return redis.error_reply('ENGRAMFULL partition stream is full')
end
local id = redis.call('XADD', KEYS[1], '*', '{OP_FIELD}', ARGV[2])
redis.call('XDEL', KEYS[2], ARGV[1])
if ARGV[4] == '1' then redis.call('DEL', KEYS[4]) end
return id
"""

# On a Redis Cluster the stream and the dead letters are in two slots, which no script
# may touch together: the producers' capped XADD first (``layout.ADD_SCRIPT``), then XDEL.
# A retry cut between the two enqueues the operation twice: its receipt makes the second
# a replay. An XDEL that finds the letter gone (a redaction deleted it, a discard, another
# retry) takes the entry back (``_take_back``): a redaction that deleted the letter before
# this retry added its entry may have read the stream already, and would leave it there.
# The failed delivery's reply stays (a third slot): the operation page sees the entry in
# the backlog and follows the retry all the same (``web.views.receipts``).


def _reply_key(letter: DeadLetter) -> str | None:
    """The reply key of the letter's operation, when its id and its scope can be read
    from what was sent (an operation id is its scope's)."""
    scope = letter.scope
    if not letter.operation_id or scope is None:
        return None
    return keys.reply(scope.key, letter.operation_id)


def home_partition(letter: DeadLetter, now: Epoch) -> int | None:
    """The partition a retry of the letter should go to, or None when it can never succeed.

    ``now`` is the epoch producers send to (``layout``). A letter dead-lettered for
    deliveries or a failed commit was read as a valid operation on its partition: back
    there, if that partition is of ``now``'s epoch. A malformed one can only succeed if
    it holds a valid operation that was on the wrong partition: then on the one its
    scope belongs to, as is a valid letter of an earlier epoch (a repartition came between).
    """
    if letter.op is None or letter.malformed:
        return None
    try:
        expected = partition_of(json.loads(letter.op)["scope"], now.partitions)
    except Exception:  # not JSON, no scope, a scope that is not one: never valid
        return None
    decoded = decode_entry(
        letter.entry_id or "0-0",
        {OP_FIELD: letter.op},
        partition=expected,
        partitions=now.partitions,
    )
    if not isinstance(decoded, Entry):
        return None
    if letter.reason == MALFORMED or letter.epoch != now.number:
        return expected
    return letter.partition


def attempt(letter: DeadLetter) -> dict[str, str | int]:
    """What a retry should remember of the letter it removes (for the audit row): why it
    was dead-lettered, after how many deliveries, with which error code."""
    return {
        "dead_reason": letter.reason,
        "deliveries": letter.deliveries,
        "error_code": letter.code,
    }


def check_why(value: Any) -> str | None:
    """An operator's why, or None; ``InvalidRequestError`` past ``MAX_WHY_CHARS``."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > MAX_WHY_CHARS:
        raise InvalidRequestError(f"a reason is text of at most {MAX_WHY_CHARS} characters")
    return value.strip() or None


def retry(
    client: redis.Redis,
    dead_id: str,
    *,
    partition: int | None = None,
    stream_max_len: int = STREAM_MAX_LEN,
) -> str | None:
    """Enqueue a dead letter's operation again, as sent, on ``partition`` (by default the
    one it came from), and remove the letter; the new entry's id, or None when there is
    no such letter.

    A letter that holds no operation (the entry had no ``op`` field) cannot be retried:
    ``InvalidRequestError``. A letter that is still malformed is dead-lettered again.
    """
    letter = get(client, dead_id)
    if letter is None:
        return None
    return requeue(client, letter, partition=partition, stream_max_len=stream_max_len)


def requeue(
    client: redis.Redis,
    letter: DeadLetter,
    *,
    partition: int | None = None,
    stream_max_len: int = STREAM_MAX_LEN,
) -> str | None:
    """``retry``'s move of a letter read before: None, nothing enqueued, when the letter
    is gone by the time it would move (deleted by a redaction, discarded, retried)."""
    dead_id = letter.id
    if letter.op is None:
        raise InvalidRequestError(f"dead letter {dead_id} holds no operation to enqueue again")
    # The partition numbers the layout in use: its epoch's stream.
    found = layout.stored(client)
    epoch = found.current.number if found is not None else 0
    number = letter.partition if partition is None else partition
    stream, closed = keys.stream(number, epoch), keys.closed(number, epoch)
    try:
        if cluster.is_cluster(client):
            new_id = client.eval(layout.ADD_SCRIPT, 2, stream, closed, stream_max_len, letter.op)
            if not client.xdel(keys.DEAD_LETTERS, dead_id):
                _take_back(client, stream, _s(new_id))
                return None
        else:
            reply = _reply_key(letter)
            new_id = client.eval(
                _RETRY,
                4,
                stream,
                keys.DEAD_LETTERS,
                closed,
                reply or keys.reply("", ""),
                dead_id,
                letter.op,
                stream_max_len,
                "1" if reply else "0",
            )
    except redis.ResponseError as exc:
        if str(exc).startswith(layout.MOVED):
            raise QueueUnavailableError(
                f"dead letter {dead_id} not retried: a repartition began meanwhile; retry it again"
            ) from exc
        if str(exc).startswith("ENGRAMFULL"):
            raise QueueFullError(
                f"dead letter {dead_id} not retried: partition {letter.partition} is full"
            ) from exc
        raise
    return _s(new_id) if new_id is not None else None


def _take_back(client: redis.Redis, stream: str, entry_id: str) -> None:
    """Delete an entry a retry added for a letter gone meanwhile, its bytes too
    (``streams.delete``). A worker that read it already answers it as the store does:
    a forgotten record's operation is refused or replayed, never applied."""
    streams.delete(client, stream, [entry_id])


def discard(client: redis.Redis, dead_id: str) -> bool:
    """Delete a dead letter for good; False when there was none with that id."""
    return bool(client.xdel(keys.DEAD_LETTERS, check_id(dead_id)))


def retry_audited(
    client: redis.Redis,
    audit: Audit,
    who: str,
    letter: DeadLetter,
    home: int | None,
    why: str | None = None,
    bulk: int = 0,
) -> str:
    """``retry`` onto ``home`` (else where it came from), then the audit row: who, why,
    where it went and what the letter went through (it is gone; its history stays
    there). ``NotFoundError`` when the letter is gone already."""
    entry = retry(client, letter.id, partition=home)
    if entry is None:
        raise NotFoundError(f"no dead letter {letter.id}")
    detail: dict[str, Any] = {
        "partition": letter.partition if home is None else home,
        "entry": entry,
        "operation_id": letter.operation_id,
        **_scope_of(letter),
        **attempt(letter),
    }
    audit.record(who, "dead_letter.retry", letter.id, _why(detail, why, bulk))
    return entry


def discard_audited(
    client: redis.Redis,
    audit: Audit,
    who: str,
    letter: DeadLetter,
    why: str | None = None,
    bulk: int = 0,
) -> None:
    """``discard``, then the audit row; ``NotFoundError`` when the letter is gone."""
    if not discard(client, letter.id):
        raise NotFoundError(f"no dead letter {letter.id}")
    detail = {
        "partition": letter.partition,
        "operation_id": letter.operation_id,
        **_scope_of(letter),
    }
    audit.record(who, "dead_letter.discard", letter.id, _why(detail, why, bulk))


def _scope_of(letter: DeadLetter) -> dict[str, str]:
    """The scope key of the letter's operation, when it can be read: an operation id is
    its scope's, so what became of a letter is found by both."""
    scope = letter.scope
    return {"scope": scope.key} if scope is not None else {}


def _why(detail: dict[str, Any], why: str | None, bulk: int) -> dict[str, Any]:
    if why is not None:
        detail["reason"] = why
    if bulk:
        detail["bulk"] = bulk  # one of this many, confirmed together
    return detail


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
        epoch=int(f.get("epoch") or 0),
    )


def _s(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
