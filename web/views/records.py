"""A record: its current state, every revision with what changed, its links both
ways, the receipts that touched it; forgetting it, after a confirmation."""

from __future__ import annotations

import uuid
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from engram.store import ReceiptFilter, Scope
from engram.store.errors import NotFoundError

from ..bodies import why_of
from ..diff import history_diffs
from ..params import Query, ident
from ..render import path_quote
from ..state import actor_of, operator_of, web_of

RECEIPTS_SHOWN = 20
HISTORY_SHOWN = 20  # revisions on a page of a record's history


def record_page(request: Request) -> Response:
    q = Query.of(request, "cursor")
    web = web_of(request)
    browse = web.services.store.browse
    record_id = ident(request.path_params["record_id"], "record id")
    item = browse.record(record_id)
    receipts = browse.receipts(ReceiptFilter(record_id=record_id), limit=RECEIPTS_SHOWN)
    if item is None:
        tombstone = browse.tombstone(record_id)
        if tombstone is None:
            raise NotFoundError(f"no record {record_id}")
        return web.render.page(
            request,
            "forgotten.html",
            tombstone=tombstone,
            scope=browse.scope(tombstone.scope_id),
            receipts=receipts,
            asked=web.services.store.audit.about(record_id),
            readers=web.services.store.tokens.reads_of_record(record_id),
        )
    # A page of the history, newest first; the revision past it is what its last one
    # changed from. Each diff is bounded (web.diff), so the page is too.
    history = browse.history_page(record_id, cursor=q.cursor(), limit=HISTORY_SHOWN)
    diffs = {d.after: d for d in history_diffs([*history.items, *filter(None, [history.past])])}
    return web.render.page(
        request,
        "record.html",
        item=item,
        record=item.record,
        scope=browse.scope(item.scope_id),
        history=history.items,
        history_next=history.next,
        history_paged=q.cursor() is not None,
        revisions=browse.revision_count(record_id),
        diffs=diffs,
        asked_by={
            op_id: receipt
            for (_, op_id), receipt in browse.asked_by(
                [(item.record.scope.key, r.operation_id) for r in history.items]
            ).items()
        },
        backlinks=browse.linked_from(record_id, item.scope_id),
        receipts=receipts,
        readers=web.services.store.tokens.reads_of_record(record_id),
    )


def forget_confirm(request: Request) -> Response:
    """The confirmation step: what forgetting this record will do."""
    Query.of(request)  # takes none
    web = web_of(request)
    browse = web.services.store.browse
    record_id = ident(request.path_params["record_id"], "record id")
    item = browse.record(record_id)
    if item is None:
        raise NotFoundError(f"no record {record_id} to forget")
    return web.render.page(
        request,
        "forget.html",
        item=item,
        record=item.record,
        scope=browse.scope(item.scope_id),
        revisions=browse.revision_count(record_id),
    )


def forget(request: Request, form: dict[str, str]) -> Response:
    """Enqueue the forget through the streams, then show its progress."""
    web = web_of(request)
    browse = web.services.store.browse
    record_id = ident(request.path_params["record_id"], "record id")
    item = browse.record(record_id)
    tombstone = browse.tombstone(record_id) if item is None else None
    if item is not None:
        scope = item.record.scope
    elif tombstone is not None:  # forgetting again runs the redaction listeners again
        row = browse.scope(tombstone.scope_id)
        if row is None:
            raise NotFoundError(f"no record {record_id} to forget")
        scope = row.scope
    else:
        raise NotFoundError(f"no record {record_id} to forget")
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
    if store.get(scope, record_id, include_expired=True) is None:
        tombstone = store.browse.tombstone(record_id)
        if tombstone is None or tombstone.scope_id != store.scope_id(scope):
            return
    detail = {"operation_id": operation_id}
    if why is not None:
        detail["reason"] = why
    web_of(request).services.store.audit.record(
        actor_of(request), "record.forget", record_id, detail
    )
