"""The schemas of the HTTP API's bodies (components of the OpenAPI document): the
operations as the store reads them (``store/write/operations.py``), and the JSON shapes
``serialize.py`` writes."""

from __future__ import annotations

from typing import Any

from engram.store.limits import (
    DEFAULT_MIN_RELEVANCE,
    MAX_ID_CHARS,
    MAX_INSTRUCTIONS_CHARS,
    MAX_KIND_CHARS,
    MAX_LINKS,
    MAX_MESSAGES,
    MAX_SCOPE_VALUE_CHARS,
    MAX_SOURCES,
    MAX_TEXT_CHARS,
    MAX_TOP_K,
)
from engram.store.values import LINK_RELATIONS, ORIGINS, SCOPE_FIELDS, SOURCE_KINDS
from engram.store.write.operations import (
    MAX_TTL_MS,
    MESSAGE_ROLES,
    OPERATION_KINDS,
    SUPERSEDE_MODES,
)

Schema = dict[str, Any]

# Text the store accepts: not blank, no NUL.
_TEXT_PATTERN = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def string(max_length: int = MAX_ID_CHARS, **more: Any) -> Schema:
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": max_length,
        "pattern": _TEXT_PATTERN,
        **more,
    }


# A memory's text (store/limits.py): longer is refused, 422 invalid_request.
_TEXT = string(MAX_TEXT_CHARS, description=f"At most {MAX_TEXT_CHARS:,} characters.")


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


TIME = {"type": "string", "format": "date-time"}
# A commit position (a PostgreSQL WAL location) as a receipt carries it with a read replica.
POSITION = {
    "type": "string",
    "pattern": "^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
    "description": "A receipt's position: the read sees that commit (docs/read-replica.md).",
}
# An operator's why, kept in the audit trail.
_WHY = {
    "type": "string",
    "maxLength": 200,
    "description": "Why, for the audit trail (a forget's: shown on its tombstone).",
}
_SCOPE = {
    "type": "object",
    "description": "An exact scope: at least one field set (a null field is not set).",
    "properties": {f: nullable(string(MAX_SCOPE_VALUE_CHARS)) for f in SCOPE_FIELDS},
    "additionalProperties": False,
    "minProperties": 1,
}
_SOURCE = {
    "type": "object",
    "required": ["kind"],
    "properties": {
        "kind": {"enum": list(SOURCE_KINDS)},
        **{
            k: nullable(string())
            for k in ("digest", "message_id", "tool_call_id", "tool_name", "run_id", "chat_id")
        },
    },
    "additionalProperties": False,
}
_LINK = {
    "type": "object",
    "required": ["relation", "id"],
    "properties": {"relation": {"enum": list(LINK_RELATIONS)}, "id": string()},
    "additionalProperties": False,
}
_PAGE_NEXT = nullable({"type": "string", "description": "The cursor of the next page."})


def _page(item: str) -> Schema:
    return {
        "type": "object",
        "required": ["items", "next"],
        "properties": {"items": {"type": "array", "items": ref(item)}, "next": _PAGE_NEXT},
        "additionalProperties": False,
    }


def obj(properties: dict[str, Schema], *, optional: tuple[str, ...] = ()) -> Schema:
    return {
        "type": "object",
        "required": [k for k in properties if k not in optional],
        "properties": properties,
        "additionalProperties": False,
    }


# -- the requests of each kind (store/write/operations.py reads them) ----------------------

