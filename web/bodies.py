"""Reading request bodies: size-capped, strictly typed, forms CSRF-checked.

A body over its cap is refused (413) as soon as the cap is passed, before it
is all read. Forms are ``application/x-www-form-urlencoded`` only (no file
uploads here), parsed strictly; JSON must say so in its content type.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request

from engram.store.errors import InvalidRequestError
from engram.worker.admin.deadletters import check_why

from .errors import BadRequestError, TooLargeError, UnsupportedMediaTypeError

FORM_TYPE = "application/x-www-form-urlencoded"
JSON_TYPE = "application/json"
MAX_FORM_FIELDS = 64


async def read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequestError("Content-Length must be a number")
        if int(declared) > max_bytes:
            raise TooLargeError(f"the request body is larger than {max_bytes} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise TooLargeError(f"the request body is larger than {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


async def read_form(request: Request, max_bytes: int) -> dict[str, str]:
    """A form's fields (each at most once); an empty body is an empty form."""
    body = await read_body(request, max_bytes)
    if body and media_type(request) != FORM_TYPE:
        raise UnsupportedMediaTypeError(f"a form is sent as {FORM_TYPE}")
    try:
        pairs = parse_qsl(
            body.decode("utf-8"),
            keep_blank_values=True,
            strict_parsing=bool(body),
            errors="strict",
            max_num_fields=MAX_FORM_FIELDS,
        )
    except (UnicodeDecodeError, ValueError):
        raise BadRequestError("the form is not valid URL-encoded UTF-8") from None
    form: dict[str, str] = {}
    for name, value in pairs:
        if name in form:
            raise BadRequestError("a form field was given more than once")
        form[name] = value
    return form


async def read_json(request: Request, max_bytes: int, *, empty: Any = None) -> Any:
    """The JSON body. With ``empty`` (an action that takes no arguments), no body at all
    is that value: a request without a content type, which no form sends."""
    body = await read_body(request, max_bytes)
    if empty is not None and not body and "content-type" not in request.headers:
        return empty
    if media_type(request) != JSON_TYPE:
        raise UnsupportedMediaTypeError(f"send the body as {JSON_TYPE}")
    if empty is not None and not body:  # an empty JSON body; whitespace is not JSON
        return empty
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequestError("the body is not valid JSON") from None


def why_of(value: Any) -> str | None:
    """An operator's why for an action (a form's or a JSON body's), or None; a 400
    past ``worker.deadletters.MAX_WHY_CHARS``."""
    try:
        return check_why(value)
    except InvalidRequestError as exc:
        raise BadRequestError(exc.message) from None
