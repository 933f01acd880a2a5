"""The audit trail: who retried, discarded, started, paused or forgot what, and when;
filtered by action, who, target and a span of time (the page and ``/api/v1/audit``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from engram.store import ReceiptFilter
from engram.store.audit import ACTIONS, AuditFilter
from engram.store.errors import InvalidRequestError

from ..errors import BadRequestError
from ..params import Query
from ..state import web_of

AUDIT_FILTERS = ("action", "by", "target", "since", "until")


def audit_filter_of(q: Query) -> AuditFilter:
    """The filter in the query: ``action`` (one of ``ACTIONS``), ``by`` (who asked,
    exactly), ``target`` (exactly), ``since`` (at or after) and ``until`` (before), ISO
    8601 times (UTC without a zone)."""
    try:
        return AuditFilter(
            action=q.choice("action", ACTIONS),
            requested_by=q.text("by"),
            target=q.text("target"),
            since=q.time("since"),
            until=q.time("until"),
        )
    except InvalidRequestError as exc:
        raise BadRequestError(exc.message) from None


def form_values(q: Query) -> dict[str, str]:
    """The filter as the page's form shows it back."""
    return {name: str(q.params.get(name) or "") for name in AUDIT_FILTERS}


def audit_page(request: Request) -> Response:
    q = Query.of(request, "cursor", "limit", *AUDIT_FILTERS)
    where = audit_filter_of(q)
    store = web_of(request).services.store
    page = store.audit.page(cursor=q.cursor(), limit=q.limit(), where=where)
    # Forgets record who asked on their receipts: the latest are shown alongside.
    forgets = store.browse.receipts(ReceiptFilter(kind="forget"), limit=20).items
    return web_of(request).render.page(
        request,
        "audit.html",
        "_audit.html",
        page=page,
        forgets=forgets,
        actions=ACTIONS,
        audit_filter=form_values(q),
        filtered=where != AuditFilter(),
    )
