"""The web layer's own errors: what is wrong with an HTTP request, as opposed to an
operation. Rooted in ``EngramError`` like the store's, each with a stable ``code``
and its HTTP ``status``; every error answers ``{"error": {"code", "message"}}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from engram.store.errors import EngramError, InvalidRequestError


class BadRequestError(InvalidRequestError):
    """A malformed request: a path or query value, a cursor, a body that is not JSON.
    An ``invalid_request`` (it has no code of its own), answered 400 instead of 422."""

    status = 400


class UnauthorizedError(EngramError):
    code = "unauthorized"
    status = 401


class ForbiddenError(EngramError):
    """Refused whoever asks: a missing or forged CSRF token, a cross-site request."""

    code = "forbidden"
    status = 403


class MethodNotAllowedError(EngramError):
    code = "method_not_allowed"
    status = 405


class TooLargeError(EngramError):
    code = "too_large"
    status = 413


class UnsupportedMediaTypeError(EngramError):
    code = "unsupported_media_type"
    status = 415


class RetryLaterError(EngramError):
    """An error answered with ``Retry-After``: the seconds to wait before asking again,
    sent in its details and read back from them."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def details(self) -> dict[str, Any]:
        return {"retry_after_s": self.retry_after_s}

    @classmethod
    def from_dict(cls, message: str, data: Mapping[str, Any]) -> Self:
        return cls(message, retry_after_s=int(data.get("retry_after_s", 1)))


class RateLimitedError(RetryLaterError):
    """A scoped token past its reads or writes per minute (ENGRAM_TOKEN_READS_PER_MINUTE,
    ENGRAM_TOKEN_WRITES_PER_MINUTE): nothing was done. Answered 429 with ``Retry-After``
    over HTTP, as a tool error over MCP; other tokens are not held back."""

    code = "rate_limited"
    status = 429


class UnavailableError(EngramError):
    """A server engram needs (PostgreSQL, Redis) or a feature (jobs) is not there."""

    code = "unavailable"
    status = 503


class StatementTimeoutError(UnavailableError, RetryLaterError):
    """A statement of this request ran past the dashboard's bound
    (ENGRAM_WEB_STATEMENT_TIMEOUT) and PostgreSQL cancelled it: nothing it did is kept
    (its transaction rolled back). Answered with ``Retry-After``."""

    code = "statement_timeout"
