"""The stream protocol: pure encoding, decoding and checking, no I/O.

An entry of ``engram:ops:{N}`` has exactly one field, ``op``: the operation
as a JSON object ``{"operation_id", "kind", "scope", "request"}`` (the shape
``store.Operation.from_dict`` accepts). ``N`` is ``crc32(scope key) % P``
where the scope key is the JSON object of the set scope fields, keys sorted,
no whitespace. A reply is one JSON object: ``{"entry": ID, "receipt": {...}}``
or ``{"entry": ID, "error": {"code", "message", ...}}``.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engram.store import Operation, Scope, WriteResult
from engram.store.errors import EngramError, InvalidRequestError
from engram.store.limits import MAX_ID_CHARS, MAX_STORED_METADATA_BYTES, MAX_TEXT_CHARS
from engram.store.values import Receipt, check_string
from engram.store.write.operations import OPERATION_KINDS
from engram.worker.defaults import MAX_ENTRY_BYTES
from engram.worker.errors import MalformedEntryError, error_from_dict

OP_FIELD = "op"

# An entry holds the largest record a writer may ask for (its metadata, and its text at
# 6 bytes a character once JSON-escaped: a control character is \u0001) twice over, so
# even JSON-escaped once more (at most doubled), with its ids and sources, it is taken.
assert 2 * (MAX_STORED_METADATA_BYTES + 6 * MAX_TEXT_CHARS) < MAX_ENTRY_BYTES // 2


def partition_of(scope: Scope | Mapping[str, Any], partitions: int) -> int:
    """The partition a scope's operations go to: all of them, so they keep their order."""
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    return zlib.crc32(Scope.of(scope).key.encode()) % partitions


def encode_entry(op: Operation) -> dict[str, str]:
    raw = json.dumps(op.to_dict(), separators=(",", ":"), ensure_ascii=False)
    if len(raw.encode()) > MAX_ENTRY_BYTES:
        raise InvalidRequestError(
            f"operation {op.operation_id} is larger than {MAX_ENTRY_BYTES} bytes once encoded"
        )
    return {OP_FIELD: raw}


@dataclass(frozen=True, slots=True)
class Entry:
    """A stream entry that holds a valid operation for its partition."""

    entry_id: str
    operation: Operation


@dataclass(frozen=True, slots=True)
class Malformed:
    """A stream entry that can never be applied: it goes to the dead letters at once."""

    entry_id: str
    error: InvalidRequestError
    raw: str | None  # the op field as sent, kept in the dead letter for inspection
    operation_id: str | None  # when readable, so a waiting producer gets the error
    # The scope's key when readable too: the reply key is the scope's and the id's.
    scope_key: str | None = None


def _text(value: str | bytes, errors: str = "strict") -> str:
    return value.decode(errors=errors) if isinstance(value, bytes) else str(value)


def decode_entry(
    entry_id: str | bytes, fields: Mapping[Any, Any], *, partition: int, partitions: int
) -> Entry | Malformed:
    """Check one entry read from partition ``partition``'s stream.

    Total: whatever the entry holds, the answer is an ``Entry`` or a ``Malformed``
    (never an exception), so no entry can stop the consumer that reads it."""
    eid = _text(entry_id)
    try:
        return _decode(eid, fields, partition=partition, partitions=partitions)
    except Exception as exc:  # a case the checks below did not foresee: still this entry's
        return Malformed(
            eid,
            MalformedEntryError(
                f"the entry could not be read ({type(exc).__name__})", cause="invalid_entry"
            ),
            raw_op(fields),
            None,
        )


