"""Strict reading of what comes in the URL: path values, query parameters.

Anything malformed is a ``BadRequestError`` (400) whose message names the
parameter and never quotes its value (it may be memory text, as recall's).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TypeVar

from starlette.datastructures import QueryParams
from starlette.requests import Request

from engram.store.errors import InvalidRequestError
from engram.store.limits import MAX_ID_CHARS, MAX_SCOPE_VALUE_CHARS
from engram.store.read.cursors import MAX_CURSOR_CHARS
from engram.store.read.paging import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from engram.store.values import SCOPE_FIELDS, check_string

from .errors import BadRequestError

S = TypeVar("S", bound=str)
_MAX_INT = 2**63 - 1
MAX_CURSOR_PARAM_CHARS = MAX_CURSOR_CHARS


class Query:
    """A request's query parameters: each read once, none unknown, none repeated."""

    def __init__(self, params: QueryParams, allowed: Iterable[str]) -> None:
        allowed = set(allowed)
        unknown = sorted({k for k in params if k not in allowed})
        if unknown:
            raise BadRequestError(
                f"unknown query parameter(s): {', '.join(_safe(k) for k in unknown)}"
            )
        repeated = sorted({k for k in params if len(params.getlist(k)) > 1})
        if repeated:
            raise BadRequestError(f"query parameter(s) given more than once: {', '.join(repeated)}")
        self.params = params

    @classmethod
    def of(cls, request: Request, *allowed: str) -> Query:
        return cls(request.query_params, allowed)

    def text(self, name: str, *, max_chars: int = MAX_ID_CHARS) -> str | None:
        """A value, or None when absent or empty (an empty form field)."""
        value = self.params.get(name)
        if value is None or value == "":
            return None
        return checked(value, name, max_chars=max_chars)

    def choice(self, name: str, options: tuple[S, ...], default: S | None = None) -> S | None:
        value = self.params.get(name)
        if value is None or value == "":
            return default
        for option in options:
            if value == option:
                return option
        raise BadRequestError(f"{name} must be one of {', '.join(options)}")

    def flag(self, name: str) -> bool | None:
        """``true`` / ``false`` (or ``yes`` / ``no``), or None for either."""
        value = self.params.get(name)
        if value in (None, "", "any"):
            return None
        if value in ("true", "yes"):
            return True
        if value in ("false", "no"):
            return False
        raise BadRequestError(f"{name} must be true, false or any")

    def integer(self, name: str, *, minimum: int = 1, maximum: int = _MAX_INT) -> int | None:
        value = self.params.get(name)
        if value is None or value == "":
            return None
        return integer(value, name, minimum=minimum, maximum=maximum)

    def number(self, name: str, *, minimum: float, maximum: float) -> float | None:
        value = self.params.get(name)
        if value is None or value == "":
            return None
        try:
            number = float(value)
        except ValueError:
            raise BadRequestError(f"{name} must be a number") from None
        if not minimum <= number <= maximum:  # also refuses nan
            raise BadRequestError(f"{name} must be between {minimum:g} and {maximum:g}")
        return number

    def time(self, name: str) -> datetime | None:
        value = self.params.get(name)
        if value is None or value == "":
            return None
        return parse_time(value, name)

    def cursor(self) -> str | None:
        value = self.params.get("cursor")
        if value is None or value == "":
            return None
        if len(value) > MAX_CURSOR_PARAM_CHARS:
            raise BadRequestError("the cursor is too long")
        return value

    def limit(self) -> int:
        value = self.integer("limit", minimum=1, maximum=MAX_PAGE_SIZE)
        return DEFAULT_PAGE_SIZE if value is None else value

    def scope_match(self) -> dict[str, str]:
        """The scope fields given, for a scope filter."""
        out = {}
        for name in SCOPE_FIELDS:
            value = self.text(name, max_chars=MAX_SCOPE_VALUE_CHARS)
            if value is not None:
                out[name] = value
        return out


def checked(value: str, name: str, *, max_chars: int = MAX_ID_CHARS) -> str:
    try:
        return check_string(value, name, max_chars=max_chars)
    except InvalidRequestError as exc:
        raise BadRequestError(exc.message) from None


def ident(value: str, name: str) -> str:
    """A record or operation id from the path."""
    return checked(value, name, max_chars=MAX_ID_CHARS)


def integer(value: str, name: str, *, minimum: int = 1, maximum: int = _MAX_INT) -> int:
    if not value.isascii() or not value.isdigit() or len(value) > 19:
        raise BadRequestError(f"{name} must be a whole number")
    number = int(value)
    if not minimum <= number <= maximum:
        raise BadRequestError(f"{name} must be between {minimum} and {maximum}")
    return number


def parse_time(value: str, name: str) -> datetime:
    """ISO 8601; a time without a zone is UTC (what the dashboard's time fields send)."""
    if len(value) > 64:
        raise BadRequestError(f"{name} must be an ISO 8601 time")
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequestError(f"{name} must be an ISO 8601 time, e.g. 2026-12-01T09:30") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _safe(name: str) -> str:
    """A parameter's name, shown only if it looks like one."""
    return name if name.isascii() and name.replace("_", "").isalnum() and len(name) < 40 else "?"
