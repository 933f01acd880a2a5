"""The OpenAPI 3.1 document of ``/api/v1``: what the server does, checked against
the running app by schemathesis in the tests (every documented route and status,
every response body)."""

from __future__ import annotations

import copy
import functools
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from store.limits import (
    MAX_ID_CHARS,
    MAX_KIND_CHARS,
    MAX_LINKS,
    MAX_MESSAGES,
    MAX_SCOPE_VALUE_CHARS,
    MAX_SOURCES,
    MAX_TEXT_CHARS,
    MAX_TOP_K,
)
from store.model import LINK_RELATIONS, ORIGINS, SCOPE_FIELDS, SOURCE_KINDS
from store.operations import MAX_TTL_MS, MESSAGE_ROLES, OPERATION_KINDS
from store.paging import MAX_PAGE_SIZE

from ..config import MAX_WAIT_S
from ..params import MAX_CURSOR_PARAM_CHARS, Query
from ..rqjobs import JOB_STATES
from ..state import web_of

Schema = dict[str, Any]

# Text the store accepts: not blank, no NUL.
_TEXT_PATTERN = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _string(max_length: int = MAX_ID_CHARS, **more: Any) -> Schema:
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": max_length,
        "pattern": _TEXT_PATTERN,
        **more,
    }


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


_TIME = {"type": "string", "format": "date-time"}
_SCOPE = {
    "type": "object",
    "description": "An exact scope: at least one field set (a null field is not set).",
    "properties": {f: _nullable(_string(MAX_SCOPE_VALUE_CHARS)) for f in SCOPE_FIELDS},
    "additionalProperties": False,
    "minProperties": 1,
}
_SOURCE = {
    "type": "object",
    "required": ["kind"],
    "properties": {
        "kind": {"enum": list(SOURCE_KINDS)},
        **{
            k: _nullable(_string())
            for k in ("digest", "message_id", "tool_call_id", "tool_name", "run_id", "chat_id")
        },
    },
    "additionalProperties": False,
}
_LINK = {
    "type": "object",
    "required": ["relation", "id"],
    "properties": {"relation": {"enum": list(LINK_RELATIONS)}, "id": _string()},
    "additionalProperties": False,
}
_PAGE_NEXT = _nullable({"type": "string", "description": "The cursor of the next page."})


def _page(item: str) -> Schema:
    return {
        "type": "object",
        "required": ["items", "next"],
        "properties": {"items": {"type": "array", "items": _ref(item)}, "next": _PAGE_NEXT},
        "additionalProperties": False,
    }


def _object(properties: dict[str, Schema], *, optional: tuple[str, ...] = ()) -> Schema:
    return {
        "type": "object",
        "required": [k for k in properties if k not in optional],
        "properties": properties,
        "additionalProperties": False,
    }


# -- the requests of each kind (store/operations.py reads them) ----------------------

_ID_OR_NULL = _nullable(_string())
_METADATA = _nullable(
    {
        "type": "object",
        "description": "Any JSON object: at most 16,000 bytes, 32 levels deep, no NUL.",
    }
)
_IMPORTANCE = _nullable({"type": "number", "minimum": 0, "maximum": 1})
_TTL = _nullable({"type": "integer", "minimum": 1, "maximum": MAX_TTL_MS})
_LINKS = _nullable({"type": "array", "maxItems": MAX_LINKS, "items": _LINK})
_KIND = _nullable(_string(MAX_KIND_CHARS))
_MESSAGE = {
    "type": "object",
    "required": ["id", "message"],
    "properties": {
        "id": _string(),
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
        text=_string(MAX_TEXT_CHARS),
        kind=_KIND,
        importance=_IMPORTANCE,
        metadata=_METADATA,
        origin=_nullable({"enum": list(ORIGINS)}),
        sources=_nullable(
            {"type": "array", "minItems": 1, "maxItems": MAX_SOURCES, "items": _SOURCE}
        ),
        links=_LINKS,
        ttl_ms=_TTL,
        id=_ID_OR_NULL,
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
        trusted_tools=_nullable({"type": "array", "maxItems": MAX_SOURCES, "items": _string()}),
        infer=_nullable({"const": False, "description": "true needs an LLM: not in this release."}),
    ),
    "revise": _request(
        ("id",),
        id=_string(),
        text=_nullable(_string(MAX_TEXT_CHARS)),
        kind=_KIND,
        importance=_IMPORTANCE,
        metadata=_METADATA,
        links=_LINKS,
        ttl_ms=_TTL,
        expected_revision=_nullable(
            {
                "type": "integer",
                "minimum": 0,
                "maximum": 2**31 - 1,
                "description": "0: the record must not exist yet (then text is needed).",
            }
        ),
    ),
    "retract": _request(
        ("id",),
        id=_string(),
        expected_revision=_nullable({"type": "integer", "minimum": 1, "maximum": 2**31 - 1}),
    ),
    "forget": _request(("id",), id=_string()),
}


