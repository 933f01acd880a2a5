"""Opaque keyset cursors: where the next page of a list starts.

A cursor holds the sort key of the last row of a page (and which list it
belongs to) as URL-safe base64 of a small JSON array, signed (HMAC-SHA256) with
the key of the ``Cursors`` that handed it out. It is opaque to callers and read
strictly: one this key did not sign, or that is not a cursor of that list with
values of the right types, is an ``InvalidCursorError`` (HTTP 400), never a
database error. A cursor holds sort keys only (times, ids), never memory text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..errors import InvalidRequestError
from ..limits import MAX_SCOPE_VALUE_CHARS

# The longest value a cursor holds is a scope key: five fields of up to 200
# characters, quoted; \uXXXX-escaped and base64-encoded, it stays under this.
_MAX_TEXT = 5 * (MAX_SCOPE_VALUE_CHARS + 16)
MAX_CURSOR_CHARS = 16 * _MAX_TEXT
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")
_MAX_INT = 2**63 - 1

Key = int | str | datetime


class InvalidCursorError(InvalidRequestError):
    """A cursor that is not one this list handed out."""

    status = 400


class Cursors:
    """Cursors signed with one key: a process's, or one shared by the processes that
    serve the same lists (the dashboard derives it from its token)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a cursor key has at least 16 bytes")
        self.key = key

    def encode(self, kind: str, values: Sequence[Key]) -> str:
        body = [kind, [_encode_value(v) for v in values]]
        raw = json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode()
        payload = _b64(raw)
        return f"{payload}.{self._sign(payload)}"

    def decode(self, token: str, kind: str, types: Sequence[type]) -> tuple[Key, ...]:
        """The sort key a cursor of list ``kind`` holds, each value of the type given."""
        if not isinstance(token, str) or not 0 < len(token) <= MAX_CURSOR_CHARS:
            raise InvalidCursorError("the cursor is empty or too long")
        payload, _, signature = token.rpartition(".")
        if not payload or not hmac.compare_digest(signature, self._sign(payload)):
            raise InvalidCursorError("the cursor was not handed out by this server")
        return _read(payload, kind, types)

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self.key, payload.encode(), hashlib.sha256).digest()[:16])


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _read(payload: str, kind: str, types: Sequence[type]) -> tuple[Key, ...]:
    if not _BASE64URL.fullmatch(payload):
        raise InvalidCursorError("the cursor is not one this list handed out (not base64url)")
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        body = json.loads(raw.decode("ascii"))
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidCursorError("the cursor is not one this list handed out") from None
    if (
        not isinstance(body, list)
        or len(body) != 2
        or body[0] != kind
        or not isinstance(body[1], list)
        or len(body[1]) != len(types)
    ):
        raise InvalidCursorError(f"the cursor is not a cursor of this list ({kind})")
    return tuple(_decode_value(v, t) for v, t in zip(body[1], types, strict=True))


def _encode_value(value: Key) -> Any:
    if isinstance(value, datetime):
        return {"t": value.isoformat()}
    return value


def _decode_value(value: Any, expected: type) -> Key:
    if expected is datetime:
        if not isinstance(value, dict) or set(value) != {"t"} or not isinstance(value["t"], str):
            raise InvalidCursorError("the cursor holds a malformed time")
        try:
            at = datetime.fromisoformat(value["t"])
        except ValueError:
            raise InvalidCursorError("the cursor holds a malformed time") from None
        if at.tzinfo is None:
            raise InvalidCursorError("the cursor holds a time without a time zone")
        return at
    if expected is int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INT:
            raise InvalidCursorError("the cursor holds a malformed number")
        return value
    if (
        not isinstance(value, str)
        or len(value) > _MAX_TEXT
        or "\x00" in value
        or not _encodable(value)
    ):
        raise InvalidCursorError("the cursor holds a malformed id")
    return value


def _encodable(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True
