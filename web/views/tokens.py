"""Scoped access tokens for the operator: the list, creating one (its secret shown
once, on the answer to the form), its page (what it read), revoking it. A create
or a revoke writes its audit row under the operator signed in (store.tokens)."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from engram.jobs.settings import parse_duration
from engram.store.errors import InvalidRequestError, NotFoundError
from engram.store.tokens import CAPABILITIES, check_name

from ..bodies import why_of
from ..errors import BadRequestError
from ..params import Query
from ..render import path_quote
from ..state import operator_of, web_of

READS_SHOWN = 100


def token_list(request: Request) -> Response:
    Query.of(request)  # takes none
    return _list_page(request)


def _list_page(
    request: Request, *, created: str | None = None, secret: str | None = None
) -> Response:
    web = web_of(request)
    return web.render.page(
        request,
        "tokens.html",
        tokens=web.services.store.tokens.list(),
        capabilities=CAPABILITIES,
        created=created,
        secret=secret,
    )


def create(request: Request, form: dict[str, str]) -> Response:
    """The answer shows the secret, this once: it is not kept (only its hash is)."""
    name = check_name(form.get("name", "").strip())
    try:
        scope = json.loads(form.get("scope", ""))
    except ValueError:
        raise InvalidRequestError(
            'the scope is a JSON object, such as {"user_id": "ada"}'
        ) from None
    can = [c for c in CAPABILITIES if form.get(f"can_{c}")]
    expires_in_s = parse_duration(form.get("expires") or "off", "expires")
    why = why_of(form.get("why"))
    secret, _ = web_of(request).services.store.tokens.create(
        name, scope, can, expires_in_s, by=operator_of(request).name, why=why
    )
    response = _list_page(request, created=name, secret=secret)
    response.status_code = 201
    return response


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