_ID_OR_NULL = nullable(string())
_METADATA = nullable(
    {
        "type": "object",
        "description": "Any JSON object: at most 16,000 bytes, 32 levels deep, no NUL.",
    }
)
_IMPORTANCE = nullable({"type": "number", "minimum": 0, "maximum": 1})
_TTL = nullable({"type": "integer", "minimum": 1, "maximum": MAX_TTL_MS})
_LINKS = nullable({"type": "array", "maxItems": MAX_LINKS, "items": _LINK})
_KIND = nullable(string(MAX_KIND_CHARS))
_SUPERSEDE = nullable(
    {
        "enum": list(SUPERSEDE_MODES),
        "description": (
            "How the write meets similar records: add, or reconcile with the model "
            "(the default when the workers have one; refused without one)."
        ),
    }
)
_TOP_K = nullable(
    {
        "type": "integer",
        "minimum": 1,
        "maximum": MAX_TOP_K,
        "description": "Similar records the model is shown (reconcile).",
    }
)
_ONLY_INFERRED = nullable(
    {"type": "boolean", "description": "true: an asserted record is refused (asserted_record)."}
)
_MESSAGE = {
    "type": "object",
    "required": ["id", "message"],
    "properties": {
        "id": string(),
        "message": {
            "type": "object",
            "required": ["role"],
            "properties": {
                "role": {"enum": list(MESSAGE_ROLES)},
                "content": {
                    "description": (
                        "Text, or the content blocks of your model's API: any JSON of at "
                        "most 128,000 bytes, without NUL characters."
                    ),
                },
            },
            "additionalProperties": False,
        },
        "run_id": _ID_OR_NULL,
        "tool_name": _ID_OR_NULL,
    },
    "additionalProperties": False,
}


def _request(required: tuple[str, ...], **properties: Schema) -> Schema:
    return {
        "type": "object",
        "required": list(required),
        "properties": properties,
        "additionalProperties": False,
    }


_REQUESTS: dict[str, Schema] = {
    "remember": _request(
        ("text",),
        text=_TEXT,
        kind=_KIND,
        importance=_IMPORTANCE,
        metadata=_METADATA,
        origin=nullable({"enum": list(ORIGINS)}),
        sources=nullable(
            {"type": "array", "minItems": 1, "maxItems": MAX_SOURCES, "items": _SOURCE}
        ),
        links=_LINKS,
        ttl_ms=_TTL,
        id=_ID_OR_NULL,
        supersede=_SUPERSEDE,
        top_k=_TOP_K,
    ),
    "extract": _request(
        ("messages",),
        messages={
            "type": "array",
            "maxItems": MAX_MESSAGES,
            "items": _MESSAGE,
            "description": "Each message's id is unique in the operation.",
        },
        kind=_KIND,
        ttl_ms=_TTL,
        links=_LINKS,
        trusted_tools=nullable({"type": "array", "maxItems": MAX_SOURCES, "items": string()}),
        infer=nullable(
            {
                "type": "boolean",
                "description": (
                    "Infer records with the model (the default when the workers have one; "
                    "true is refused without one); false stores the readable texts as they are."
                ),
            }
        ),
        supersede=_SUPERSEDE,
        top_k=_TOP_K,
        instructions=nullable(
            {**string(MAX_INSTRUCTIONS_CHARS), "description": "Appended to the extraction prompt."}
        ),
    ),
    "revise": _request(
        ("id",),
        id=string(),
        text=nullable(_TEXT),
        kind=_KIND,
        importance=_IMPORTANCE,
        metadata=_METADATA,
        links=_LINKS,
        ttl_ms=_TTL,
        expected_revision=nullable(
            {
                "type": "integer",
                "minimum": 0,
                "maximum": 2**31 - 1,
                "description": "0: the record must not exist yet (then text is needed).",
            }
        ),
        sources=nullable(
            {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_SOURCES,
                "items": _SOURCE,
                "description": "Added to the record's own sources.",
            }
        ),
        only_inferred=_ONLY_INFERRED,
    ),
    "retract": _request(
        ("id",),
        id=string(),
        expected_revision=nullable({"type": "integer", "minimum": 1, "maximum": 2**31 - 1}),
        only_inferred=_ONLY_INFERRED,
    ),
    "forget": _request(("id",), id=string()),
}


_REVISION_PROPERTIES: dict[str, Schema] = {
    "id": {"type": "string"},
    "revision": {"type": "integer", "minimum": 1},
    "scope": {"type": "object", "additionalProperties": {"type": "string"}},
    "text": {"type": "string"},
    "kind": {"type": "string"},
    "importance": nullable({"type": "number"}),
    "metadata": {"type": "object"},
    "origin": {"enum": list(ORIGINS)},
    "sources": {"type": "array", "items": {"type": "object"}},
    "links": {"type": "array", "items": {"type": "object"}},
    "status": {"enum": ["active", "retracted"]},
    "digest": {"type": "string"},
    "operation_id": {"type": "string"},
    "recorded_at": TIME,
    "expires_at": nullable(TIME),
}