def _decode(
    eid: str, fields: Mapping[Any, Any], *, partition: int, partitions: int
) -> Entry | Malformed:
    names = sorted(_text(k, errors="replace") for k in fields)
    if names != [OP_FIELD]:
        return Malformed(
            eid,
            MalformedEntryError(
                f"a stream entry has exactly one field, {OP_FIELD!r}; got {names[:8]}",
                cause="invalid_entry",
            ),
            None,
            None,
        )
    value = next(iter(fields.values()))
    try:
        raw = _text(value)
    except UnicodeDecodeError:
        return Malformed(
            eid, MalformedEntryError("the op field is not UTF-8", cause="not_utf8"), None, None
        )
    if len(raw.encode()) > MAX_ENTRY_BYTES:
        return Malformed(
            eid,
            MalformedEntryError(
                f"the op field is larger than {MAX_ENTRY_BYTES} bytes", cause="too_large"
            ),
            raw,
            None,
        )
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        return Malformed(
            eid,
            MalformedEntryError(
                f"the op field is not valid JSON (at character {exc.pos})", cause="invalid_json"
            ),
            raw,
            None,
        )
    except (ValueError, RecursionError) as exc:  # an integer too long, nesting too deep
        return Malformed(
            eid,
            MalformedEntryError(
                f"the op field cannot be read as JSON ({type(exc).__name__})",
                cause="invalid_json",
            ),
            raw,
            None,
        )
    op_id = _operation_id(data)
    try:
        # Its metadata: as large as any writer may ask for; the doors checked theirs.
        op = Operation.from_dict(data, metadata_bytes=MAX_STORED_METADATA_BYTES)
    except InvalidRequestError as exc:
        return Malformed(
            eid,
            MalformedEntryError(exc.message, cause=refusal(data)),
            raw,
            op_id,
            _scope_key(data),
        )
    expected = partition_of(op.scope, partitions)
    if expected != partition:
        return Malformed(
            eid,
            MalformedEntryError(
                f"operation {op.operation_id} belongs to partition {expected} of {partitions}, "
                f"not {partition}: its scope's order could not be kept",
                cause="wrong_partition",
            ),
            raw,
            op.operation_id,
            op.scope.key,
        )
    return Entry(eid, op)


def refusal(data: object) -> str:
    """What was wrong with JSON that ``Operation.from_dict`` refused (``MALFORMED_CAUSES``):
    looked at in the order it checks, so the first fault found names it."""
    if not isinstance(data, dict):
        return "invalid_request"
    if set(data) - {"operation_id", "kind", "scope", "request", "requested_by"}:
        return "unknown_field"
    if any(data.get(name) is None for name in ("operation_id", "kind", "scope")):
        return "missing_field"
    if not isinstance(data["kind"], str) or data["kind"] not in OPERATION_KINDS:
        return "unknown_kind"
    try:
        Scope.of(data["scope"])
    except InvalidRequestError:
        return "invalid_scope"
    return "invalid_request"


def _operation_id(data: object) -> str | None:
    """The operation id of an entry that is refused, when it is one a producer could
    wait on: it names the reply key the refusal is sent to."""
    if isinstance(data, dict):
        value = data.get("operation_id")
        try:
            return check_string(value, "operation_id", max_chars=MAX_ID_CHARS)
        except InvalidRequestError:
            return None
    return None


def _scope_key(data: object) -> str | None:
    """The scope key of a refused entry, when its scope is readable (with its operation
    id, it names the reply key the refusal is sent to)."""
    if isinstance(data, dict):
        try:
            return Scope.of(data["scope"]).key
        except Exception:  # any shape at all: then no producer can be told
            return None
    return None


def raw_op(fields: Mapping[Any, Any]) -> str | None:
    """The op field as sent, for the dead letter (undecodable bytes replaced)."""
    value = fields.get(OP_FIELD.encode(), fields.get(OP_FIELD)) if fields else None
    if value is None:
        return None
    return _text(value, errors="replace")


# -- replies ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamReceipt(Receipt):
    """A committed operation's receipt, as a producer receives it through Redis."""

    replayed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {**Receipt.as_dict(self), "replayed": self.replayed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StreamReceipt:
        return cls(**Receipt.fields_from_dict(data), replayed=bool(data["replayed"]))


Outcome = WriteResult | EngramError


@dataclass(frozen=True, slots=True)
class Reply:
    """What a worker answered for one stream entry of an operation."""

    entry_id: str | None  # the entry answered: an operation id may be enqueued more than once
    outcome: StreamReceipt | EngramError


def encode_reply(outcome: Outcome, entry_id: str | None = None) -> str:
    body: dict[str, Any] = {"entry": entry_id}
    if isinstance(outcome, EngramError):
        body["error"] = outcome.to_dict()
    else:
        body["receipt"] = {**outcome.receipt.as_dict(), "replayed": outcome.replayed}
    return json.dumps(body, separators=(",", ":"))


def decode_reply(raw: str | bytes) -> Reply:
    """The receipt a worker replied with, or the typed error it sent (returned, not raised)."""
    try:
        data = json.loads(raw)
        entry = data.get("entry")
        if "error" in data:
            return Reply(entry, error_from_dict(data["error"]))
        return Reply(entry, StreamReceipt.from_dict(data["receipt"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return Reply(None, EngramError(f"unreadable reply ({type(exc).__name__})"))
