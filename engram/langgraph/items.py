"""LangGraph items as engram records, and back: pure, no I/O.

One item (namespace, key) is one record, its id derived from the scope, the
namespace and the key, so every put of the key is a revision of that record.
The record's metadata holds the item (``{"langgraph": {"namespace": [...], "key":
..., "value": {...}, "created_at": ..., "ttl_minutes": ...}}``), at most
``MAX_STORED_METADATA_BYTES`` as JSON (a document; the doors' own metadata bound is
far smaller, and the store asks for this one per operation); its text is what
search reads, by full text and by vector: the value's text at the index paths
(LangGraph's ``fields``: by default the whole value as JSON), one line per piece.
An item put with ``index=False`` (or whose index paths find nothing) has the
kind ``langgraph.unindexed`` and a placeholder text: a search with a query never
returns it (a search without one does).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any, Literal

from langgraph.store.base import Item, SearchItem, get_text_at_path

from engram.store import InvalidRequestError, Record, Scope
from engram.store.limits import MAX_ID_CHARS, MAX_STORED_METADATA_BYTES, MAX_TEXT_CHARS
from engram.store.read.metadata_filter import Condition, MetadataFilter

ROOT = "langgraph"
INDEXED = "langgraph"
UNINDEXED = "langgraph.unindexed"
KINDS = (INDEXED, UNINDEXED)
UNINDEXED_TEXT = "(not indexed)"
# Where an item's value sits in its record's metadata (filters are read under it).
VALUE_PATH = (ROOT, "value")
NAMESPACE_PATH = (ROOT, "namespace")

Index = Literal[False] | list[str] | None


def record_id(scope: Scope, namespace: Sequence[str], key: str) -> str:
    """The record of (namespace, key) in ``scope``: stable, so every put revises it."""
    if not isinstance(key, str):
        raise InvalidRequestError("an item's key is a string")
    named = json.dumps([scope.key, list(namespace), key], ensure_ascii=False)
    return "lg_" + hashlib.sha256(named.encode("utf-8", "surrogatepass")).hexdigest()[:40]


assert len(record_id(Scope(user_id="x"), ("a",), "k")) <= MAX_ID_CHARS


def indexed_text(value: Mapping[str, Any], index: Index, fields: Sequence[str]) -> str | None:
    """What search reads of ``value``: the texts at the index paths (``index``, else the
    store's ``fields``), one per line; None when not indexed or nothing was found."""
    if index is False:
        return None
    paths = list(fields) if index is None else list(index)
    pieces = [text for path in paths for text in get_text_at_path(value, path)]
    text = "\n".join(p for p in pieces if p.strip())
    if not text.strip():
        return None
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidRequestError(
            f"an item's indexed text is longer than {MAX_TEXT_CHARS} characters: "
            "index fewer fields (index=[...]) or none (index=False)"
        )
    return text


@dataclass(frozen=True, slots=True)
class Write:
    """What a put writes: the record's text, kind and metadata."""

    text: str
    kind: str
    metadata: dict[str, Any]


def write_of(
    namespace: Sequence[str],
    key: str,
    value: Mapping[str, Any],
    *,
    index: Index,
    fields: Sequence[str],
    created_at: str,
    ttl_minutes: float | None,
) -> Write:
    if not isinstance(value, Mapping):
        raise InvalidRequestError("an item's value is a dict (or None to delete it)")
    value = json_value(value)
    text = indexed_text(value, index, fields)
    item: dict[str, Any] = {
        "namespace": list(namespace),
        "key": key,
        "value": dict(value),
        "created_at": created_at,
    }
    if ttl_minutes is not None:
        item["ttl_minutes"] = ttl_minutes
    metadata = {ROOT: item}
    if len(json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode()) > (
        MAX_STORED_METADATA_BYTES
    ):
        raise InvalidRequestError(
            f"an item is larger than {MAX_STORED_METADATA_BYTES} bytes as JSON (its value,"
            " namespace and key): store a larger document in parts, or outside and its"
            " address here"
        )
    return Write(
        text=text if text is not None else UNINDEXED_TEXT,
        kind=INDEXED if text is not None else UNINDEXED,
        metadata=metadata,
    )


def json_value(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` as the JSON it is kept as: a datetime, date or time becomes its ISO 8601
    text and a UUID its text, as orjson writes them (LangGraph's stores read values with
    orjson, and LangGraph Platform's store writes them with it); they come back as
    those strings. Anything else JSON cannot hold (a set, bytes, an object) is an
    ``InvalidRequestError`` naming its type, never a ``TypeError`` from deep inside."""
    try:
        encoded = json.dumps(value, default=_as_json, ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise InvalidRequestError("an item's value must hold finite numbers only") from exc
    parsed: dict[str, Any] = json.loads(encoded)
    return parsed


def _as_json(value: object) -> str:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise InvalidRequestError(
        f"an item's value must be JSON: a {type(value).__name__} is not (dicts, lists,"
        " strings, numbers, booleans, None, and datetimes, dates, times and UUIDs, kept as"
        " ISO 8601 or UUID text)"
    )


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def ttl_ms(minutes: float | None) -> int | None:
    if minutes is None:
        return None
    if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not minutes > 0:
        raise InvalidRequestError("ttl is a positive number of minutes, or None")
    return max(1, round(minutes * 60_000))


def is_item(record: Record) -> bool:
    item = record.metadata.get(ROOT)
    return record.kind in KINDS and isinstance(item, dict) and "value" in item


def item_of(record: Record) -> Item:
    item = record.metadata[ROOT]
    return Item(
        value=item["value"],
        key=item["key"],
        namespace=tuple(item["namespace"]),
        created_at=_created(item, record),
        updated_at=record.recorded_at,
    )


def search_item_of(record: Record, score: float | None) -> SearchItem:
    item = record.metadata[ROOT]
    return SearchItem(
        namespace=tuple(item["namespace"]),
        key=item["key"],
        value=item["value"],
        created_at=_created(item, record),
        updated_at=record.recorded_at,
        score=score,
    )


def _created(item: Mapping[str, Any], record: Record) -> datetime:
    try:
        return datetime.fromisoformat(item["created_at"])
    except (KeyError, TypeError, ValueError):
        return record.recorded_at


def ttl_minutes_of(record: Record) -> float | None:
    ttl = record.metadata.get(ROOT, {}).get("ttl_minutes")
    return float(ttl) if isinstance(ttl, int | float) and not isinstance(ttl, bool) else None


def prefix_filter(prefix: Sequence[str]) -> MetadataFilter:
    """Records whose namespace starts with ``prefix``, label by label (``*``: any label):
    exact, whatever a label holds (``%``, ``_``, ``\\``, a newline), and never across a
    label's end, since each label is compared whole."""
    return MetadataFilter(
        tuple(
            # "*": some label is there (every string is at least the empty one)
            Condition((*NAMESPACE_PATH, str(i)), "gte", "")
            if label == "*"
            else Condition((*NAMESPACE_PATH, str(i)), "eq", label)
            for i, label in enumerate(prefix)
        )
    )


def history_values(revisions: Sequence[Record]) -> list[dict[str, Any] | None]:
    """The values an item held, oldest first: None where it was deleted; a revision that
    changed neither (a TTL refresh) is folded into the one before."""
    values: list[dict[str, Any] | None] = []
    last: object = object()
    for record in revisions:
        if not is_item(record):
            continue
        value = record.metadata[ROOT]["value"] if record.status == "active" else None
        if value != last:
            values.append(value)
        last = value
    return values