_REVISION_PROPERTIES: dict[str, Schema] = {
    "id": {"type": "string"},
    "revision": {"type": "integer", "minimum": 1},
    "scope": {"type": "object", "additionalProperties": {"type": "string"}},
    "text": {"type": "string"},
    "kind": {"type": "string"},
    "importance": _nullable({"type": "number"}),
    "metadata": {"type": "object"},
    "origin": {"enum": list(ORIGINS)},
    "sources": {"type": "array", "items": {"type": "object"}},
    "links": {"type": "array", "items": {"type": "object"}},
    "status": {"enum": ["active", "retracted"]},
    "digest": {"type": "string"},
    "operation_id": {"type": "string"},
    "recorded_at": _TIME,
    "expires_at": _nullable(_TIME),
}

SCHEMAS: dict[str, Schema] = {
    "Error": _object(
        {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                "description": "A revision conflict adds expected, actual and attempts.",
            }
        }
    ),
    "Operation": {
        "description": (
            "An operation, exactly as on the streams: one of the kinds below. A field set "
            "to null is absent. Unknown fields are refused."
        ),
        "oneOf": [_ref(f"{kind.capitalize()}Operation") for kind in OPERATION_KINDS],
        "discriminator": {
            "propertyName": "kind",
            "mapping": {
                k: f"#/components/schemas/{k.capitalize()}Operation" for k in OPERATION_KINDS
            },
        },
    },
    "Accepted": _object(
        {
            "operation_id": {"type": "string"},
            "partition": {"type": "integer", "minimum": 0},
            "entry": {"type": "string"},
            "state": {"const": "enqueued"},
            "status_url": {"type": "string"},
        }
    ),
    "Receipt": _object(
        {
            "operation_id": {"type": "string"},
            "kind": {"enum": list(OPERATION_KINDS)},
            "scope": {"type": "object", "additionalProperties": {"type": "string"}},
            "scope_id": {"type": "integer"},
            "scope_revision": {"type": "integer", "minimum": 0},
            "committed_at": _TIME,
            "records": {
                "type": "array",
                "items": _object(
                    {
                        "id": {"type": "string"},
                        "revision": {"type": "integer"},
                        "status": {"enum": ["active", "retracted"]},
                    }
                ),
            },
            "redacted": {"type": "boolean"},
            "revisions": _nullable({"type": "array", "items": {"type": "integer"}}),
            "already_forgotten": _nullable({"type": "boolean"}),
            "redaction": _nullable({"enum": ["pending", "complete", "failed", "none"]}),
            "requested_by": _nullable({"type": "string"}),
            "replays": {"type": "integer", "minimum": 0},
            "last_replayed_at": _nullable(_TIME),
            "stream_entry": _nullable({"type": "string"}),
            "error": _nullable({"type": "object"}),
            "replayed": {
                "type": "boolean",
                "description": "Only when waited for: whether this answer was a replay.",
            },
        },
        optional=("replayed",),
    ),
    "OperationState": _object(
        {
            "operation_id": {"type": "string"},
            "state": {"enum": ["waiting", "committed", "refused", "failed"]},
            "receipt": _nullable(_ref("Receipt")),
            "error": _nullable({"type": "object"}),
        }
    ),
    "Revision": _object(_REVISION_PROPERTIES),
    "Record": _object(
        {
            **_REVISION_PROPERTIES,
            "scope_id": {"type": "integer"},
            "expired": {"type": "boolean"},
            "superseded_by": {"type": "array", "items": {"type": "string"}},
        }
    ),
    "History": _object(
        {"record_id": {"type": "string"}, "revisions": {"type": "array", "items": _ref("Revision")}}
    ),
    "Recall": {
        "type": "object",
        "required": ["scope"],
        "description": "A field set to null is absent. Without text: the latest records.",
        "properties": {
            "scope": _SCOPE,
            "text": _nullable(_string(MAX_TEXT_CHARS)),
            "top_k": _nullable({"type": "integer", "minimum": 1, "maximum": MAX_TOP_K}),
            "kind": _nullable(_string(MAX_KIND_CHARS)),
            "include_retracted": _nullable({"type": "boolean"}),
            "recorded_as_of": _nullable({**_TIME, "description": "UTC when no zone is given."}),
        },
        "additionalProperties": False,
    },
    "Hits": _object(
        {
            "hits": {
                "type": "array",
                "items": _object(
                    {
                        "record": _ref("Revision"),
                        "score": {"type": "number"},
                        "match": {"enum": ["vector", "lexical", "hybrid"]},
                        "superseded_by": {"type": "array", "items": {"type": "string"}},
                    }
                ),
            },
            "vector_search": {"type": "boolean"},
        }
    ),
    "Scope": _object(
        {
            "id": {"type": "integer"},
            "scope": {"type": "object", "additionalProperties": {"type": "string"}},
            "revision": {"type": "integer"},
            "records": {"type": "integer"},
            "forgotten": {"type": "integer"},
            "last_write": _nullable(_TIME),
        }
    ),
    "Tombstone": _object(
        {
            "record_id": {"type": "string"},
            "scope_id": {"type": "integer"},
            "forgotten_at": _TIME,
            "operation_id": {"type": "string"},
            "requested_by": _nullable({"type": "string"}),
        }
    ),
    "Progress": _object(
        {
            "state": {"enum": ["running", "waiting", "activated", "failed", "retired", "unknown"]},
            "pass": _nullable({"type": "integer"}),
            "done": _nullable({"type": "integer"}),
            "total": _nullable({"type": "integer"}),
            "skipped": _nullable({"type": "integer"}),
            "errors": _nullable({"type": "integer"}),
            "rate_per_s": _nullable({"type": "number"}),
            "eta_s": _nullable({"type": "number"}),
            "started_at": _nullable({"type": "string"}),
            "updated_at": _nullable({"type": "string"}),
            "requested_by": _nullable({"type": "string"}),
            "job_id": _nullable({"type": "string"}),
        }
    ),
    "Generation": _object(
        {
            "id": {"type": "integer"},
            "model_id": {"type": "string"},
            "dims": {"type": "integer"},
            "status": {"enum": ["pending", "active", "retired"]},
            "created_at": _TIME,
            "activated_at": _nullable(_TIME),
            "vectors": {"type": "integer"},
            "progress": _nullable(_ref("Progress")),
        }
    ),
    "Reembed": _object({"model": _string(MAX_ID_CHARS)}),
    "JobStarted": _object({"job_id": {"type": "string"}}),
    "Job": _object(
        {
            "id": {"type": "string"},
            "queue": {"type": "string"},
            "state": {"type": "string"},
            "function": {"type": "string"},
            "created_at": _nullable(_TIME),
            "enqueued_at": _nullable(_TIME),
            "started_at": _nullable(_TIME),
            "ended_at": _nullable(_TIME),
            "error": _nullable({"type": "string"}),
            "traceback": _nullable({"type": "string"}),
            "arguments": {"type": "string"},
        }
    ),
    "Jobs": _object(
        {
            "queues": {
                "type": "array",
                "items": _object(
                    {
                        "name": {"type": "string"},
                        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                    }
                ),
            },
            "items": {"type": "array", "items": _ref("Job")},
            "next": _PAGE_NEXT,
        }
    ),
    "DeadLetter": _object(
        {
            "id": {"type": "string"},
            "partition": {"type": "integer"},
            "entry": {"type": "string"},
            "operation_id": _nullable({"type": "string"}),
            "reason": {"type": "string"},
            "error": {"type": "object"},
            "deliveries": {"type": "integer"},
            "at_ms": {"type": "integer"},
            "op": _nullable({"type": "string", "description": "The entry as sent."}),
        }
    ),
    "Retried": _object(
        {
            "operation_id": _nullable({"type": "string"}),
            "partition": {"type": "integer"},
            "entry": {"type": "string"},
        }
    ),
    "AuditEntry": _object(
        {
            "id": {"type": "integer"},
            "at": _TIME,
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
                **_string(),
                "description": "Yours (a retry with the same id replays); generated if absent.",
            },
            "kind": {"const": _kind},
            "scope": _SCOPE,
            "request": _body,
        },
        "additionalProperties": False,
    }


