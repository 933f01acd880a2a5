"""A record: its current state, every revision with what changed, its links both
ways, the receipts that touched it; forgetting it, after a confirmation."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from engram.store import ReceiptFilter, Scope
from engram.store.errors import NotFoundError
from engram.store.read.listed import ScopeRow
from engram.store.values import SCOPE_FIELDS

from ..bodies import why_of
from ..diff import history_diffs
from ..params import Query, ident
from ..render import path_quote
from ..state import actor_of, operator_of, web_of
from .receipts import asked_scope

RECEIPTS_SHOWN = 20
HISTORY_SHOWN = 20  # revisions on a page of a record's history


def record_holder(request: Request, q: Query, record_id: str) -> ScopeRow | None:
    """The scope a record id is looked up in (a record id identifies a record within its
    scope): a token's own, whatever is asked (another is 404, as for an id never used);
    the operator's, given by its fields (``?user_id=ada``); else the one scope that holds
    the id, live or forgotten (``RecordAmbiguousError``, naming them, when several do).
    None: no such scope, or none holds the id."""
    store = web_of(request).services.store
    scope = asked_scope(request, q)
    if scope is None:
        return store.browse.holder(record_id)
    scope_id = store.scope_id(scope)
    return store.browse.scope(scope_id) if scope_id is not None else None


def record_page(request: Request) -> Response:
    q = Query.of(request, "cursor", *SCOPE_FIELDS)
    web = web_of(request)
    browse = web.services.store.browse
    record_id = ident(request.path_params["record_id"], "record id")
    holder = record_holder(request, q, record_id)
    if holder is None:
        raise NotFoundError(f"no record {record_id}")
    item = browse.record(holder.id, record_id)
    receipts = browse.receipts(
        ReceiptFilter(scope_id=holder.id, record_id=record_id), limit=RECEIPTS_SHOWN
    )
    readers = web.services.store.tokens.reads_of_record(holder.scope, record_id)
    if item is None:
        tombstone = browse.tombstone(holder.id, record_id)
        if tombstone is None:
            raise NotFoundError(f"no record {record_id}")
        return web.render.page(
            request,
            "forgotten.html",
            tombstone=tombstone,
            scope=holder,
            receipts=receipts,
            asked=[
                e
                for e in web.services.store.audit.about(record_id)
                if e.detail.get("scope_id", holder.id) == holder.id
            ],
            readers=readers,
        )
    # A page of the history, newest first; the revision past it is what its last one
    # changed from. Each diff is bounded (web.diff), so the page is too.
    history = browse.history_page(holder.id, record_id, cursor=q.cursor(), limit=HISTORY_SHOWN)
    diffs = {d.after: d for d in history_diffs([*history.items, *filter(None, [history.past])])}
    return web.render.page(
        request,
        "record.html",
        item=item,
        record=item.record,
        scope=holder,
        history=history.items,
        history_next=history.next,
        history_paged=q.cursor() is not None,
        revisions=browse.revision_count(holder.id, record_id),
        diffs=diffs,
        asked_by={
            op_id: receipt
            for (_, op_id), receipt in browse.asked_by(
                [(item.record.scope.key, r.operation_id) for r in history.items]
            ).items()
        },
        backlinks=browse.linked_from(record_id, item.scope_id),
        receipts=receipts,
        readers=readers,
    )


def forget_confirm(request: Request) -> Response:
    """The confirmation step: what forgetting this record will do."""
    q = Query.of(request, *SCOPE_FIELDS)
    web = web_of(request)
    browse = web.services.store.browse
    record_id = ident(request.path_params["record_id"], "record id")
    holder = record_holder(request, q, record_id)
    item = browse.record(holder.id, record_id) if holder is not None else None
    if holder is None or item is None:
        raise NotFoundError(f"no record {record_id} to forget")
    return web.render.page(
        request,
        "forget.html",
        item=item,
        record=item.record,
        scope=holder,
        revisions=browse.revision_count(holder.id, record_id),
    )


def forget(request: Request, form: dict[str, str]) -> Response:
    """Enqueue the forget through the streams, then show its progress."""
    q = Query.of(request, *SCOPE_FIELDS)
    web = web_of(request)
    record_id = ident(request.path_params["record_id"], "record id")
    # A record, or a tombstone (forgetting again runs the redaction listeners again).
    holder = record_holder(request, q, record_id)
    if holder is None:
        raise NotFoundError(f"no record {record_id} to forget")
    scope = holder.scope
    pending = web.services.producer.forget(
        scope,
        record_id,
        operation_id=f"dashboard:forget:{uuid.uuid4().hex}",
        requested_by=operator_of(request).name,
    )
    audit_forget(request, record_id, pending.operation_id, why_of(form.get("why")), scope)
    return RedirectResponse(
        f"/operations/{path_quote(pending.operation_id)}?{urlencode(scope.as_dict())}",
        status_code=303,
    )


def audit_forget(
    request: Request, record_id: str, operation_id: str, why: str | None, scope: Scope
) -> None:
    """A forget sent from the dashboard or the API: who asked, and why, in the audit
    trail (the receipt says who too; the why has no other home). Only for a record (or
    a tombstone) of the forget's scope: a forget of an id the scope does not hold is a
    no-op, and writes nothing that names another scope's record (issue 36)."""
    store = web_of(request).services.store
    scope_id = store.scope_id(scope)
    if scope_id is None:
        return
    held = store.get(scope, record_id, include_expired=True) is not None
    if not held and store.browse.tombstone(scope_id, record_id) is None:
        return
    # The scope: the same id in another scope is another record (its page shows its own).
    detail: dict[str, Any] = {"operation_id": operation_id, "scope_id": scope_id}
    if why is not None:
        detail["reason"] = why
    web_of(request).services.store.audit.record(
        actor_of(request), "record.forget", record_id, detail
    )
