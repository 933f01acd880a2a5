"""Scoped access tokens for the operator: the list, creating one (its secret shown
once, on the answer to the form), its page (what it read), revoking it. A create
or a revoke writes its audit row under the operator signed in (store.tokens)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from engram.jobs.settings import parse_duration
from engram.store.errors import EngramError, InvalidRequestError, NotFoundError
from engram.store.tokens import CAPABILITIES, check_capabilities, check_name
from engram.store.values import Scope

from ..bodies import why_of
from ..errors import BadRequestError
from ..params import Query
from ..render import path_quote
from ..state import operator_of, web_of

READS_SHOWN = 100
T = TypeVar("T")


def token_list(request: Request) -> Response:
    Query.of(request)  # takes none
    return _list_page(request)


def _list_page(
    request: Request,
    *,
    created: str | None = None,
    secret: str | None = None,
    status_code: int = 200,
    typed: Mapping[str, str] | None = None,
    refused: Refused | None = None,
) -> Response:
    """The tokens and the form: empty, or as ``typed`` with the refusal beside the field
    it is about."""
    web = web_of(request)
    return web.render.page(
        request,
        "tokens.html",
        status_code=status_code,
        tokens=web.services.store.tokens.list(),
        capabilities=CAPABILITIES,
        created=created,
        secret=secret,
        typed=typed or {},
        ticked={c for c in CAPABILITIES if typed is None or typed.get(f"can_{c}")},
        refused=refused,
    )


class Refused(Exception):
    """A create refused: the form field it is about (name, scope, expires, can or why),
    and the error."""

    def __init__(self, field: str, error: EngramError) -> None:
        super().__init__(field)
        self.field, self.error = field, error


def create(request: Request, form: dict[str, str]) -> Response:
    """The answer shows the secret, this once: it is not kept (only its hash is).
    Refused (a taken name, a scope that is not JSON, a bad expiry...), the page again
    with the form as typed and the error beside its field; nothing is created."""
    try:
        name, secret = _create(request, form)
    except Refused as refused:
        typed = {k: v for k, v in form.items() if k != "csrf"}
        return _list_page(request, status_code=refused.error.status, typed=typed, refused=refused)
    response = _list_page(request, created=name, secret=secret)
    response.status_code = 201
    return response


def _field(name: str, read: Callable[[], T]) -> T:
    """``read()``, its refusal named as this field's."""
    try:
        return read()
    except EngramError as exc:
        raise Refused(name, exc) from None


def _create(request: Request, form: Mapping[str, str]) -> tuple[str, str]:
    name = _field("name", lambda: check_name(form.get("name", "").strip()))
    scope = _field("scope", lambda: _scope(form.get("scope", "")))
    can = [c for c in CAPABILITIES if form.get(f"can_{c}")]
    _field("can", lambda: check_capabilities(can))
    expires_in_s = _field(
        "expires", lambda: parse_duration(form.get("expires") or "off", "expires")
    )
    why = _field("why", lambda: why_of(form.get("why")))
    tokens = web_of(request).services.store.tokens
    by = operator_of(request).name
    secret, _ = _field(
        "name", lambda: tokens.create(name, scope.as_dict(), can, expires_in_s, by=by, why=why)
    )
    return name, secret


def _scope(text: str) -> Scope:
    try:
        found = json.loads(text)
    except ValueError:
        raise InvalidRequestError(
            'the scope is a JSON object, such as {"user_id": "ada"}'
        ) from None
    if not isinstance(found, dict):
        raise InvalidRequestError('the scope is a JSON object, such as {"user_id": "ada"}')
    return Scope.of(found)


def token_page(request: Request) -> Response:
    Query.of(request)  # takes none
    web = web_of(request)
    name = _name(request)
    token = web.services.store.tokens.get(name)
    if token is None:
        raise NotFoundError(f"no token {name}")
    return web.render.page(
        request,
        "token.html",
        token=token,
        reads=web.services.store.tokens.reads_by_token(name, READS_SHOWN),
        audit=web.services.store.audit.about(f"token:{name}"),
        # /tokens/NAME/revoke is the confirmation: a revoke asks first, with a why.
        confirm_revoke=request.url.path.endswith("/revoke"),
    )


def _name(request: Request) -> str:
    """A token's name from the path: malformed, the URL is (400)."""
    try:
        return check_name(request.path_params["name"])
    except InvalidRequestError as exc:
        raise BadRequestError(exc.message) from None


def revoke(request: Request, form: dict[str, str]) -> Response:
    name = _name(request)
    tokens = web_of(request).services.store.tokens
    if tokens.get(name) is None:
        raise NotFoundError(f"no token {name}")
    why = why_of(form.get("why"))
    tokens.revoke(name, by=operator_of(request).name, why=why)  # revoked already: nothing to do
    return RedirectResponse(f"/tokens/{path_quote(name)}", status_code=303)