# -- parameters ---------------------------------------------------------------------


def _path(name: str, schema: Schema, description: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema,
        "description": description,
    }


def _query(name: str, schema: Schema, description: str = "") -> Schema:
    """A query parameter; given empty (as an empty form field sends it), it is not given."""
    out: Schema = {
        "name": name,
        "in": "query",
        "required": False,
        "schema": {"anyOf": [schema, {"const": ""}]},
    }
    if description:
        out["description"] = description
    return out


_ID = _string()
_RECORD_ID = _path("record_id", _ID, "A record id (percent-encoded; it may hold '/').")
_OPERATION_ID = _path("operation_id", _ID, "An operation id (percent-encoded).")
_SCOPE_ID = _path(
    "scope_id", {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}, "A scope's id."
)
_JOB_ID = _path("job_id", {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"}, "An RQ job id.")
_LETTER_ID = _path(
    "letter_id", {"type": "string", "pattern": "^[0-9]{1,19}-[0-9]{1,19}$"}, "A dead letter's id."
)
_PAGING = [
    _query(
        "cursor",
        {"type": "string", "maxLength": MAX_CURSOR_PARAM_CHARS},
        "From the previous page's next; opaque.",
    ),
    _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE}),
]
_FLAG = {"enum": ["true", "false", "any"]}
_SCOPE_FILTERS = [
    *[
        _query(f, _string(MAX_SCOPE_VALUE_CHARS), "Scopes whose field begins with this.")
        for f in SCOPE_FIELDS
    ],
    _query("exact", _FLAG, "true: fields equal the values given."),
]
_RECEIPT_FILTERS = [
    _query("scope", {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}, "A scope's id."),
    _query("record", _ID, "Receipts that wrote this record, and the forget that erased it."),
    _query("kind", {"enum": list(OPERATION_KINDS)}),
    _query("replayed", _FLAG, "Answered a repeat of its operation at least once."),
    _query("redacted", _FLAG, "Its text was removed by a forget."),
    _query("refused", {"enum": ["only", "exclude"]}, "Refusals: committed nothing."),
    _query("requested_by", _ID, "Who asked."),
    _query("since", _TIME, "Committed at or after (UTC when no zone is given)."),
    _query("until", _TIME, "Committed before."),
]


