"""The API's reads of the store: records, history, recall, scopes, generations, audit."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engram.store import Scope
from engram.store.errors import (
    EmbedderUnavailableError,
    EmbeddingMismatchError,
    InvalidRequestError,
    NotFoundError,
)
from engram.store.limits import DEFAULT_MIN_RELEVANCE, DEFAULT_TOP_K
from engram.store.read.find import MAX_FIND_TEXT_CHARS
from engram.store.read.paging import MAX_PAGE_SIZE
from engram.store.read.recall import check_min_relevance
from engram.store.read.routing import parse_position
from engram.store.values import SCOPE_FIELDS
from engram.store.write.validation import Fields

from ..errors import BadRequestError
from ..params import Query, ident, integer, parse_time
from ..scoped import capable, log_reads, own_scope
from ..state import web_of
from ..views.audit import AUDIT_FILTERS, audit_filter_of
from ..views.find import FIND_BY, find_records
from ..views.records import record_holder
from ..views.scopes import SCOPE_TABS
from .serialize import (
    audit_json,
    findings_json,
    generation_json,
    hit_json,
    page_json,
    record_json,
    revision_json,
    scope_json,
    tombstone_json,
)

RECALL_FIELDS = (
    *("scope", "text", "top_k", "kind", "include_retracted", "recorded_as_of"),
    *("min_relevance", "after"),
)


def record(request: Request) -> Response:
    """``?after=``: a receipt's position; the record as of that commit or later. A record
    id is its scope's: a token's look-up is in its own scope; the operator's in the scope
    its fields name (``?user_id=ada``), else in the one scope holding the id (409
    ``record_ambiguous``, naming them, when several do)."""
    q = Query.of(request, "after", *SCOPE_FIELDS)
    grant = capable(request, "get")
    store = web_of(request).services.store
    record_id = ident(request.path_params["record_id"], "record id")
    unknown = NotFoundError(f"no record {record_id}")
    with store.reads.after(_after(q)):
        holder = record_holder(request, q, record_id)
        item = store.browse.record(holder.id, record_id) if holder is not None else None
        tombstone = (
            store.browse.tombstone(holder.id, record_id)
            if holder is not None and item is None
            else None
        )
    if item is None:
        if tombstone is not None:
            raise NotFoundError(
                f"record {record_id} was forgotten by operation {tombstone.operation_id}"
            )
        raise unknown
    log_reads(request, grant, "get", [(item.record.id, item.record.revision)])
    return JSONResponse(record_json(item))


def _after(q: Query) -> str | None:
    """``?after=``: a receipt's position, or a 400 naming the parameter."""
    value = q.text("after")
    try:
        parse_position(value, "after")
    except InvalidRequestError as exc:
        raise BadRequestError(str(exc)) from None
    return value


def history(request: Request) -> Response:
    """Oldest first, as before paging: a record of up to ``MAX_PAGE_SIZE`` revisions
    still comes whole by default; ``next`` pages on. The scope as for ``record``."""
    q = Query.of(request, "cursor", "limit", "after", *SCOPE_FIELDS)
    grant = capable(request, "history")
    store = web_of(request).services.store
    record_id = ident(request.path_params["record_id"], "record id")
    limit = q.integer("limit", minimum=1, maximum=MAX_PAGE_SIZE) or MAX_PAGE_SIZE
    unknown = NotFoundError(f"no record {record_id}")
    with store.reads.after(_after(q)):
        holder = record_holder(request, q, record_id)
        if holder is None:
            raise unknown
        page = store.browse.history_page(
            holder.id, record_id, cursor=q.cursor(), limit=limit, newest_first=False
        )
    if not page.items and q.cursor() is None:
        raise unknown
    log_reads(request, grant, "history", [(r.id, r.revision) for r in page.items])
    return JSONResponse(
        {
            "record_id": record_id,
            "revisions": [revision_json(r) for r in page.items],
            "next": page.next,
        }
    )


