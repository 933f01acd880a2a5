"""An operation's request from keyword values: what ``Session``, the ``Producer`` and
the model tools hand ``Operation.build``. A None is absent; sources and links may be
values (``Source``, ``Link``) or mappings. The request itself is checked where it is
read (``operations``), whoever built it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def plain_items(items: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """Sources or links given as values (``Source``, ``Link``) or mappings, as plain dicts."""
    if items is None:
        return None
    return [i.as_dict() if hasattr(i, "as_dict") else dict(i) for i in items]


def remember_request(
    text: str,
    *,
    kind: str | None = None,
    importance: float | None = None,
    metadata: Mapping[str, Any] | None = None,
    origin: str | None = None,
    sources: Sequence[Any] | None = None,
    links: Sequence[Any] | None = None,
    ttl_ms: int | None = None,
    id: str | None = None,
    supersede: str | None = None,
    top_k: int | None = None,
) -> dict[str, Any]:
    """A remember's request from keyword values, as ``Operation.build`` takes it (a None
    is absent; no links is none). The session, the producer and the model tools use it."""
    return {
        "text": text,
        "kind": kind,
        "importance": importance,
        "metadata": metadata,
        "origin": origin,
        "sources": plain_items(sources),
        "links": plain_items(links) or None,
        "ttl_ms": ttl_ms,
        "id": id,
        "supersede": supersede,
        "top_k": top_k,
    }


def extract_request(
    messages: Sequence[Mapping[str, Any]],
    *,
    kind: str | None = None,
    ttl_ms: int | None = None,
    links: Sequence[Any] | None = None,
    trusted_tools: Sequence[str] | None = None,
    infer: bool | None = None,
    supersede: str | None = None,
    top_k: int | None = None,
    instructions: str | None = None,
) -> dict[str, Any]:
    return {
        "messages": list(messages),
        "kind": kind,
        "ttl_ms": ttl_ms,
        "links": plain_items(links) or None,
        "trusted_tools": list(trusted_tools or ()) or None,
        "infer": infer,
        "supersede": supersede,
        "top_k": top_k,
        "instructions": instructions,
    }


def revise_request(
    record_id: str,
    *,
    text: str | None = None,
    kind: str | None = None,
    importance: float | None = None,
    metadata: Mapping[str, Any] | None = None,
    links: Sequence[Any] | None = None,
    ttl_ms: int | None = None,
    expected_revision: int | None = None,
    sources: Sequence[Any] | None = None,
    only_inferred: bool = False,
) -> dict[str, Any]:
    """A revise's request: no ``links`` keeps the record's, an empty list clears them."""
    return {
        "id": record_id,
        "text": text,
        "kind": kind,
        "importance": importance,
        "metadata": metadata,
        "links": plain_items(links),
        "ttl_ms": ttl_ms,
        "expected_revision": expected_revision,
        "sources": plain_items(sources),
        "only_inferred": only_inferred or None,
    }


def retract_request(
    record_id: str, *, expected_revision: int | None = None, only_inferred: bool = False
) -> dict[str, Any]:
    return {
        "id": record_id,
        "expected_revision": expected_revision,
        "only_inferred": only_inferred or None,
    }


def forget_request(record_id: str) -> dict[str, Any]:
    return {"id": record_id}
