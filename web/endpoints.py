"""Endpoints that take a body: read it (capped, typed, a form's CSRF token checked)
on the event loop, then run the view, which does blocking I/O, on a thread."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from engram.store.errors import InvalidRequestError

from .bodies import read_form, read_json
from .csrf import CSRF_FIELD
from .state import web_of

Endpoint = Callable[[Request], Awaitable[Response]]


def form_endpoint(view: Callable[[Request, dict[str, str]], Response]) -> Endpoint:
    """A view of a form that changes something: nothing runs without a good CSRF token."""

    async def endpoint(request: Request) -> Response:
        web = web_of(request)
        form = await read_form(request, web.config.max_form_bytes)
        web.csrf.check(request, form.pop(CSRF_FIELD, None))
        return await run_in_threadpool(view, request, form)

    endpoint.__name__ = view.__name__
    return endpoint


def json_endpoint(view: Callable[[Request, Any], Response]) -> Endpoint:
    """A view of a JSON body (``Content-Type: application/json``, which a cross-site
    form cannot send)."""

    async def endpoint(request: Request) -> Response:
        body = await read_json(request, web_of(request).config.max_json_bytes)
        return await run_in_threadpool(view, request, body)

    endpoint.__name__ = view.__name__
    return endpoint


def action_endpoint(view: Callable[[Request], Response]) -> Endpoint:
    """An API action that takes no arguments but its path: still sent as JSON (an empty
    body or ``{}``), like every API call that changes something."""

    async def endpoint(request: Request) -> Response:
        body = await read_json(request, web_of(request).config.max_json_bytes, empty={})
        if body != {}:
            raise InvalidRequestError("this action takes no arguments: send {} or no body")
        return await run_in_threadpool(view, request)

    endpoint.__name__ = view.__name__
    return endpoint
