"""The audit trail: who retried, discarded, started or forgot what, and when."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from store import ReceiptFilter

from ..params import Query
from ..state import web_of


def audit_page(request: Request) -> Response:
    q = Query.of(request, "cursor", "limit")
    store = web_of(request).services.store
    page = store.audit.page(cursor=q.cursor(), limit=q.limit())
    # Forgets record who asked on their receipts: the latest are shown alongside.
    forgets = store.browse.receipts(ReceiptFilter(kind="forget"), limit=20).items
    return web_of(request).render.page(
        request, "audit.html", "_audit.html", page=page, forgets=forgets
    )
