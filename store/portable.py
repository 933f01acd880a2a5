"""engram's JSON Lines export format, and turning an export (or mem0's) back into
operations: pure conversion, no I/O.

An export is one JSON object per line:

- ``{"type": "export", "format": "engram", "version": 1, "scope", "exported_at"}`` first;
- ``{"type": "record", "id", "scope", "revisions": [...]}`` per record, every stored
  revision in order, each with its text, kind, importance, metadata, origin,
  sources, links, status, digest, operation id, ``recorded_at`` and ``expires_at``;
- ``{"type": "tombstone", "id", "scope", "forgotten_at", "operation_id"}`` per
  forgotten record (content-free);
- ``{"type": "receipt", ...}`` per receipt, with the ``request`` it still holds.

Imported, a record's revisions become the operations that write them again in
order (a remember, then a revise or a retract per later revision, each with
``expected_revision``), so the revision numbers, statuses, texts, provenance
and links come out the same. Operation ids derive from the record id and the
revision (``import:<record id>:<revision>``), and the same file always gives
the same requests: an interrupted import run again replays what was done and
does the rest. An expiry keeps the time it had left when exported.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .errors import EngramError, InvalidRequestError
from .limits import MAX_ID_CHARS, MAX_STORED_METADATA_BYTES
from .mem0 import from_mem0
from .read.dump import History, Item, ReceiptEntry, Tombstone
from .values import Record, Scope
from .write.operations import Operation

FORMAT = "engram"
VERSION = 1
# A tombstone is imported as a record with this text, forgotten at once: the id
# becomes forgotten in the new home too. The text is never memory.
TOMBSTONE_TEXT = "(forgotten)"
# An expiry that a later revision changes again must not end the record before the
# later revisions are imported: it lasts at least this long, the last one is exact.
_INTERIM_TTL = timedelta(hours=1)
_RECORD_KEYS = ("id", "scope")  # a record line's, not each of its revisions'


def revision_as_dict(r: Record) -> dict[str, Any]:
    """A revision as an export's record line lists it: without its record's id and scope."""
    return {k: v for k, v in r.as_dict().items() if k not in _RECORD_KEYS}


def record_as_dict(r: Record) -> dict[str, Any]:
    """A revision with its record id and scope (and who supersedes it), as JSON."""
    return {**r.as_dict(), "superseded_by": list(r.superseded_by)}


def export_lines(
    items: Iterable[Item], *, scope: Scope, exported_at: datetime
) -> Iterator[dict[str, Any]]:
    yield {
        "type": "export",
        "format": FORMAT,
        "version": VERSION,
        "scope": scope.as_dict(),
        "exported_at": exported_at.isoformat(),
    }
    for item in items:
        if isinstance(item, History):
            yield {
                "type": "record",
                "id": item.id,
                "scope": item.revisions[0].scope.as_dict(),
                "revisions": [revision_as_dict(r) for r in item.revisions],
            }
        elif isinstance(item, Tombstone):
            yield {
                "type": "tombstone",
                "id": item.id,
                "scope": item.scope.as_dict(),
                "forgotten_at": item.forgotten_at.isoformat(),
                "operation_id": item.operation_id,
            }
        elif isinstance(item, ReceiptEntry):
            yield {"type": "receipt", **item.receipt.as_dict(), "request": item.request}


# -- import ------------------------------------------------------------------------------


@dataclass(slots=True)
class Converted:
    """An input turned into operations, in the order to enqueue them."""

    format: str
    operations: list[Operation] = field(default_factory=list)
    records: int = 0
    tombstones: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # why -> how many lines

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def convert(
    text: str, *, format: str = "auto", scope: Scope | None = None, now: datetime
) -> Converted:
    """Read an engram export or a mem0 export (``format``: ``engram``, ``mem0`` or
    ``auto``) and turn it into operations. ``scope`` is for mem0 memories that name
    none. A line that cannot be read is ``InvalidRequestError`` naming its number
    (and never its content): nothing is converted then."""
    lines = _objects(text)
    if format == "auto":
        format = _detect(lines)
    if format == FORMAT:
        return _from_export(lines, now)
    if format == "mem0":
        out = Converted("mem0")
        for number, item in lines:
            out.operations.append(_at_line(number, lambda item=item: from_mem0(item, scope)))
            out.records += 1
        return out
    raise InvalidRequestError(f"unknown import format {format!r}: use engram, mem0 or auto")


def _objects(text: str) -> list[tuple[int, Mapping[str, Any]]]:
    """The input's objects with their line numbers: JSON Lines, or one JSON document
    holding a list (mem0's ``get_all``), or ``{"results": [...]}`` (mem0's newer shape)."""
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict) and isinstance(whole.get("results"), list):
        whole = whole["results"]
    if isinstance(whole, list):
        return [(i + 1, _object(i + 1, item)) for i, item in enumerate(whole)]
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append((number, _object(number, json.loads(line))))
            except ValueError:
                raise InvalidRequestError(f"line {number}: not JSON") from None
    return out


def _object(number: int, value: object) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequestError(f"line {number}: each line must hold a JSON object")
    return value


def _detect(lines: list[tuple[int, Mapping[str, Any]]]) -> str:
    if not lines:
        return FORMAT
    first = lines[0][1]
    if first.get("type") in ("export", "record", "tombstone", "receipt"):
        return FORMAT
    if "memory" in first:
        return "mem0"
    raise InvalidRequestError("line 1: neither an engram export nor mem0 memories")


def _from_export(lines: list[tuple[int, Mapping[str, Any]]], now: datetime) -> Converted:
    """Expiries count from the export's time (from the import's, with no header line), so
    the same file always gives the same operations."""
    out = Converted(FORMAT)
    for number, line in lines:
        kind = line.get("type")
        if kind == "export":
            if line.get("format") != FORMAT or line.get("version") != VERSION:
                raise InvalidRequestError(f"line {number}: not an engram export of version 1")
            now = _at_line(number, lambda line=line: datetime.fromisoformat(line["exported_at"]))
        elif kind == "record":
            ops = _at_line(number, lambda line=line, now=now: record_operations(line, now))
            if ops:
                out.operations.extend(ops)
                out.records += 1
            else:
                out.skip("expired")
        elif kind == "tombstone":
            out.operations.extend(_at_line(number, lambda line=line: tombstone_operations(line)))
            out.tombstones += 1
        elif kind == "receipt":
            out.skip("receipt")  # the new home writes receipts of its own
        else:
            raise InvalidRequestError(f"line {number}: unknown line type")
    return out


def _at_line(number: int, convert_line: Any) -> Any:
    try:
        return convert_line()
    except EngramError as exc:
        raise InvalidRequestError(f"line {number}: {exc.message}") from None
    except (KeyError, TypeError, ValueError, AttributeError):
        raise InvalidRequestError(f"line {number}: not a well-formed line") from None


def record_operations(line: Mapping[str, Any], now: datetime) -> list[Operation]:
    """The operations that write a record's revisions again, in order; none for a record
    that had expired by ``now`` (it counts as absent everywhere but in its history). An
    expiry becomes the time it had left at ``now``."""
    record_id = str(line["id"])
    scope = Scope.of(line["scope"])
    revisions = sorted(line["revisions"], key=lambda r: int(r["revision"]))
    if not revisions:
        raise InvalidRequestError("a record line needs at least one revision")
    expiries = [_time(r.get("expires_at")) for r in revisions]
    if expiries[-1] is not None and expiries[-1] <= now:
        return []
    changes = [i for i, e in enumerate(expiries) if e != (expiries[i - 1] if i else None)]
    ops: list[Operation] = []
    for i, r in enumerate(revisions):
        ttl_ms = _ttl_ms(expiries[i], now, last=i == changes[-1]) if i in changes else None
        op_id = import_operation_id(record_id, i + 1)
        if i == 0:
            request: dict[str, Any] = {
                "id": record_id,
                "text": r["text"],
                "kind": r.get("kind"),
                "importance": r.get("importance"),
                "metadata": r.get("metadata"),
                "origin": r.get("origin"),
                "sources": r.get("sources") or None,
                "links": r.get("links") or None,
                "ttl_ms": ttl_ms,
            }
            ops.append(
                Operation.build(
                    "remember", scope, request, op_id, metadata_bytes=MAX_STORED_METADATA_BYTES
                )
            )
            if r.get("status") == "retracted":  # its earlier revisions were pruned
                ops.append(_retract(scope, record_id, 1, import_operation_id(record_id, 1, "r")))
        elif r.get("status") == "retracted":
            ops.append(_retract(scope, record_id, _written(ops), op_id))
        else:
            request = {
                "id": record_id,
                "text": r["text"],
                "kind": r.get("kind"),
                "importance": r.get("importance"),
                "metadata": r.get("metadata") or {},
                "links": r.get("links") or [],
                "ttl_ms": ttl_ms,
                "expected_revision": _written(ops),
            }
            ops.append(
                Operation.build(
                    "revise", scope, request, op_id, metadata_bytes=MAX_STORED_METADATA_BYTES
                )
            )
    return ops


def _written(ops: list[Operation]) -> int:
    """The revision a record is at once ``ops`` (one revision each) have committed."""
    return len(ops)


def _retract(scope: Scope, record_id: str, expected: int, op_id: str) -> Operation:
    return Operation.build(
        "retract", scope, {"id": record_id, "expected_revision": expected}, op_id
    )


def tombstone_operations(line: Mapping[str, Any]) -> list[Operation]:
    """A content-free record with the forgotten id, forgotten at once: a later create
    or revise of that id is refused in the new home as in the old."""
    record_id, scope = str(line["id"]), Scope.of(line["scope"])
    return [
        Operation.build(
            "remember",
            scope,
            {"id": record_id, "text": TOMBSTONE_TEXT},
            import_operation_id(record_id, 0, "tombstone"),
        ),
        Operation.build(
            "forget", scope, {"id": record_id}, import_operation_id(record_id, 0, "forget")
        ),
    ]


def import_operation_id(record_id: str, revision: int, suffix: str = "") -> str:
    """``import:<record id>:<revision>``, the record id hashed if that would be too long."""
    tail = f":{revision}" + (f":{suffix}" if suffix else "")
    op_id = f"import:{record_id}{tail}"
    if len(op_id) <= MAX_ID_CHARS:
        return op_id
    return f"import:sha256:{hashlib.sha256(record_id.encode()).hexdigest()}{tail}"


def _time(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def _ttl_ms(expires_at: datetime | None, now: datetime, *, last: bool) -> int | None:
    if expires_at is None:
        return None
    left = expires_at - now
    if not last:
        left = max(left, _INTERIM_TTL)
    return max(int(left.total_seconds() * 1000), 1)
