"""Receipts: the operation log with filters, a receipt, and an operation's progress
from enqueued to committed (and, for a forget, its redaction), polled until done."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from engram.store import ReceiptFilter, ReceiptItem, Scope
from engram.store.audit import AuditEntry
from engram.store.errors import (
    EngramError,
    NotFoundError,
    OperationAmbiguousError,
    unknown_operation,
)
from engram.store.rows import scope_from_key
from engram.store.values import SCOPE_FIELDS
from engram.store.write.operations import OPERATION_KINDS
from engram.worker import keys, layout

from ..auth import grant_of
from ..backlog import Backlog, find, scopes_holding
from ..params import Query, ident
from ..scoped import own_scope
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


def asked_scope(request: Request, q: Query) -> Scope | None:
    """The scope an operation id is looked up in (an operation id identifies an operation
    within its scope): a token's own, whatever is asked (another is 404, as for an id
    never used); the operator's, given by its fields (``?user_id=ada``), or None: then
    every scope is looked in (``OperationAmbiguousError`` when several hold the id)."""
    given = q.scope_match()
    scope = Scope.of(given) if given else None
    grant = grant_of(request)
    if grant is not None:
        return Scope.of(own_scope(grant, scope))
    return scope


def receipt_page(request: Request) -> Response:
    q = Query.of(request, *SCOPE_FIELDS)
    op_id = ident(request.path_params["operation_id"], "operation id")
    item = web_of(request).services.store.browse.receipt(op_id, asked_scope(request, q))
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
    scope: Scope | None = None  # whose operation it is, when known
    # Failed, and its dead letter discarded since (the audit row: who, when, why).
    discarded: AuditEntry | None = None

    @property
    def scope_query(self) -> str:
        """The scope as the query of this operation's links (``?user_id=ada``), or ''."""
        return "?" + urlencode(self.scope.as_dict()) if self.scope is not None else ""

    @property
    def done(self) -> bool:
        """Nothing more will change: poll no longer (a pending redaction still will)."""
        if self.state == "waiting":
            return False
        return self.item is None or self.item.receipt.redaction != "pending"


def operation_state(request: Request, op_id: str, scope: Scope | None) -> OperationState:
    """``NotFoundError`` for an id with no receipt, no reply and no entry in the
    backlog (of ``scope``): one never sent (or mistyped) would otherwise wait forever.
    Without a scope (the operator's look-up), the scope is the one whose receipt holds
    the id (``OperationAmbiguousError`` when several do).

    A failure is final for one delivery, not for the operation: while the operation is
    in the backlog again (its dead letter retried), it is waiting, and the page goes on
    following it."""
    if scope is None:
        scope = _scope_of(request, op_id)
    known = _settled_state(request, op_id, scope)
    if known is not None and known.state != "failed":
        return known
    backlog = _backlog(request, op_id, scope)
    if backlog is Backlog.FOUND:
        earlier = known.error if known else None
        return OperationState(op_id, "waiting", None, None, earlier=earlier, scope=scope)
    # It may have committed (its entry deleted) while the streams were read.
    again = _settled_state(request, op_id, scope)
    if again is not None:
        return again
    if backlog is Backlog.ABSENT:
        raise unknown_operation(op_id)
    return OperationState(op_id, "waiting", None, None, scope=scope)


def _scope_of(request: Request, op_id: str) -> Scope | None:
    """The operator's look-up without a scope: the scope whose receipt holds the id, else
    the scope of its entries still in the backlog or the dead letters (a failed delivery's
    reply is found by its scope), else the scope its retried or discarded letters' audit
    rows name; ``OperationAmbiguousError`` when several hold it."""
    services = web_of(request).services
    item = services.store.browse.receipt(op_id)
    if item is not None:
        return item.receipt.scope
    producer = services.producer
    streams = [*layout.live_streams(producer.client, producer.partitions), keys.DEAD_LETTERS]
    held = scopes_holding(producer.client, op_id, streams)
    found = sorted(held or services.store.audit.letter_scopes(op_id))
    if len(found) > 1:
        raise OperationAmbiguousError(
            f"operation {op_id} is in {len(found)} scopes: name its scope",
            scopes=[scope_from_key(k).as_dict() for k in found],
        )
    return scope_from_key(found[0]) if found else None


def _backlog(request: Request, op_id: str, scope: Scope | None) -> Backlog:
    producer = web_of(request).services.producer
    return find(
        producer.client,
        op_id,
        layout.live_streams(producer.client, producer.partitions),
        scope_key=scope.key if scope is not None else None,
    )


def _settled_state(request: Request, op_id: str, scope: Scope | None) -> OperationState | None:
    if scope is None:  # no receipt in any scope; a reply is found by its scope
        return None
    services = web_of(request).services
    item = services.store.browse.receipt(op_id, scope)
    if item is not None:
        refused = item.receipt.error is not None
        state = "refused" if refused else "committed"
        return OperationState(op_id, state, item, None, scope=scope)
    # Not in the store: the reply says if it was dead-lettered.
    reply = services.producer.results(scope, [op_id]).get(op_id)
    if isinstance(reply, EngramError):
        last = services.store.audit.last_letter_action(op_id, scope.key)
        discarded = last if last is not None and last.action == "dead_letter.discard" else None
        return OperationState(op_id, "failed", None, reply, scope=scope, discarded=discarded)
    if reply is None:
        return None
    # Committed, its receipt not (yet) readable (a replica behind): waiting. Unless it
    # committed before the database was restored: then the restore lost it, and the
    # reply valkey still caches is not the truth, the database is (as MCP's answers).
    if services.store.lost_to_restore(reply):
        return None
    return OperationState(op_id, "waiting", None, None, scope=scope)


def operation_page(request: Request) -> Response:
    q = Query.of(request, *SCOPE_FIELDS)
    op_id = ident(request.path_params["operation_id"], "operation id")
    op = operation_state(request, op_id, asked_scope(request, q))
    return web_of(request).render.page(request, "operation.html", "_operation.html", op=op)
