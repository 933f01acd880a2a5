"""The five operation verbs' fields, written once, and an operation's request from them:
what ``Session``, the ``Producer`` and the model tools hand ``Operation.build``.

Each verb's fields beside its subject (a remember's text, a revise's record id) are one
``TypedDict`` here; ``Session`` and ``Producer`` take them as ``**fields`` (typed with
``Unpack``, so a misspelt or mistyped one is a type error at the call), and add only what
is theirs: the producer its scope and ``requested_by``, both the ``operation_id``. A field
left out is absent, as a None is. Sources and links may be values (``Source``, ``Link``)
or mappings. The request itself is checked where it is read (``operations``), whoever
built it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, Unpack

from ..values import Link, Source

Sources = Sequence[Source | Mapping[str, Any]]
Links = Sequence[Link | Mapping[str, Any]]


class RememberFields(TypedDict, total=False):
    """A remember's fields beside its text. No links is none."""

    kind: str | None
    importance: float | None
    metadata: Mapping[str, Any] | None
    origin: str | None
    sources: Sources | None
    links: Links | None
    ttl_ms: int | None
    id: str | None
    supersede: str | None
    top_k: int | None


class ExtractFields(TypedDict, total=False):
    """An extract's fields beside its messages. No links is none, no trusted tools none."""

    kind: str | None
    ttl_ms: int | None
    links: Links | None
    trusted_tools: Sequence[str] | None
    infer: bool | None
    supersede: str | None
    top_k: int | None
    instructions: str | None


class ReviseFields(TypedDict, total=False):
    """A revise's fields beside its record id: no ``links`` keeps the record's, an empty
    list clears them; ``only_inferred`` defaults to False."""

    text: str | None
    kind: str | None
    importance: float | None
    metadata: Mapping[str, Any] | None
    links: Links | None
    ttl_ms: int | None
    expected_revision: int | None
    sources: Sources | None
    only_inferred: bool


class RetractFields(TypedDict, total=False):
    """A retract's fields beside its record id; ``only_inferred`` defaults to False."""

    expected_revision: int | None
    only_inferred: bool


def _known(verb: str, fields: Mapping[str, Any], kind: type) -> None:
    """A ``TypeError`` for a field the verb does not have, as a misspelt keyword
    argument raises (``**fields`` would otherwise take it and drop it)."""
    for name in fields:
        if name not in kind.__annotations__:
            raise TypeError(f"{verb}() got an unexpected keyword argument {name!r}")


def plain_items(items: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """Sources or links given as values (``Source``, ``Link``) or mappings, as plain dicts."""
    if items is None:
        return None
    return [i.as_dict() if hasattr(i, "as_dict") else dict(i) for i in items]


def remember_request(text: str, **fields: Unpack[RememberFields]) -> dict[str, Any]:
    """A remember's request, as ``Operation.build`` takes it."""
    _known("remember", fields, RememberFields)
    return {
        "text": text,
        "kind": fields.get("kind"),
        "importance": fields.get("importance"),
        "metadata": fields.get("metadata"),
        "origin": fields.get("origin"),
        "sources": plain_items(fields.get("sources")),
        "links": plain_items(fields.get("links")) or None,
        "ttl_ms": fields.get("ttl_ms"),
        "id": fields.get("id"),
        "supersede": fields.get("supersede"),
        "top_k": fields.get("top_k"),
    }


def extract_request(
    messages: Sequence[Mapping[str, Any]], **fields: Unpack[ExtractFields]
) -> dict[str, Any]:
    _known("extract", fields, ExtractFields)
    return {
        "messages": list(messages),
        "kind": fields.get("kind"),
        "ttl_ms": fields.get("ttl_ms"),
        "links": plain_items(fields.get("links")) or None,
        "trusted_tools": list(fields.get("trusted_tools") or ()) or None,
        "infer": fields.get("infer"),
        "supersede": fields.get("supersede"),
        "top_k": fields.get("top_k"),
        "instructions": fields.get("instructions"),
    }


def revise_request(record_id: str, **fields: Unpack[ReviseFields]) -> dict[str, Any]:
    _known("revise", fields, ReviseFields)
    return {
        "id": record_id,
        "text": fields.get("text"),
        "kind": fields.get("kind"),
        "importance": fields.get("importance"),
        "metadata": fields.get("metadata"),
        "links": plain_items(fields.get("links")),
        "ttl_ms": fields.get("ttl_ms"),
        "expected_revision": fields.get("expected_revision"),
        "sources": plain_items(fields.get("sources")),
        "only_inferred": fields.get("only_inferred") or None,
    }


def retract_request(record_id: str, **fields: Unpack[RetractFields]) -> dict[str, Any]:
    _known("retract", fields, RetractFields)
    return {
        "id": record_id,
        "expected_revision": fields.get("expected_revision"),
        "only_inferred": fields.get("only_inferred") or None,
    }


def forget_request(record_id: str) -> dict[str, Any]:
    return {"id": record_id}
