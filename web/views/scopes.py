"""Scopes: the list (filtered by any field, as you type), a scope's records by
status, its tombstones, the scope as of a past time, and recall in it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from engram.store import ScopeRow
from engram.store.errors import (
    EmbedderUnavailableError,
    EmbeddingMismatchError,
    InvalidRequestError,
    NotFoundError,
)
from engram.store.limits import DEFAULT_MIN_RELEVANCE, MAX_TEXT_CHARS, MAX_TOP_K
from engram.store.read.recall import above, check_min_relevance
from engram.store.values import SCOPE_FIELDS

from ..errors import BadRequestError
from ..params import Query, checked, integer
from ..state import web_of

SCOPE_TABS = ("active", "retracted", "expired", "all", "forgotten")
RECALL_TOP_K = 10


def scope_list(request: Request) -> Response:
    q = Query.of(request, *SCOPE_FIELDS, "exact", "cursor", "limit")
    match, exact = q.scope_match(), q.flag("exact") or False
    page = web_of(request).services.store.browse.scopes(
        match, exact=exact, cursor=q.cursor(), limit=q.limit()
    )
    return web_of(request).render.page(
        request, "scopes.html", "_scopes.html", page=page, match=match, exact=exact
    )


def scope_page(request: Request) -> Response:
    scope = _scope(request)
    q = Query.of(request, "status", "as_of", "cursor", "limit")
    return _render_scope(request, scope, q)


def _render_scope(request: Request, scope: ScopeRow, q: Query, **extra: Any) -> Response:
    browse = web_of(request).services.store.browse
    status = q.choice("status", SCOPE_TABS, "active")
    as_of: datetime | None = q.time("as_of")
    cursor, limit = q.cursor(), q.limit()
    if as_of is not None:
        page: Any = browse.records_as_of(scope.id, as_of, cursor=cursor, limit=limit)
    elif status == "forgotten":
        page = browse.tombstones(scope.id, cursor=cursor, limit=limit)
    else:
        page = browse.records(scope.id, status, cursor=cursor, limit=limit)  # type: ignore[arg-type]
    context = {"scope": scope, "status": status, "as_of": as_of, "page": page, "recall": None}
    context.update(extra)
    return web_of(request).render.page(request, "scope.html", "_records.html", **context)


def recall(request: Request, form: dict[str, str]) -> Response:
    """Recall in a scope (a POST: the search text stays out of URLs and access logs)."""
    web = web_of(request)
    scope = _scope(request)
    text = checked(form.get("text", ""), "the recall text", max_chars=MAX_TEXT_CHARS)
    top_k = integer(form.get("top_k") or str(RECALL_TOP_K), "top_k", maximum=MAX_TOP_K)
    cutoff = min_relevance(form.get("min_relevance", ""))
    store, note = web.services.store, None
    # Every hit of the top_k, so the page can say how many the cut-off leaves out.
    try:
        embedder = web.services.embedder
        hits = store.recall(
            scope.scope,
            text,
            embedder=embedder,
            text_only=embedder is None,
            top_k=top_k,
            min_relevance=None,
        )
        if embedder is None:
            note = "by text only: the dashboard runs without an embedder"
    except (EmbeddingMismatchError, EmbedderUnavailableError):
        hits = store.recall(scope.scope, text, text_only=True, top_k=top_k, min_relevance=None)
        note = "by text only: the dashboard has no embedder for the active generation"
    kept = above(hits, cutoff)
    result = {
        "hits": kept,
        "cut": len(hits) - len(kept),
        "note": note,
        "text": text,
        "top_k": top_k,
        "min_relevance": cutoff,
        "default_min_relevance": DEFAULT_MIN_RELEVANCE,
    }
    if request.headers.get("hx-request") == "true":
        return web.render.page(request, "_recall.html", recall=result, scope=scope)
    return _render_scope(request, scope, Query(request.query_params, ()), recall=result)


def min_relevance(value: str) -> float:
    """The recall form's cut-off: empty for recall's default, else a number from 0 to 1."""
    if value.strip() == "":
        return DEFAULT_MIN_RELEVANCE
    try:
        cutoff = check_min_relevance(float(value), "the cut-off")
        assert cutoff is not None
        return cutoff
    except ValueError:
        raise BadRequestError("the cut-off must be a number from 0 to 1") from None
    except InvalidRequestError as exc:
        raise BadRequestError(exc.message) from None


def _scope(request: Request) -> ScopeRow:
    scope_id = integer(request.path_params["scope_id"], "scope id")
    found = web_of(request).services.store.browse.scope(scope_id)
    if found is None:
        raise NotFoundError(f"no scope {scope_id}")
    return found