# -- operations ---------------------------------------------------------------------


def _json(schema: Schema, description: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERRORS = {
    "400": "A malformed path, query or body (code invalid_request).",
    "401": "The dashboard's token is needed (code unauthorized).",
    "403": "A cross-site request (code forbidden).",
    "404": "Not found (code not_found).",
    "409": "A revision or operation conflict (revision_conflict, operation_conflict, ...).",
    "413": "The body is too large (code too_large).",
    "415": "The body is not application/json (code unsupported_media_type).",
    "422": "An invalid operation or argument (code invalid_request).",
    "503": "PostgreSQL, Redis, the queue or the jobs are not available (queue_full, ...).",
    "504": "Reserved: a wait that ran out answers 202 instead.",
}
_READ_ERRORS = ("400", "401", "404", "503")
_BODY_ERRORS = ("400", "401", "403", "404", "413", "415", "422", "503")


def _op(
    summary: str,
    ok: dict[str, Schema],
    *,
    parameters: list[Schema] | None = None,
    body: Schema | None = None,
    errors: tuple[str, ...] = _READ_ERRORS,
    body_required: bool = True,
) -> Schema:
    responses = dict(ok)
    for code in errors:
        responses[code] = _json(_ref("Error"), _ERRORS[code])
    out: Schema = {"summary": summary, "responses": responses}
    if parameters:
        out["parameters"] = parameters
    if body is not None:
        out["requestBody"] = {
            "required": body_required,
            "content": {"application/json": {"schema": body}},
        }
    return out


_NO_BODY = {"type": "object", "maxProperties": 0, "description": "Nothing, or {}."}

PATHS: dict[str, Schema] = {
    "/api/v1/operations": {
        "post": _op(
            "Enqueue an operation on its scope's stream",
            {
                "202": _json(_ref("Accepted"), "Enqueued (or waited for and not answered yet)."),
                "200": _json(_ref("Receipt"), "With ?wait: the receipt."),
            },
            parameters=[
                _query(
                    "wait",
                    {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
                    "Seconds to wait for the receipt.",
                )
            ],
            body=_ref("Operation"),
            errors=("400", "401", "403", "404", "409", "413", "415", "422", "503"),
        )
    },
    "/api/v1/operations/{operation_id}": {
        "get": _op(
            "An operation's state: waiting, committed, refused or failed (dead-lettered)",
            {"200": _json(_ref("OperationState"), "Its state.")},
            parameters=[_OPERATION_ID],
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/receipts": {
        "get": _op(
            "Receipts, newest first",
            {"200": _json(_ref("ReceiptPage"), "A page.")},
            parameters=[*_RECEIPT_FILTERS, *_PAGING],
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/receipts/{operation_id}": {
        "get": _op(
            "A receipt (a refusal's too)",
            {"200": _json(_ref("Receipt"), "The receipt.")},
            parameters=[_OPERATION_ID],
        )
    },
    "/api/v1/records/{record_id}": {
        "get": _op(
            "A record's current revision, in any scope",
            {"200": _json(_ref("Record"), "The record.")},
            parameters=[_RECORD_ID],
        )
    },
    "/api/v1/history/{record_id}": {
        "get": _op(
            "Every stored revision of a record, oldest first",
            {"200": _json(_ref("History"), "Its revisions.")},
            parameters=[_RECORD_ID],
        )
    },
    "/api/v1/recall": {
        "post": _op(
            "Recall in one scope (a POST: the text stays out of URLs and logs)",
            {"200": _json(_ref("Hits"), "The hits, best first.")},
            body=_ref("Recall"),
            errors=("400", "401", "403", "413", "415", "422", "503"),
        )
    },
    "/api/v1/scopes": {
        "get": _op(
            "Scopes in key order, filtered by any field",
            {"200": _json(_ref("ScopePage"), "A page.")},
            parameters=[*_SCOPE_FILTERS, *_PAGING],
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/scopes/{scope_id}": {
        "get": _op("A scope", {"200": _json(_ref("Scope"), "The scope.")}, parameters=[_SCOPE_ID])
    },
    "/api/v1/scopes/{scope_id}/records": {
        "get": _op(
            "A scope's records by status, most recently changed first; or as of a time",
            {"200": _json(_ref("RecordPage"), "A page.")},
            parameters=[
                _SCOPE_ID,
                _query("status", {"enum": ["active", "retracted", "expired", "all"]}),
                _query("as_of", _TIME, "The scope as the store knew it then."),
                *_PAGING,
            ],
        )
    },
    "/api/v1/scopes/{scope_id}/tombstones": {
        "get": _op(
            "A scope's forgotten ids, most recent first",
            {"200": _json(_ref("TombstonePage"), "A page.")},
            parameters=[_SCOPE_ID, *_PAGING],
        )
    },
    "/api/v1/generations": {
        "get": _op(
            "Embedding generations, newest first, with vector counts and reembed progress",
            {"200": _json(_ref("GenerationPage"), "A page.")},
            parameters=_PAGING,
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/reembed": {
        "post": _op(
            "Start a reembed towards a model",
            {"202": _json(_ref("JobStarted"), "Started.")},
            body=_ref("Reembed"),
            errors=("400", "401", "403", "409", "413", "415", "422", "503"),
        )
    },
    "/api/v1/jobs": {
        "get": _op(
            "Background jobs of a queue in a state, newest first, with every queue's counts",
            {"200": _json(_ref("Jobs"), "The counts and a page.")},
            parameters=[
                _query("queue", {"type": "string"}, "One of the configured queues."),
                _query("state", {"enum": list(JOB_STATES)}),
                *_PAGING,
            ],
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/jobs/{job_id}": {
        "get": _op("A job", {"200": _json(_ref("Job"), "The job.")}, parameters=[_JOB_ID])
    },
    "/api/v1/jobs/{job_id}/retry": {
        "post": _op(
            "Put a failed job back on its queue",
            {"200": _json(_ref("Job"), "The job, queued.")},
            parameters=[_JOB_ID],
            body=_NO_BODY,
            body_required=False,
            errors=_BODY_ERRORS,
        )
    },
    "/api/v1/dead-letters": {
        "get": _op(
            "Dead letters, newest first",
            {"200": _json(_ref("DeadLetterPage"), "A page.")},
            parameters=_PAGING,
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/dead-letters/{letter_id}": {
        "get": _op(
            "A dead letter: the entry as sent, its error and why",
            {"200": _json(_ref("DeadLetter"), "The letter.")},
            parameters=[_LETTER_ID],
        ),
        "delete": _op(
            "Discard a dead letter for good",
            {"204": {"description": "Discarded."}},
            parameters=[_LETTER_ID],
            errors=("400", "401", "403", "404", "503"),
        ),
    },
    "/api/v1/dead-letters/{letter_id}/retry": {
        "post": _op(
            "Enqueue a dead letter's operation again on its partition",
            {"200": _json(_ref("Retried"), "Enqueued again.")},
            parameters=[_LETTER_ID],
            body=_NO_BODY,
            body_required=False,
            errors=_BODY_ERRORS,
        )
    },
    "/api/v1/audit": {
        "get": _op(
            "Who retried, discarded or started what, newest first",
            {"200": _json(_ref("AuditEntryPage"), "A page.")},
            parameters=_PAGING,
            errors=("400", "401", "503"),
        )
    },
}

DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "engram",
        "version": "1",
        "description": (
            "Versioned memory: enqueue operations, read receipts, records and their history, "
            'recall, and watch the pipeline. Errors are {"error": {"code", "message"}}. '
            "Lists are pages: pass the previous page's next as cursor."
        ),
    },
    "servers": [{"url": "/"}],
    "paths": PATHS,
    "components": {
        "schemas": SCHEMAS,
        "securitySchemes": {
            "token": {
                "type": "http",
                "scheme": "bearer",
                "description": "ENGRAM_DASHBOARD_TOKEN; not needed on loopback without one.",
            }
        },
    },
    "security": [{}, {"token": []}],
}


@functools.cache
def document(job_queues: tuple[str, ...]) -> dict[str, Any]:
    """The document of a server whose jobs page shows these queues."""
    found = copy.deepcopy(DOCUMENT)
    for param in found["paths"]["/api/v1/jobs"]["get"]["parameters"]:
        if param["name"] == "queue":
            param["schema"] = {"enum": list(job_queues)}
    return found


def openapi(request: Request) -> Response:
    Query.of(request)  # takes none
    return JSONResponse(document(web_of(request).config.job_queues))
