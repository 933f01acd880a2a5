"""mem0's memories as engram operations: pure conversion, no I/O.

mem0's ``get_all`` (and its platform export) gives memories shaped
``{"id", "memory", "hash", "metadata", "created_at", "updated_at", "user_id"?,
"agent_id"?, "run_id"?, "actor_id"?, "role"?, ...}``: a list, ``{"results": [...]}``,
or one per line. Each becomes one ``remember`` in the scope its ids name: the
memory's id is kept as the record id, its text as the record's, its metadata as
the record's metadata with mem0's own fields under ``"mem0"``. mem0 extracts
memories with a model, so they are ``inferred``, citing the message role when
mem0 kept it (``user`` or ``assistant``), else an external source.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import InvalidRequestError
from .values import SCOPE_FIELDS, Scope
from .write.operations import Operation, text_digest

# mem0's fields kept, under metadata["mem0"], besides those mapped to engram's own.
KEPT = ("hash", "created_at", "updated_at", "categories", "app_id", "immutable", "expiration_date")
_SOURCE_ROLES = ("user", "assistant")


def operation_id(memory_id: str) -> str:
    return f"import:mem0:{memory_id}"


def from_mem0(item: Mapping[str, Any], default_scope: Scope | None) -> Operation:
    memory_id, text = item.get("id"), item.get("memory")
    if not isinstance(memory_id, str) or not memory_id:
        raise InvalidRequestError("a mem0 memory needs an id")
    if not isinstance(text, str):
        raise InvalidRequestError("a mem0 memory needs its text in memory")
    fields = scope_fields(item)
    scope = Scope.of(fields) if fields else default_scope
    if scope is None:
        raise InvalidRequestError(
            "a mem0 memory that names no user_id, agent_id, run_id or actor_id needs --scope"
        )
    metadata = dict(item.get("metadata") or {})
    kept = {k: item[k] for k in KEPT if item.get(k) is not None}
    if kept:
        metadata["mem0"] = kept
    role = item.get("role")
    return Operation.build(
        "remember",
        scope,
        {
            "id": memory_id,
            "text": text,
            "metadata": metadata or None,
            "origin": "inferred",
            "sources": [text_source(text, role if role in _SOURCE_ROLES else "external")],
        },
        operation_id(memory_id),
    )


def scope_fields(item: Mapping[str, Any]) -> dict[str, str]:
    """The scope fields an item names (non-empty strings only)."""
    return {k: v for k in SCOPE_FIELDS if isinstance(v := item.get(k), str) and v}


def text_source(text: str, kind: str = "external") -> dict[str, str]:
    return {"kind": kind, "digest": text_digest(text)}
