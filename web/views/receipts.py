"""Receipts: the operation log with filters, a receipt, and an operation's progress
from enqueued to committed (and, for a forget, its redaction), polled until done."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from engram.store import ReceiptFilter, ReceiptItem
from engram.store.audit import AuditEntry
from engram.store.errors import EngramError, NotFoundError
from engram.store.values import SCOPE_FIELDS
from engram.store.write.operations import OPERATION_KINDS
from engram.worker import layout

from ..backlog import Backlog, find
from ..params import Query, ident
from ..state import web_of

RECEIPT_FILTERS = (
    "scope",
    *SCOPE_FIELDS,
    "record",
    "record_prefix",
    "kind",
    "replayed",
    "redacted",
    "refused",
    "requested_by",
    "requested_by_prefix",
    "since",
    "until",
)


def receipt_filter(q: Query) -> ReceiptFilter:
    refused = q.choice("refused", ("only", "exclude"))
    return ReceiptFilter(
        scope_id=q.integer("scope"),
        scope=q.scope_match(),
        record_id=q.text("record"),
        record_prefix=q.text("record_prefix"),
        kind=q.choice("kind", OPERATION_KINDS),
        replayed=q.flag("replayed"),
        redacted=q.flag("redacted"),
        refused=None if refused is None else refused == "only",
        requested_by=q.text("requested_by"),
        requested_by_prefix=q.text("requested_by_prefix"),
        since=q.time("since"),
        until=q.time("until"),
    )


def receipt_list(request: Request) -> Response:
    q = Query.of(request, *RECEIPT_FILTERS, "cursor", "limit")
    where = receipt_filter(q)
    page = web_of(request).services.store.browse.receipts(where, cursor=q.cursor(), limit=q.limit())
    filters = {name: request.query_params.get(name, "") for name in RECEIPT_FILTERS}
    return web_of(request).render.page(
        request,
        "receipts.html",
        "_receipts.html",
        page=page,
        filters=filters,
        kinds=OPERATION_KINDS,
        scope_fields=SCOPE_FIELDS,
    )


def receipt_page(request: Request) -> Response:
    Query.of(request)  # takes none
    op_id = ident(request.path_params["operation_id"], "operation id")
    item = web_of(request).services.store.browse.receipt(op_id)
    if item is None:
        raise NotFoundError(f"no receipt for operation {op_id} (maybe lost to a restore)")
    return web_of(request).render.page(request, "receipt.html", item=item, receipt=item.receipt)


@dataclass(frozen=True, slots=True)
class OperationState:
    operation_id: str
    state: str  # waiting | committed | refused | failed
    item: ReceiptItem | None
    error: EngramError | None
    # Waiting again: an earlier delivery failed (this error), and the operation was
    # enqueued again (a dead letter retried) since.
    earlier: EngramError | None = None
    # Failed, and its dead letter discarded since (the audit row: who, when, why).
    discarded: AuditEntry | None = None

    @property
    def done(self) -> bool:
        """Nothing more will change: poll no longer (a pending redaction still will)."""
        if self.state == "waiting":
            return False
        return self.item is None or self.item.receipt.redaction != "pending"


def operation_state(request: Request, op_id: str) -> OperationState:
    """``NotFoundError`` for an id with no receipt, no reply and no entry in the
    backlog: one never sent (or mistyped) would otherwise wait forever.

    A failure is final for one delivery, not for the operation: while the operation is
    in the backlog again (its dead letter retried), it is waiting, and the page goes on
    following it."""
    known = _settled_state(request, op_id)
    if known is not None and known.state != "failed":
        return known
    backlog = _backlog(request, op_id)
    if backlog is Backlog.FOUND:
        return OperationState(op_id, "waiting", None, None, earlier=known.error if known else None)
    # It may have committed (its entry deleted) while the streams were read.
    again = _settled_state(request, op_id)
    if again is not None:
        return again
    if backlog is Backlog.ABSENT:
        raise unknown_operation(op_id)
    return OperationState(op_id, "waiting", None, None)


def _backlog(request: Request, op_id: str) -> Backlog:
    producer = web_of(request).services.producer
    return find(producer.client, op_id, layout.live_streams(producer.client, producer.partitions))


def unknown_operation(op_id: str) -> NotFoundError:
    return NotFoundError(
        f"no operation {op_id}: no receipt, no reply, not queued"
        " (never sent, or maybe lost to a restore)"
    )


def _settled_state(request: Request, op_id: str) -> OperationState | None:
    services = web_of(request).services
    item = services.store.browse.receipt(op_id)
    if item is not None:
        refused = item.receipt.error is not None
        return OperationState(op_id, "refused" if refused else "committed", item, None)
    # Not in the store: the reply says if it was dead-lettered.
    reply = services.producer.results([op_id]).get(op_id)
    if isinstance(reply, EngramError):
        last = services.store.audit.last_letter_action(op_id)
        discarded = last if last is not None and last.action == "dead_letter.discard" else None
        return OperationState(op_id, "failed", None, reply, discarded=discarded)
    if reply is not None:  # committed, its receipt not (or no longer) readable: as before
        return OperationState(op_id, "waiting", None, None)
    return None


def operation_page(request: Request) -> Response:
    Query.of(request)  # takes none
    op_id = ident(request.path_params["operation_id"], "operation id")
    return web_of(request).render.page(
        request, "operation.html", "_operation.html", op=operation_state(request, op_id)
    )