SCHEMAS: dict[str, Schema] = {
    "Error": obj(
        {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                "description": "A revision conflict adds expected, actual and attempts; "
                "a statement_timeout (503) and a rate_limited (429), both with Retry-After, "
                "add retry_after_s; an operation_ambiguous or a record_ambiguous (409) adds "
                "scopes, the scopes that hold the id.",
            }
        }
    ),
    "Operation": {
        "description": (
            "An operation, exactly as on the streams: one of the kinds below. A field set "
            "to null is absent. Unknown fields are refused."
        ),
        "oneOf": [ref(f"{kind.capitalize()}Operation") for kind in OPERATION_KINDS],
        "discriminator": {
            "propertyName": "kind",
            "mapping": {
                k: f"#/components/schemas/{k.capitalize()}Operation" for k in OPERATION_KINDS
            },
        },
    },
    "Accepted": obj(
        {
            "operation_id": {"type": "string"},
            "partition": {"type": "integer", "minimum": 0},
            "entry": {"type": "string"},
            "state": {"const": "enqueued"},
            "status_url": {"type": "string"},
        }
    ),
    "Receipt": obj(
        {
            "operation_id": {"type": "string"},
            "kind": {"enum": list(OPERATION_KINDS)},
            "scope": {"type": "object", "additionalProperties": {"type": "string"}},
            "scope_id": {"type": "integer"},
            "scope_revision": {"type": "integer", "minimum": 0},
            "committed_at": TIME,
            "records": {
                "type": "array",
                "items": obj(
                    {
                        "id": {"type": "string"},
                        "revision": {"type": "integer"},
                        "status": {"enum": ["active", "retracted"]},
                    }
                ),
            },
            "redacted": {"type": "boolean"},
            "revisions": nullable({"type": "array", "items": {"type": "integer"}}),
            "already_forgotten": nullable({"type": "boolean"}),
            "redaction": nullable({"enum": ["pending", "complete", "failed", "none"]}),
            "redaction_reason": nullable(
                {
                    "type": "string",
                    "description": "Content-free: why it failed, or what holds it pending.",
                }
            ),
            "model_calls": {"type": "integer", "minimum": 0},
            "proposed": {
                "type": "array",
                "description": "What the operation's model proposed and the store did not "
                "apply, for the host to decide: a retraction of an asserted record.",
                "items": obj(
                    {
                        "action": {"enum": ["retract"]},
                        "id": {"type": "string"},
                        "revision": {"type": "integer", "minimum": 1},
                    }
                ),
            },
            "requested_by": nullable({"type": "string"}),
            "authenticated": {
                "type": "boolean",
                "description": "Whether requested_by is authenticated (a scoped token's "
                "name, token:NAME, vouched for by the server that verified it) rather "
                "than claimed by the producer.",
            },
            "replays": {"type": "integer", "minimum": 0},
            "last_replayed_at": nullable(TIME),
            "stream_entry": nullable({"type": "string"}),
            "error": nullable({"type": "object"}),
            "replayed": {
                "type": "boolean",
                "description": "Only when waited for: whether this answer was a replay.",
            },
            "position": {
                **POSITION,
                "description": "Only when waited for, with a read replica: pass it as a "
                "read's after to see this write.",
            },
        },
        optional=("replayed", "position"),
    ),
    "OperationState": obj(
        {
            "operation_id": {"type": "string"},
            "state": {"enum": ["waiting", "committed", "refused", "failed"]},
            "receipt": nullable(ref("Receipt")),
            "error": nullable({"type": "object"}),
        }
    ),
    "Revision": obj(_REVISION_PROPERTIES),
    "Record": obj(
        {
            **_REVISION_PROPERTIES,
            "scope_id": {"type": "integer"},
            "expired": {"type": "boolean"},
            "superseded_by": {"type": "array", "items": {"type": "string"}},
        }
    ),
    "History": obj(
        {
            "record_id": {"type": "string"},
            "revisions": {"type": "array", "items": ref("Revision")},
            "next": nullable({"type": "string"}),
        }
    ),
    "Recall": {
        "type": "object",
        "required": ["scope"],
        "description": "A field set to null is absent. Without text: the latest records.",
        "properties": {
            "scope": _SCOPE,
            "text": nullable(_TEXT),
            "top_k": nullable({"type": "integer", "minimum": 1, "maximum": MAX_TOP_K}),
            "kind": nullable(string(MAX_KIND_CHARS)),
            "include_retracted": nullable({"type": "boolean"}),
            "recorded_as_of": nullable({**TIME, "description": "UTC when no zone is given."}),
            "after": nullable(POSITION),
            "min_relevance": nullable(
                {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 1,
                    "description": (
                        "A cut-off: hits of a lower relevance are left out. Absent or"
                        f" null: {DEFAULT_MIN_RELEVANCE}; 0 leaves none out."
                    ),
                }
            ),
        },
        "additionalProperties": False,
    },
    "Hits": obj(
        {
            "hits": {
                "type": "array",
                "items": obj(
                    {
                        "record": ref("Revision"),
                        "score": {"type": "number"},
                        "match": {"enum": ["vector", "lexical", "hybrid"]},
                        "superseded_by": {"type": "array", "items": {"type": "string"}},
                        "rank": {"type": "integer", "minimum": 1},
                        "relevance": {
                            "type": "number",
                            "description": (
                                "How well the hit answers the query, whatever its rank:"
                                " its score (the cosine similarity of its vector to the"
                                " query's, plus 2 times the square of the share of the"
                                " query's telling words' weight its text holds), at most"
                                " 1. 1 for a text holding every telling word; a text"
                                " found by meaning alone has its cosine similarity."
                            ),
                        },
                        "vector_rank": nullable({"type": "integer", "minimum": 1}),
                        "lexical_rank": nullable({"type": "integer", "minimum": 1}),
                    }
                ),
            },
            "vector_search": {"type": "boolean"},
        }
    ),
    "Findings": obj(
        {
            "hits": {
                "type": "array",
                "items": obj(
                    {
                        "record_id": {"type": "string"},
                        "scope_id": {"type": "integer"},
                        "scope": {"type": "object", "additionalProperties": {"type": "string"}},
                        "status": {"enum": ["active", "retracted", "forgotten"]},
                        "expired": {"type": "boolean"},
                        "snippet": {
                            "type": "string",
                            "description": "Of the current text; empty when forgotten.",
                        },
                    }
                ),
            },
            "more": {"type": "boolean", "description": "More matched than the hits given."},
        }
    ),
    "Found": obj(
        {
            "q": {"type": "string"},
            "by_id": nullable(ref("Findings")),
            "by_text": nullable(ref("Findings")),
        }
    ),
    "Scope": obj(
        {
            "id": {"type": "integer"},
            "scope": {"type": "object", "additionalProperties": {"type": "string"}},
            "revision": {"type": "integer"},
            "records": {"type": "integer"},
            "forgotten": {"type": "integer"},
            "last_write": nullable(TIME),
        }
    ),
    "Tombstone": obj(
        {
            "record_id": {"type": "string"},
            "scope_id": {"type": "integer"},
            "forgotten_at": TIME,
            "operation_id": {"type": "string"},
            "requested_by": nullable({"type": "string"}),
        }
    ),
    "Progress": obj(
        {
            "state": {
                "enum": [
                    *("running", "waiting", "activated", "failed", "cancelled", "superseded"),
                    "unknown",
                ]
            },
            "pass": nullable({"type": "integer"}),
            "done": nullable({"type": "integer"}),
            "total": nullable({"type": "integer"}),
            "skipped": nullable({"type": "integer"}),
            "errors": nullable({"type": "integer"}),
            "rate_per_s": nullable({"type": "number"}),
            "eta_s": nullable({"type": "number"}),
            "started_at": nullable({"type": "string"}),
            "updated_at": nullable({"type": "string"}),
            "requested_by": nullable({"type": "string"}),
            "job_id": nullable({"type": "string"}),
            "message": nullable({"type": "string"}),
            "superseded_by": nullable({"type": "integer"}),
            "retrying": {
                "type": "boolean",
                "description": "A slice failed and is tried again later: message says why "
                "and when.",
            },
        }
    ),
    "Generation": obj(
        {
            "id": {"type": "integer"},
            "model_id": {"type": "string"},
            "dims": {"type": "integer"},
            "status": {"enum": ["pending", "active", "retired", "cancelled"]},
            "created_at": TIME,
            "activated_at": nullable(TIME),
            "vectors": {"type": "integer"},
            "progress": nullable(ref("Progress")),
        }
    ),
    "Reembed": obj({"model": string(MAX_ID_CHARS), "reason": nullable(_WHY)}, optional=("reason",)),
    "JobStarted": obj({"job_id": {"type": "string"}}),
    "Job": obj(
        {
            "id": {"type": "string"},
            "queue": {"type": "string"},
            "state": {"type": "string"},
            "function": {"type": "string"},
            "created_at": nullable(TIME),
            "enqueued_at": nullable(TIME),
            "started_at": nullable(TIME),
            "ended_at": nullable(TIME),
            "error": nullable({"type": "string"}),
            "traceback": nullable({"type": "string"}),
            "arguments": {"type": "string"},
        }
    ),
    "Jobs": obj(
        {
            "queues": {
                "type": "array",
                "items": obj(
                    {
                        "name": {"type": "string"},
                        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                    }
                ),
            },
            "items": {"type": "array", "items": ref("Job")},
            "next": _PAGE_NEXT,
        }
    ),
    "DeadLetter": obj(
        {
            "id": {"type": "string"},
            "partition": {"type": "integer"},
            "entry": {"type": "string"},
            "operation_id": nullable({"type": "string"}),
            "reason": {"type": "string"},
            "code": {
                "type": "string",
                "description": "What was wrong, a code that tells the causes apart "
                "(invalid_json, too_many_deliveries, embedder_unavailable...).",
            },
            "detail": nullable(
                {
                    "type": "string",
                    "description": "A failed commit's root cause: its error's class and "
                    "content-free message (a database error: class and SQLSTATE).",
                }
            ),
            "error": {"type": "object"},
            "deliveries": {"type": "integer"},
            "at_ms": {"type": "integer"},
            "at": TIME,
            "op": nullable({"type": "string", "description": "The entry as sent."}),
            "malformed": {
                "type": "boolean",
                "description": "Its fields are missing or garbage: shown, never retried.",
            },
            "earlier_attempts": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/AuditEntry"},
                "description": "A single letter only: the retries of its operation before "
                "it was dead-lettered again (audit rows, oldest first).",
            },
        },
        optional=("earlier_attempts",),
    ),
    "Retried": obj(
        {
            "operation_id": nullable({"type": "string"}),
            "partition": {"type": "integer"},
            "entry": {"type": "string"},
        }
    ),
    "AuditEntry": obj(
        {
            "id": {"type": "integer"},
            "at": TIME,
            "requested_by": {"type": "string"},
            "action": {"type": "string"},
            "target": {"type": "string"},
            "detail": {"type": "object"},
        }
    ),
}
for _name in ("Receipt", "Record", "Scope", "Tombstone", "Generation", "DeadLetter", "AuditEntry"):
    SCHEMAS[f"{_name}Page"] = _page(_name)
for _kind, _body in _REQUESTS.items():
    SCHEMAS[f"{_kind.capitalize()}Operation"] = {
        "type": "object",
        "required": ["kind", "scope", "request"],
        "properties": {
            "operation_id": {
                **string(),
                "description": "Yours (a retry with the same id replays); generated if absent.",
            },
            "kind": {"const": _kind},
            "scope": _SCOPE,
            "request": _body,
            **({"reason": nullable(_WHY)} if _kind == "forget" else {}),
        },
        "additionalProperties": False,
    }
