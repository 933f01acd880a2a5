"""The API's writes and the operation log: enqueue an operation (and wait for its
receipt), an operation's state, receipts."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engram.store import Operation, Scope
from engram.store.errors import EngramError, InvalidRequestError, NotFoundError
from engram.store.values import SCOPE_FIELDS
from engram.store.write.operations import OPERATION_KINDS, Forget, new_operation_id
from engram.worker import Pending

from ..auth import grant_of
from ..bodies import read_json, why_of
from ..params import Query, ident
from ..render import path_quote
from ..scoped import capable, own_scope
from ..state import actor_of, web_of
from ..views.receipts import RECEIPT_FILTERS, asked_scope, operation_state, receipt_filter
from ..views.records import audit_forget
from .serialize import page_json, receipt_json

OPERATION_FIELDS = ("operation_id", "kind", "scope", "request")


async def enqueue(request: Request) -> Response:
    """202 with the operation's id once it is on its stream; with ``?wait=SECONDS``, the
    receipt (200) or the error the operation failed with (its status), or 202 again
    if no worker answered in time (the operation stays queued).

    The wait holds no thread: it sleeps on the event loop between checks that each
    borrow a thread for one non-blocking read, so waiting requests cannot starve the
    thread pool every other request (``/healthz`` included) runs on."""
    web = web_of(request)
    body = await read_json(request, web.config.max_json_bytes)
    wait, pending, accepted = await run_in_threadpool(_enqueue, request, body)
    if not wait:
        return JSONResponse(accepted, status_code=202)
    replied = await pending.replied(wait)
    if replied is None:
        return JSONResponse(accepted, status_code=202)
    item = await run_in_threadpool(
        web.services.store.browse.receipt, pending.operation_id, pending.scope
    )
    if item is None:  # the receipt was pruned meanwhile: say what the worker said
        raise NotFoundError(f"operation {pending.operation_id} committed, but its receipt is gone")
    # The commit position (with a read replica): a read passing it as ``after`` sees this.
    position = {"position": replied.position} if replied.position else {}
    return JSONResponse({**receipt_json(item), "replayed": replied.replayed, **position})


def _enqueue(request: Request, body: Any) -> tuple[float | None, Pending, dict[str, Any]]:
    web = web_of(request)
    wait = Query.of(request, "wait").number("wait", minimum=0.0, maximum=web.config.max_wait_s)
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a JSON object: an operation")
    if "requested_by" in body:
        raise InvalidRequestError(
            "requested_by is set by the server: it is the operator the request is made as"
        )
    body = dict(body)
    why = why_of(body.pop("reason", None))
    if why is not None and body.get("kind") != "forget":
        raise InvalidRequestError("reason goes with a forget only (kept in the audit trail)")
    grant = grant_of(request)
    if grant is not None:  # its own scope, whatever the body says; only what it may do
        kind = body.get("kind")
        if isinstance(kind, str) and kind in OPERATION_KINDS:
            capable(request, kind)
        body["scope"] = own_scope(grant, _scope_given(body))
    op = Operation.from_dict(
        {"operation_id": new_operation_id(), **body, "requested_by": actor_of(request)}
    )
    if grant is not None:  # before it is on a stream: its receipt will say who, verified
        web.services.store.tokens.vouch(grant, op.operation_id)
    pending = web.services.producer.enqueue(op)
    if isinstance(op.request, Forget):
        audit_forget(request, op.request.id, op.operation_id, why, op.scope)
    accepted = {
        "operation_id": op.operation_id,
        "partition": pending.partition,
        "entry": pending.entry_id,
        "state": "enqueued",
        # An operation id is its scope's: the operator's look-up names it.
        "status_url": f"/api/v1/operations/{path_quote(op.operation_id)}"
        + ("" if grant is not None else f"?{urlencode(op.scope.as_dict())}"),
    }
    return wait, pending, accepted


def _scope_given(body: dict[str, Any]) -> Any:
    """The body's scope, if any: a token's request may leave it out, or repeat its own."""
    given = body.get("scope")
    if given is None or isinstance(given, Scope):
        return given
    if not isinstance(given, dict):
        raise InvalidRequestError("operation.scope must be an object")
    return Scope.of(given)


def operation(request: Request) -> Response:
    """An operation of the asker's scope: a token's own (an id used only in another scope
    is 404, as one never used); the operator's, named by its fields or, left out, the
    one scope that holds the id (409 ``operation_ambiguous``, naming them, if several)."""
    q = Query.of(request, *SCOPE_FIELDS)
    op_id = ident(request.path_params["operation_id"], "operation id")
    capable(request, "operation")
    state = operation_state(request, op_id, asked_scope(request, q))
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
    """As ``operation``: the receipt of an operation of the asker's scope."""
    q = Query.of(request, *SCOPE_FIELDS)
    op_id = ident(request.path_params["operation_id"], "operation id")
    capable(request, "operation")
    item = web_of(request).services.store.browse.receipt(op_id, asked_scope(request, q))
    if item is None:
        raise NotFoundError(f"no receipt for operation {op_id} (maybe lost to a restore)")
    return JSONResponse(receipt_json(item))
