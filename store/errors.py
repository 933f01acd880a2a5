"""engram's errors: one root, one class per thing a caller can act on.

Each class has a stable ``code`` (what the stream protocol and the HTTP API
send) and the HTTP ``status`` it maps to. Messages never contain memory text.
"""

from __future__ import annotations

from typing import Any, ClassVar


class EngramError(Exception):
    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def details(self) -> dict[str, Any]:
        """Extra fields a remote caller needs to rebuild this error."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.details()}


class InvalidRequestError(EngramError):
    code = "invalid_request"
    status = 422


class NotFoundError(EngramError):
    code = "not_found"
    status = 404


class OperationConflictError(EngramError):
    """The operation id was already used for a different request."""

    code = "operation_conflict"
    status = 409


class RevisionConflictError(EngramError):
    """The record is not at the revision the caller planned against.

    ``actual`` is None when the conflict is with a record the caller may not
    see (another scope's id, or a forgotten one): nothing about it is revealed.
    """

    code = "revision_conflict"
    status = 409

    def __init__(
        self, message: str, *, expected: int | None, actual: int | None, attempts: int = 1
    ) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual
        self.attempts = attempts

    def details(self) -> dict[str, Any]:
        return {"expected": self.expected, "actual": self.actual, "attempts": self.attempts}


class EmbeddingMismatchError(EngramError):
    """A vector from another model or of another size than the generation's."""

    code = "embedding_mismatch"
    status = 409


class AssertedRecordError(EngramError):
    """The write may only touch inferred records (``only_inferred``), and this one was asserted."""

    code = "asserted_record"
    status = 409


class ModelUnavailableError(EngramError):
    """The model could not answer: not configured, unreachable, too slow, or it refused.

    ``reason`` says which (``timeout``, ``deadline``, ``connection``, ``http_429``,
    ``http_500``, ``protocol``, ``error``...). Nothing was committed: the
    operation may be sent again with the same id.
    """

    code = "model_unavailable"
    status = 503

    def __init__(self, message: str, *, reason: str = "error") -> None:
        super().__init__(message)
        self.reason = reason

    def details(self) -> dict[str, Any]:
        return {"reason": self.reason}


class ModelOutputError(EngramError):
    """The model answered something unusable (not JSON, an unknown event, a record id
    it was not shown, an oversized answer...). Nothing was committed."""

    code = "model_output"
    status = 502


class EmbedderUnavailableError(EngramError):
    """No embedder for a model is available here: unknown to the registry, or its
    package is not installed (the message says which)."""

    code = "embedder_unavailable"
    status = 503


class FencedError(EngramError):
    """A writer holding a stale partition lease tried to commit; ``fences`` names them."""

    code = "fenced"
    status = 409

    def __init__(self, message: str, *, fences: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fences = fences


class TokenNameTakenError(EngramError):
    """A scoped token of that name exists, live or revoked: a name stays with the
    token that had it (receipts and the audit name it), so a new token needs its own."""

    code = "token_name_taken"
    status = 409


class SchemaVersionError(EngramError):
    code = "schema_version"
    status = 500


class RedactionHeldError(EngramError):
    """A forget's deleted row versions cannot leave the tables yet: something still
    holds the xmin horizon before it (``holders``, content-free: a standby's snapshot,
    a replication slot, a prepared transaction, an open transaction). Not a failure:
    the redaction finishes once they are gone."""

    code = "redaction_held"
    status = 503

    def __init__(self, holders: list[str]) -> None:
        super().__init__(held_by(holders))
        self.holders = tuple(holders)


def held_by(holders: list[str] | tuple[str, ...]) -> str:
    """The reason a held redaction shows (receipt, reply, dashboard, ``engram health``):
    the first few holders, and how many more."""
    shown = "; ".join(holders[:_HOLDERS_SHOWN])
    more = len(holders) - _HOLDERS_SHOWN
    return f"held by {shown}" + (f"; and {more} more" if more > 0 else "")


_HOLDERS_SHOWN = 5


ERRORS_BY_CODE: dict[str, type[EngramError]] = {
    cls.code: cls
    for cls in (
        InvalidRequestError,
        NotFoundError,
        OperationConflictError,
        RevisionConflictError,
        EmbeddingMismatchError,
        AssertedRecordError,
        ModelUnavailableError,
        ModelOutputError,
        EmbedderUnavailableError,
        FencedError,
        SchemaVersionError,
    )
}


def error_from_dict(data: dict[str, Any]) -> EngramError:
    """Rebuild a typed error from ``EngramError.to_dict()`` output."""
    code = str(data.get("code", "internal"))
    message = str(data.get("message", code))
    cls = ERRORS_BY_CODE.get(code, EngramError)
    if cls is RevisionConflictError:
        return RevisionConflictError(
            message,
            expected=data.get("expected"),
            actual=data.get("actual"),
            attempts=int(data.get("attempts", 1)),
        )
    if cls is ModelUnavailableError:
        return ModelUnavailableError(message, reason=str(data.get("reason", "error")))
    return cls(message)


class RestorePendingError(EngramError):
    """A restore has not finished re-applying the forget ledger to this database: nothing
    may read or write it until ``engram restore`` runs to its end (a forgotten record's
    text could still be in it)."""

    code = "restore_pending"
    status = 503


class ConfigError(EngramError):
    """Something engram needs is not configured, or configured wrong: no URL and no
    ``engram up`` running, or a dashboard that cannot start as set up."""

    code = "not_configured"
    status = 503


class LedgerUnavailableError(ConfigError):
    """The forget ledger's directory cannot be written (a missing mount, a full disk, no
    rights): nothing was appended, so the forgets it was given are not ``complete``."""

    code = "ledger_unavailable"