def recall(request: Request, body: Any) -> Response:
    """Recall in one scope. A POST: the query text stays out of URLs and logs."""
    services = web_of(request).services
    grant = capable(request, "recall")
    f = Fields(body, "recall", RECALL_FIELDS)
    given = f.get("scope")
    if grant is None:
        scope = Scope.of(given)
    else:  # its own scope, never the request's; the body may leave it out
        scope = Scope.of(own_scope(grant, Scope.of(given) if given is not None else None))
    top_k = f.integer("top_k", minimum=1, maximum=100)
    include_retracted = f.get("include_retracted")
    if include_retracted is not None and not isinstance(include_retracted, bool):
        raise InvalidRequestError("recall.include_retracted must be true or false")
    as_of = f.get("recorded_as_of")
    if as_of is not None and not isinstance(as_of, str):
        raise InvalidRequestError("recall.recorded_as_of must be an ISO 8601 time")
    after = f.get("after")
    if after is not None and not isinstance(after, str):
        raise InvalidRequestError("recall.after must be a receipt's position")
    arguments: dict[str, Any] = {
        "top_k": top_k or DEFAULT_TOP_K,
        "kind": f.kind(),
        "include_retracted": bool(include_retracted),
        "recorded_as_of": _time(as_of) if as_of is not None else None,
        "after": after,
    }
    text = f.text("text", required=False)
    cutoff = check_min_relevance(f.get("min_relevance"), "recall.min_relevance")
    arguments["min_relevance"] = DEFAULT_MIN_RELEVANCE if cutoff is None else cutoff
    embedder = services.embedder
    try:
        kept = services.store.recall(
            scope, text, embedder=embedder, text_only=embedder is None, **arguments
        )
    except (EmbeddingMismatchError, EmbedderUnavailableError):
        embedder = None  # the dashboard has no embedder for the active generation
        kept = services.store.recall(scope, text, text_only=True, **arguments)
    log_reads(request, grant, "recall", [(h.record.id, h.record.revision) for h in kept])
    return JSONResponse(
        {
            "hits": [hit_json(h, rank) for rank, h in enumerate(kept, 1)],
            "vector_search": embedder is not None,
        }
    )


def scopes(request: Request) -> Response:
    q = Query.of(request, *SCOPE_FIELDS, "exact", "cursor", "limit")
    page = web_of(request).services.store.browse.scopes(
        q.scope_match(), exact=q.flag("exact") or False, cursor=q.cursor(), limit=q.limit()
    )
    return JSONResponse(page_json(page, scope_json))


def scope(request: Request) -> Response:
    Query.of(request)  # takes none
    row = web_of(request).services.store.browse.scope(_scope_id(request))
    if row is None:
        raise NotFoundError(f"no scope {request.path_params['scope_id']}")
    return JSONResponse(scope_json(row))


def scope_records(request: Request) -> Response:
    browse = web_of(request).services.store.browse
    scope_id = _scope_id(request)
    q = Query.of(request, "status", "as_of", "cursor", "limit")
    status = q.choice("status", SCOPE_TABS[:-1], "active")
    as_of = q.time("as_of")
    if browse.scope(scope_id) is None:
        raise NotFoundError(f"no scope {scope_id}")
    if as_of is not None:
        page = browse.records_as_of(scope_id, as_of, cursor=q.cursor(), limit=q.limit())
    else:
        page = browse.records(scope_id, status, cursor=q.cursor(), limit=q.limit())  # type: ignore[arg-type]
    return JSONResponse(page_json(page, record_json))


def scope_tombstones(request: Request) -> Response:
    browse = web_of(request).services.store.browse
    scope_id = _scope_id(request)
    q = Query.of(request, "cursor", "limit")
    if browse.scope(scope_id) is None:
        raise NotFoundError(f"no scope {scope_id}")
    page = browse.tombstones(scope_id, cursor=q.cursor(), limit=q.limit())
    return JSONResponse(page_json(page, tombstone_json))


def generations(request: Request) -> Response:
    q = Query.of(request, "cursor", "limit")
    page = web_of(request).services.store.browse.generations(cursor=q.cursor(), limit=q.limit())
    return JSONResponse(page_json(page, generation_json))


def audit(request: Request) -> Response:
    q = Query.of(request, "cursor", "limit", *AUDIT_FILTERS)
    where = audit_filter_of(q)
    page = web_of(request).services.store.audit.page(
        cursor=q.cursor(), limit=q.limit(), where=where
    )
    return JSONResponse(page_json(page, audit_json))


def _scope_id(request: Request) -> int:
    return integer(request.path_params["scope_id"], "scope id")


def _time(value: str) -> datetime:
    """A time in a body: malformed, it is an invalid request (422), not a malformed URL."""
    try:
        return parse_time(value, "recall.recorded_as_of")
    except BadRequestError as exc:
        raise InvalidRequestError(exc.message) from None


def find(request: Request) -> Response:
    """Records in any scope by their id or its beginning, and by the words of their
    current text (``by``: both, ``id`` or ``text``)."""
    q = Query.of(request, "q", "by")
    query = q.text("q", max_chars=MAX_FIND_TEXT_CHARS)
    if query is None:
        raise BadRequestError("q is required: an id, its beginning, or words of a text")
    found = find_records(request, query, q.choice("by", FIND_BY, "any") or "any")
    return JSONResponse(
        {
            "q": found.query,
            "by_id": findings_json(found.by_id) if found.by_id is not None else None,
            "by_text": findings_json(found.by_text) if found.by_text is not None else None,
        }
    )
