"""The OpenAPI 3.1 document of ``/api/v1``: what the server does, checked against
the running app by schemathesis in the tests (every documented route and status,
every request and response body)."""

from __future__ import annotations

import copy
import functools
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engram.store.audit import ACTIONS
from engram.store.limits import MAX_SCOPE_VALUE_CHARS
from engram.store.read.find import MAX_FIND_TEXT_CHARS
from engram.store.read.paging import MAX_PAGE_SIZE
from engram.store.values import SCOPE_FIELDS
from engram.store.write.operations import OPERATION_KINDS
from engram.worker.admin.pause import MAX_REASON_CHARS

from ..config import MAX_WAIT_S
from ..params import MAX_CURSOR_PARAM_CHARS, Query
from ..rqjobs import JOB_FUNCTIONS, JOB_STATES
from ..state import web_of
from .schemas import POSITION, SCHEMAS, TIME, Schema, nullable, obj, ref, string

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


_ID = string()
_RECORD_ID = _path("record_id", _ID, "A record id (percent-encoded; it may hold '/').")
_OPERATION_ID = _path("operation_id", _ID, "An operation id (percent-encoded).")
_SCOPE_ID = _path(
    "scope_id", {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}, "A scope's id."
)
_JOB_ID = _path("job_id", {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"}, "An RQ job id.")
_LETTER_ID = _path(
    "letter_id", {"type": "string", "pattern": "^[0-9]{1,19}-[0-9]{1,19}$"}, "A dead letter's id."
)
_GENERATION_ID = _path(
    "generation_id", {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}, "A generation's id."
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
_AFTER = _query("after", POSITION, "A receipt's position: read as of that commit or later.")
_SCOPE_FILTERS = [
    *[
        _query(f, string(MAX_SCOPE_VALUE_CHARS), "Scopes whose field begins with this.")
        for f in SCOPE_FIELDS
    ],
    _query("exact", _FLAG, "true: fields equal the values given."),
]
# An operation id is its scope's: the scope an operation is looked up in. A token's is
# its own (another is 404); the operator's may be left out when one scope holds the id.
_OPERATION_SCOPE = [
    _query(f, string(MAX_SCOPE_VALUE_CHARS), "The operation's scope, by its fields.")
    for f in SCOPE_FIELDS
]

_RECORD_SCOPE = [
    _query(f, string(MAX_SCOPE_VALUE_CHARS), "The record's scope, by its fields.")
    for f in SCOPE_FIELDS
]

_RECEIPT_FILTERS = [
    _query("scope", {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}, "A scope's id."),
    *[
        _query(f, string(MAX_SCOPE_VALUE_CHARS), "Receipts of every scope with this field.")
        for f in SCOPE_FIELDS
    ],
    _query("record", _ID, "Receipts that wrote this record, and the forget that erased it."),
    _query("record_prefix", _ID, "The same, for every record id that begins with this."),
    _query("kind", {"enum": list(OPERATION_KINDS)}),
    _query("replayed", _FLAG, "Answered a repeat of its operation at least once."),
    _query("redacted", _FLAG, "Its text was removed by a forget."),
    _query("refused", {"enum": ["only", "exclude"]}, "Refusals: committed nothing."),
    _query("requested_by", _ID, "Who asked."),
    _query("requested_by_prefix", _ID, "Who asked begins with this."),
    _query("since", TIME, "Committed at or after (UTC when no zone is given)."),
    _query("until", TIME, "Committed before."),
]


# -- operations ---------------------------------------------------------------------


def _json(schema: Schema, description: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERRORS = {
    "400": "A malformed path, query or body (code invalid_request).",
    "401": (
        "The dashboard's token is needed, or the scoped token sent is unknown, revoked or "
        "expired (code unauthorized)."
    ),
    "403": (
        "A cross-site request, or a scoped token on a route that is the operator's or "
        "without the capability asked for (code forbidden)."
    ),
    "404": "Not found (code not_found).",
    "409": (
        "A revision or operation conflict, or an asserted record a model may not change "
        "(revision_conflict, operation_conflict, asserted_record, embedding_mismatch), or "
        "a bulk action's letters changed since its dry run (selection_changed), or a "
        "generation that is not pending cannot be cancelled (generation_not_pending), or "
        "an operation id or a record id the operator left the scope out of is in several "
        "scopes (operation_ambiguous, record_ambiguous, with the scopes that hold it)."
    ),
    "413": "The body is too large (code too_large).",
    "415": "The body is not application/json (code unsupported_media_type).",
    "429": (
        "A scoped token past its reads or writes of the minute (code rate_limited, with "
        "Retry-After and retry_after_s): nothing was read or enqueued."
    ),
    "422": "An invalid operation or argument (code invalid_request).",
    "500": "With ?wait: the operation was dead-lettered (code dead_lettered).",
    "502": "With ?wait: the model's answer was unusable (code model_output).",
    "503": (
        "PostgreSQL, Redis, the queue, the jobs or (with ?wait) the model are not available "
        "(queue_full, model_unavailable, ...)."
    ),
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
    # Any route refuses a scoped token that may not use it (web.scoped).
    for code in sorted({*errors, "403"}):
        responses[code] = _json(ref("Error"), _ERRORS[code])
    out: Schema = {"summary": summary, "responses": responses}
    if parameters:
        out["parameters"] = parameters
    if body is not None:
        out["requestBody"] = {
            "required": body_required,
            "content": {"application/json": {"schema": body}},
        }
    return out


# Why an operator retries or discards: kept in the audit row.
_REASON = {"type": "string", "maxLength": 200}
_WHY = {
    "type": "object",
    "properties": {"reason": nullable(_REASON)},
    "additionalProperties": False,
    "description": "Nothing, {}, or why.",
}
_SEEN = {
    "type": "object",
    "properties": {"count": {"type": "integer"}, "digest": {"type": "string"}},
    "required": ["count", "digest"],
}
_LETTER_CODE = {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"}
_LETTER_FILTERS = [
    _query("reason", {"enum": ["malformed", "deliveries", "failed"]}, "Why it was dead-lettered."),
    _query("partition", {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}),
    _query("code", _LETTER_CODE, "Its code (what was wrong), exactly unless code_match=prefix."),
    _query("code_match", {"enum": ["exact", "prefix"]}, "How code matches: exact (default)."),
    _query("kind", {"enum": list(OPERATION_KINDS)}, "The kind of the operation it holds."),
    _query("since", TIME, "Dead-lettered at or after (UTC when no zone is given)."),
    _query("until", TIME, "Dead-lettered before."),
    _query("operation_id", string(), "Of this operation id (exactly)."),
    _query("record_id", string(), "Its operation names this record (request.id, exactly)."),
    *[
        _query(f, string(MAX_SCOPE_VALUE_CHARS), f"Its operation's scope has this {f}.")
        for f in SCOPE_FIELDS
    ],
]
_BULK_FILTER = {
    "type": "object",
    "properties": {
        # Empty, as a form sends an empty field: not given.
        "reason": nullable({"enum": ["malformed", "deliveries", "failed", ""]}),
        "partition": nullable({"anyOf": [{"type": "integer", "minimum": 0}, {"const": ""}]}),
        "code": nullable({"anyOf": [_LETTER_CODE, {"const": ""}]}),
        "code_match": nullable({"enum": ["exact", "prefix", ""]}),
        "kind": nullable({"enum": [*OPERATION_KINDS, ""]}),
        "since": nullable({"anyOf": [TIME, {"const": ""}]}),
        "until": nullable({"anyOf": [TIME, {"const": ""}]}),
        "operation_id": nullable({"anyOf": [string(), {"const": ""}]}),
        "record_id": nullable({"anyOf": [string(), {"const": ""}]}),
        **{
            f: nullable({"anyOf": [string(MAX_SCOPE_VALUE_CHARS), {"const": ""}]})
            for f in SCOPE_FIELDS
        },
    },
    "additionalProperties": False,
}
_BULK = {
    "type": "object",
    "properties": {
        "action": {"enum": ["retry", "discard"]},
        "filter": nullable(_BULK_FILTER),
        "reason": nullable(_REASON),
        "confirm": nullable(_SEEN),
    },
    "required": ["action"],
    "additionalProperties": False,
}
# The queue's enum is the configured queues (``document``).
_JOBS_FILTER = {
    "type": "object",
    "properties": {"queue": {"type": "string"}},
    "additionalProperties": False,
}
_JOBS_BULK = {
    "type": "object",
    "properties": {
        "action": {"enum": ["retry", "discard"]},
        "filter": nullable(_JOBS_FILTER),
        "reason": nullable(_REASON),
        "confirm": nullable(_SEEN),
    },
    "required": ["action"],
    "additionalProperties": False,
}
_JOBS_BULK_DONE = {
    "type": "object",
    "properties": {
        "action": {"enum": ["retry", "discard"]},
        "filter": _JOBS_FILTER,
        "count": {"type": "integer"},
        "digest": {"type": "string"},
        "dry_run": {"type": "boolean"},
        "items": {"type": "array", "items": ref("Job")},
        "left": {
            "type": "array",
            "items": {"type": "string"},
            "description": "The failed jobs the action leaves (a retry: unreadable, or not "
            "failed by their own state); never acted on.",
        },
        "left_why": {"type": "object", "additionalProperties": {"type": "string"}},
        "skipped": {
            "type": "array",
            "items": obj({"id": {"type": "string"}, "reason": {"type": "string"}}),
            "description": "Confirmed: the jobs taken that changed in between and were not "
            "acted on (every other one was).",
        },
        "confirm": _SEEN,
    },
    "required": ["action", "filter", "count", "digest", "dry_run"],
}
_BULK_DONE = {
    "type": "object",
    "properties": {
        "action": {"enum": ["retry", "discard"]},
        "filter": _BULK_FILTER,
        "count": {"type": "integer"},
        "digest": {"type": "string"},
        "dry_run": {"type": "boolean"},
        "items": {"type": "array", "items": ref("DeadLetter")},
        "left": {"type": "array", "items": {"type": "string"}},
        "confirm": _SEEN,
    },
    "required": ["action", "filter", "count", "digest", "dry_run"],
}

_AUDIT_FILTERS = [
    _query("action", {"enum": list(ACTIONS)}, "Rows of this action."),
    _query("by", string(), "Rows of this asker (exactly)."),
    _query("target", string(), "Rows about this target (exactly)."),
    _query("since", TIME, "Written at or after (UTC when no zone is given)."),
    _query("until", TIME, "Written before."),
]

# -- pausing (web/api/pause.py) ------------------------------------------------------

_PARTITION = _path(
    "partition", {"type": "string", "pattern": "^[0-9]{1,6}$"}, "A partition's number, from 0."
)
_PAUSE_BODY = obj(
    {"reason": {"type": "string", "maxLength": MAX_REASON_CHARS, "description": "Why."}},
    optional=("reason",),
)
_PAUSE_ERRORS = ("400", "401", "403", "413", "415", "422", "503")
_PAUSE = {
    "by": {"type": "string", "description": "The operator signed in."},
    "at": {**nullable(TIME), "description": "Since when."},
    "reason": {"type": "string"},
}
_PAUSED_NOW = obj(
    {"partition": {"type": "integer"}, "paused": {"const": True}, **_PAUSE},
    optional=("partition",),
)
_RESUMED = obj(
    {
        "partition": {"type": "integer"},
        "paused": {"const": False},
        "was_paused": {"type": "boolean"},
    },
    optional=("partition",),
)
_PAUSE_SEEN: dict[str, Schema] = {
    "in_effect": {
        "type": "boolean",
        "description": "Every live worker it concerns has seen it (none: true).",
    },
    "waiting_for": {
        "type": "array",
        "items": {"type": "string"},
        "description": "The live workers yet to see it (ids; a jobs worker's name).",
    },
}
_PAUSED_STATE = obj(
    {
        "partitions": {
            "type": "array",
            "items": obj({"partition": {"type": "integer"}, **_PAUSE, **_PAUSE_SEEN}),
        },
        "jobs": obj(
            {
                "paused": {"type": "boolean"},
                "by": nullable({"type": "string"}),
                "at": nullable(TIME),
                "reason": {"type": "string"},
                **_PAUSE_SEEN,
                "running": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Jobs still in the hands of the workers yet to see it.",
                },
            },
            optional=("in_effect", "waiting_for", "running"),
        ),
    }
)

PATHS: dict[str, Schema] = {
    "/api/v1/operations": {
        "post": _op(
            "Enqueue an operation on its scope's stream",
            {
                "202": _json(ref("Accepted"), "Enqueued (or waited for and not answered yet)."),
                "200": _json(ref("Receipt"), "With ?wait: the receipt."),
            },
            parameters=[
                _query(
                    "wait",
                    {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
                    "Seconds to wait for the receipt.",
                )
            ],
            body=ref("Operation"),
            errors=("400", "401", "403", "404", "409", "413", "415", "422", "500", "502", "503"),
        )
    },
    "/api/v1/operations/{operation_id}": {
        "get": _op(
            "An operation's state in its scope: waiting, committed, refused or failed "
            "(dead-lettered); 404 when it has no receipt, no reply and no entry in the "
            "streams' backlog; 409 operation_ambiguous when the scope is left out and "
            "several scopes hold the id",
            {"200": _json(ref("OperationState"), "Its state.")},
            parameters=[_OPERATION_ID, *_OPERATION_SCOPE],
            errors=("400", "401", "404", "409", "503"),
        )
    },
    "/api/v1/receipts": {
        "get": _op(
            "Receipts, newest first",
            {"200": _json(ref("ReceiptPage"), "A page.")},
            parameters=[*_RECEIPT_FILTERS, *_PAGING],
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/receipts/{operation_id}": {
        "get": _op(
            "A receipt (a refusal's too) in its scope, as the operation's state",
            {"200": _json(ref("Receipt"), "The receipt.")},
            parameters=[_OPERATION_ID, *_OPERATION_SCOPE],
            errors=("400", "401", "404", "409", "503"),
        )
    },
    "/api/v1/records/{record_id}": {
        "get": _op(
            "A record's current revision in its scope (a record id is its scope's: a token's "
            "own; the operator's by its fields, else the one scope holding the id); 409 "
            "record_ambiguous when the scope is left out and several scopes hold the id",
            {"200": _json(ref("Record"), "The record.")},
            parameters=[_RECORD_ID, _AFTER, *_RECORD_SCOPE],
            errors=("400", "401", "404", "409", "503"),
        )
    },
    "/api/v1/history/{record_id}": {
        "get": _op(
            "A record's stored revisions in its scope (as for a record), oldest first, up to "
            "200 a page (limit, cursor)",
            {"200": _json(ref("History"), "Its revisions, and the next page's cursor.")},
            parameters=[_RECORD_ID, _AFTER, *_PAGING, *_RECORD_SCOPE],
            errors=("400", "401", "404", "409", "503"),
        )
    },
    "/api/v1/recall": {
        "post": _op(
            "Recall in one scope (a POST: the text stays out of URLs and logs)",
            {"200": _json(ref("Hits"), "The hits, best first.")},
            body=ref("Recall"),
            errors=("400", "401", "403", "413", "415", "422", "503"),
        )
    },
    "/api/v1/find": {
        "get": _op(
            "Records in any scope by their id or its beginning (forgotten ones too), and "
            "by the words of their current text, best first; at most 50 of each",
            {"200": _json(ref("Found"), "The hits by id and by text.")},
            parameters=[
                {
                    "name": "q",
                    "in": "query",
                    "required": True,
                    "schema": string(MAX_FIND_TEXT_CHARS),
                    "description": (
                        "An id, its beginning (% and _ are literal), or words: all of them, "
                        'a "quoted phrase", or, -word.'
                    ),
                },
                _query("by", {"enum": ["any", "id", "text"]}, "Both searches (any), or one."),
            ],
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/scopes": {
        "get": _op(
            "Scopes in key order, filtered by any field",
            {"200": _json(ref("ScopePage"), "A page.")},
            parameters=[*_SCOPE_FILTERS, *_PAGING],
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/scopes/{scope_id}": {
        "get": _op("A scope", {"200": _json(ref("Scope"), "The scope.")}, parameters=[_SCOPE_ID])
    },
    "/api/v1/scopes/{scope_id}/records": {
        "get": _op(
            "A scope's records by status, most recently changed first; or as of a time",
            {"200": _json(ref("RecordPage"), "A page.")},
            parameters=[
                _SCOPE_ID,
                _query("status", {"enum": ["active", "retracted", "expired", "all"]}),
                _query("as_of", TIME, "The scope as the store knew it then."),
                *_PAGING,
            ],
        )
    },
    "/api/v1/scopes/{scope_id}/tombstones": {
        "get": _op(
            "A scope's forgotten ids, most recent first",
            {"200": _json(ref("TombstonePage"), "A page.")},
            parameters=[_SCOPE_ID, *_PAGING],
        )
    },
    "/api/v1/generations": {
        "get": _op(
            "Embedding generations, newest first, with vector counts and reembed progress",
            {"200": _json(ref("GenerationPage"), "A page.")},
            parameters=_PAGING,
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/generations/{generation_id}/cancel": {
        "post": _op(
            "Cancel a pending reembed (why, optionally, for the audit trail): the generation "
            "ends cancelled, its vectors are deleted, its job stops before its next batch; "
            "409 generation_not_pending (nothing changed) for an active, retired or "
            "cancelled one",
            {"200": _json(ref("Generation"), "The generation, cancelled.")},
            parameters=[_GENERATION_ID],
            body=_WHY,
            body_required=False,
            errors=("400", "401", "403", "404", "409", "413", "415", "422", "503"),
        )
    },
    "/api/v1/reembed": {
        "post": _op(
            "Start a reembed towards a model, loaded and tried here first: 422 "
            "embedder_cannot_load (nothing created) when it cannot load",
            {"202": _json(ref("JobStarted"), "Started.")},
            body=ref("Reembed"),
            errors=("400", "401", "403", "409", "413", "415", "422", "503"),
        )
    },
    "/api/v1/jobs": {
        "get": _op(
            "Background jobs of a queue in a state, newest first, with every queue's counts",
            {"200": _json(ref("Jobs"), "The counts and a page.")},
            parameters=[
                _query("queue", {"type": "string"}, "One of the configured queues."),
                _query("state", {"enum": list(JOB_STATES)}),
                _query("function", {"enum": list(JOB_FUNCTIONS)}, "Jobs of this function only."),
                _query(
                    "ticks",
                    {"enum": ["show", "hide"]},
                    "The scheduled maintenance ticks: shown (the default) or hidden. Filtered "
                    "by function or without ticks, a page reads at most 1,000 jobs (5,000 "
                    "ids) and may hold fewer than limit, with a next to search on.",
                ),
                *_PAGING,
            ],
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/jobs/{job_id}": {
        "get": _op("A job", {"200": _json(ref("Job"), "The job.")}, parameters=[_JOB_ID])
    },
    "/api/v1/jobs/{job_id}/retry": {
        "post": _op(
            "Put a failed job back on its queue (why, optionally, for the audit trail)",
            {"200": _json(ref("Job"), "The job, queued.")},
            parameters=[_JOB_ID],
            body=_WHY,
            body_required=False,
            errors=_BODY_ERRORS,
        )
    },
    "/api/v1/jobs/{job_id}/discard": {
        "post": _op(
            "Delete a failed job for good, with its data and results, unreadable ones too "
            "(why, optionally, for the audit trail)",
            {"200": _json(ref("Job"), "The job as it was.")},
            parameters=[_JOB_ID],
            body=_WHY,
            body_required=False,
            errors=_BODY_ERRORS,
        )
    },
    "/api/v1/bulk/jobs": {
        "post": _op(
            "Retry (the readable ones that failed) or discard every failed job of a queue: "
            "without confirm a dry run (count, the first 20, the ones left and why, and the "
            "confirm to send back); with it, the action on every job the dry run took, "
            "refused (409 selection_changed) if they changed; a job that changed while the "
            "action went on is skipped and listed",
            {"200": _json(_JOBS_BULK_DONE, "The dry run, or what was done.")},
            body=_JOBS_BULK,
            errors=("400", "401", "403", "409", "413", "415", "422", "503"),
        )
    },
    "/api/v1/dead-letters": {
        "get": _op(
            "Dead letters, newest first; with a filter, a page reads at most 5,000 letters "
            "(it may hold fewer than limit, with a next to search on)",
            {"200": _json(ref("DeadLetterPage"), "A page.")},
            parameters=[*_LETTER_FILTERS, *_PAGING],
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/bulk/dead-letters": {
        "post": _op(
            "Retry or discard every dead letter a filter matches: without confirm a dry "
            "run (count, the first 20, and the confirm to send back); with it, the action, "
            "refused (409 selection_changed) if the matching letters changed",
            {"200": _json(_BULK_DONE, "The dry run, or what was done.")},
            body=_BULK,
            errors=("400", "401", "403", "409", "413", "415", "422", "503"),
        )
    },
    "/api/v1/dead-letters/{letter_id}": {
        "get": _op(
            "A dead letter: the entry as sent, its error and why",
            {"200": _json(ref("DeadLetter"), "The letter.")},
            parameters=[_LETTER_ID],
        ),
        "delete": _op(
            "Discard a dead letter for good (why, optionally, for the audit trail)",
            {"204": {"description": "Discarded."}},
            parameters=[_LETTER_ID],
            body=_WHY,
            body_required=False,
            errors=_BODY_ERRORS,
        ),
    },
    "/api/v1/dead-letters/{letter_id}/retry": {
        "post": _op(
            "Enqueue a dead letter's operation again on its partition (on its scope's when "
            "it was on the wrong one; 422 for one that can never be applied)",
            {"200": _json(ref("Retried"), "Enqueued again.")},
            parameters=[_LETTER_ID],
            body=_WHY,
            body_required=False,
            errors=_BODY_ERRORS,
        )
    },
    "/api/v1/queues/pause": {
        "post": _op(
            "Pause the jobs queues (RQ's suspension): no jobs worker takes a job until "
            "resumed; the job in hand finishes",
            {"200": _json(_PAUSED_NOW, "Paused.")},
            body=_PAUSE_BODY,
            body_required=False,
            errors=_PAUSE_ERRORS,
        )
    },
    "/api/v1/queues/resume": {
        "post": _op(
            "Resume the jobs queues (why, optionally, for the audit trail)",
            {"200": _json(_RESUMED, "Resumed (was_paused: whether they were).")},
            body=_PAUSE_BODY,
            body_required=False,
            errors=_PAUSE_ERRORS,
        )
    },
    "/api/v1/partitions/{partition}/pause": {
        "post": _op(
            "Pause a partition: no worker reads or claims it; its operations wait in its "
            "stream (producers are unaffected) and commit in order once it is resumed",
            {"200": _json(_PAUSED_NOW, "Paused, within about a second at every worker.")},
            parameters=[_PARTITION],
            body=_PAUSE_BODY,
            body_required=False,
            errors=(*_PAUSE_ERRORS, "404"),
        )
    },
    "/api/v1/partitions/{partition}/resume": {
        "post": _op(
            "Resume a partition (why, optionally, for the audit trail)",
            {"200": _json(_RESUMED, "Resumed (was_paused: whether it was).")},
            parameters=[_PARTITION],
            body=_PAUSE_BODY,
            body_required=False,
            errors=(*_PAUSE_ERRORS, "404"),
        )
    },
    "/api/v1/paused": {
        "get": _op(
            "What is paused: partitions (who, since when, why) and the jobs queues",
            {"200": _json(_PAUSED_STATE, "What is paused.")},
            errors=("400", "401", "503"),
        )
    },
    "/api/v1/audit": {
        "get": _op(
            "Who retried, discarded, started, paused or revoked what, and why, newest first;"
            " filtered by action, who asked, target and time",
            {"200": _json(ref("AuditEntryPage"), "A page.")},
            parameters=[*_AUDIT_FILTERS, *_PAGING],
            errors=("400", "401", "503"),
        )
    },
}

# The routes a scoped token may call (web.scoped): each counts against its rate limits.
for _path_name, _method in (
    ("/api/v1/operations", "post"),
    ("/api/v1/operations/{operation_id}", "get"),
    ("/api/v1/receipts/{operation_id}", "get"),
    ("/api/v1/records/{record_id}", "get"),
    ("/api/v1/history/{record_id}", "get"),
    ("/api/v1/recall", "post"),
):
    PATHS[_path_name][_method]["responses"]["429"] = _json(ref("Error"), _ERRORS["429"])

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
                "description": (
                    "The operator's token (ENGRAM_DASHBOARD_TOKEN, else the home's: "
                    "ENGRAM_HOME/dashboard.token; none only on a dashboard served open, "
                    "ENGRAM_DASHBOARD_OPEN, while no scoped token is live), or a scoped "
                    "token (egt_..., engram tokens create): it reaches its "
                    "own scope's records, history, recall, operations and receipts only, "
                    "within its capabilities, and takes its scope from the token (a body "
                    "may leave scope out, or repeat it; another scope's is not found)."
                ),
            }
        },
    },
    "security": [{}, {"token": []}],
}


@functools.cache
def document(job_queues: tuple[str, ...]) -> dict[str, Any]:
    """The document of a server whose jobs page shows these queues."""
    found = copy.deepcopy(DOCUMENT)
    found["paths"]["/api/v1/bulk/jobs"]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]["properties"]["filter"]["anyOf"][0]["properties"]["queue"] = nullable(
        {"enum": list(job_queues)}  # none: the first queue
    )
    for param in found["paths"]["/api/v1/jobs"]["get"]["parameters"]:
        if param["name"] == "queue":
            param["schema"] = {"enum": list(job_queues)}
    return found


def openapi(request: Request) -> Response:
    Query.of(request)  # takes none
    return JSONResponse(document(web_of(request).config.job_queues))
