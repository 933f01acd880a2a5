"""Whether an operation is in the partition streams' backlog: the entries no worker
has committed yet (a committed entry is deleted at commit, so the live entries are
the backlog). Read in pages, and only so far: past ``SCAN_LIMIT`` entries of one
stream the answer is "cannot tell", never "absent"."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

import redis

from engram.store import Scope
from engram.worker.protocol import OP_FIELD

# Live entries read per stream before giving up on ruling an operation out.
SCAN_LIMIT = 10_000
PAGE_SIZE = 500


class Backlog(Enum):
    FOUND = "found"
    ABSENT = "absent"
    UNKNOWN = "unknown"  # a stream held more than SCAN_LIMIT entries, none of them it


def holds(
    fields: Mapping[Any, Any],
    operation_id: str,
    needles: tuple[bytes, ...],
    scope_key: str | None = None,
) -> bool:
    """Whether an entry's op field is the operation's: a bytes search first (most
    entries are some other operation's), then the parsed id, so that the id showing
    up inside another operation's text is not taken for it. With ``scope_key``, only
    that scope's operation (an operation id is its scope's)."""
    raw = fields.get(OP_FIELD.encode(), fields.get(OP_FIELD))
    if isinstance(raw, str):
        raw = raw.encode()
    if not isinstance(raw, bytes) or not any(n in raw for n in needles):
        return False
    try:
        data = json.loads(raw)
    except ValueError:
        return False
    if not isinstance(data, dict) or data.get("operation_id") != operation_id:
        return False
    if scope_key is None:
        return True
    try:
        return Scope.of(data["scope"]).key == scope_key
    except Exception:  # any shape at all: not this scope's
        return False


def needle_of(operation_id: str) -> tuple[bytes, ...]:
    """The ways a producer may write the id in an entry: as engram's Producer does
    (``ensure_ascii=False``), with non-ASCII escaped (most JSON encoders' default), and
    with ``/`` escaped too (JSON allows it, some encoders do it)."""
    forms = {json.dumps(operation_id, ensure_ascii=False), json.dumps(operation_id)}
    forms |= {f.replace("/", "\\/") for f in forms}
    return tuple(f.encode() for f in sorted(forms))


def find(
    client: redis.Redis,
    operation_id: str,
    streams: Iterable[str],
    *,
    limit: int = SCAN_LIMIT,
    page_size: int = PAGE_SIZE,
    scope_key: str | None = None,
) -> Backlog:
    """Whether ``streams`` (``worker.layout.live_streams``: during a repartition, both
    epochs') hold the operation (of the scope ``scope_key``, when given)."""
    needles = needle_of(operation_id)
    verdict = Backlog.ABSENT
    for stream in streams:
        found = _scan(client, stream, operation_id, needles, limit, page_size, scope_key)
        if found is Backlog.FOUND:
            return found
        if found is Backlog.UNKNOWN:
            verdict = found
    return verdict


def _scan(
    client: redis.Redis,
    stream: str,
    operation_id: str,
    needles: tuple[bytes, ...],
    limit: int,
    page_size: int,
    scope_key: str | None = None,
) -> Backlog:
    start, seen = "-", 0
    while seen < limit:
        page: list[tuple[Any, Mapping[Any, Any]]] = client.xrange(  # type: ignore[assignment]
            stream, start, "+", count=min(page_size, limit - seen)
        )
        if any(holds(fields, operation_id, needles, scope_key) for _, fields in page):
            return Backlog.FOUND
        if len(page) < min(page_size, limit - seen):
            return Backlog.ABSENT
        seen += len(page)
        last = page[-1][0]
        start = "(" + (last.decode() if isinstance(last, bytes) else str(last))
    # As many entries as the bound, none of them it: there may be more.
    more = client.xrange(stream, start, "+", count=1)
    return Backlog.UNKNOWN if more else Backlog.ABSENT


def scopes_holding(
    client: redis.Redis,
    operation_id: str,
    streams: Iterable[str],
    *,
    limit: int = SCAN_LIMIT,
    page_size: int = PAGE_SIZE,
) -> set[str]:
    """The scope keys of the entries of ``streams`` (the backlog, the dead letters: both
    keep the operation as sent in their ``op`` field) that are the operation
    ``operation_id``: an operation id is its scope's, and the operator who asks for one
    without its scope is told whose it is. Read as ``find`` reads, ``limit`` entries
    per stream at most."""
    needles = needle_of(operation_id)
    found: set[str] = set()
    for stream in streams:
        start, seen = "-", 0
        while seen < limit:
            page: list[tuple[Any, Mapping[Any, Any]]] = client.xrange(  # type: ignore[assignment]
                stream, start, "+", count=min(page_size, limit - seen)
            )
            for _, fields in page:
                if holds(fields, operation_id, needles):
                    key = _scope_key(fields)
                    if key is not None:
                        found.add(key)
            if len(page) < min(page_size, limit - seen):
                break
            seen += len(page)
            last = page[-1][0]
            start = "(" + (last.decode() if isinstance(last, bytes) else str(last))
    return found


def _scope_key(fields: Mapping[Any, Any]) -> str | None:
    raw = fields.get(OP_FIELD.encode(), fields.get(OP_FIELD))
    try:
        data = json.loads(raw)
        return Scope.of(data["scope"]).key
    except Exception:  # any shape at all: untrusted
        return None
