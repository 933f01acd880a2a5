"""The API's writes and the operation log: enqueue an operation (and wait for its
receipt), an operation's state, receipts."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from store import Operation
from store.errors import EngramError, InvalidRequestError, NotFoundError
from store.operations import new_operation_id
from worker import WaitTimeout

from ..params import Query, ident
from ..render import path_quote
from ..state import operator_of, web_of
from ..views.receipts import RECEIPT_FILTERS, operation_state, receipt_filter
from .serialize import page_json, receipt_json

OPERATION_FIELDS = ("operation_id", "kind", "scope", "request")


def enqueue(request: Request, body: Any) -> Response:
    """202 with the operation's id once it is on its stream; with ``?wait=SECONDS``, the
    receipt (200) or the error the operation failed with (its status), or 202 again
    if no worker answered in time (the operation stays queued)."""
    web = web_of(request)
    wait = Query.of(request, "wait").number("wait", minimum=0.0, maximum=web.config.max_wait_s)
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a JSON object: an operation")
    if "requested_by" in body:
        raise InvalidRequestError(
            "requested_by is set by the server: it is the operator the request is made as"
        )
    op = Operation.from_dict(
        {"operation_id": new_operation_id(), **body, "requested_by": operator_of(request).name}
    )
    pending = web.services.producer.enqueue(op)
    accepted = {
        "operation_id": op.operation_id,
        "partition": pending.partition,
        "entry": pending.entry_id,
        "state": "enqueued",
        "status_url": f"/api/v1/operations/{path_quote(op.operation_id)}",
    }
    if not wait:
        return JSONResponse(accepted, status_code=202)
    try:
        replied = pending.wait(wait)
    except WaitTimeout:
        return JSONResponse(accepted, status_code=202)
    item = web.services.store.browse.receipt(op.operation_id)
    if item is None:  # the receipt was pruned meanwhile: say what the worker said
        raise NotFoundError(f"operation {op.operation_id} committed, but its receipt is gone")
    return JSONResponse({**receipt_json(item), "replayed": replied.replayed})


def operation(request: Request) -> Response:
    Query.of(request)  # takes none
    op_id = ident(request.path_params["operation_id"], "operation id")
    state = operation_state(request, op_id)
    return JSONResponse(
        {
            "operation_id": op_id,
            "state": state.state,
            "receipt": receipt_json(state.item) if state.item is not None else None,
            "error": state.error.to_dict() if isinstance(state.error, EngramError) else None,
        }
    )


def receipts(request: Request) -> Response:
    q = Query.of(request, *RECEIPT_FILTERS, "cursor", "limit")
    page = web_of(request).services.store.browse.receipts(
        receipt_filter(q), cursor=q.cursor(), limit=q.limit()
    )
    return JSONResponse(page_json(page, receipt_json))


def receipt(request: Request) -> Response:
    Query.of(request)  # takes none
    op_id = ident(request.path_params["operation_id"], "operation id")
    item = web_of(request).services.store.browse.receipt(op_id)
    if item is None:
        raise NotFoundError(f"no receipt for operation {op_id}")
    return JSONResponse(receipt_json(item))
