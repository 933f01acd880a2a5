"""The errors a producer sees: the store's, plus the queue's own.

Every class is rooted in ``EngramError`` and has a stable ``code``; a worker
sends ``to_dict()`` through Redis and ``error_from_dict`` rebuilds the same
class on the producer side (which imports this module, so every code of the
store and of the queue is registered there: ``store.errors.ERRORS_BY_CODE``).
Messages carry ids and counts, never memory text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from engram.store.errors import (
    EmbeddingMismatchError,
    EngramError,
    FencedError,
    InvalidRequestError,
    NotFoundError,
    OperationConflictError,
    RevisionConflictError,
)
from engram.store.errors import error_from_dict as _store_error_from_dict


class QueueUnavailableError(EngramError):
    """Redis could not be reached or refused the command: nothing may have been enqueued.

    An enqueue that failed this way may still have reached the stream (the
    connection can drop after Redis applied the command): retry with the
    same operation id, and the receipts make the retry exact.
    """

    code = "queue_unavailable"
    status = 503


class QueueFullError(EngramError):
    """The partition stream holds too many unprocessed operations (are workers running?)."""

    code = "queue_full"
    status = 503


class PartitionRetiredError(EngramError):
    """The stream the operation was sent to belongs to a partition layout that
    ``engram repartition`` replaced and retired, and the layout in Redis
    (``engram:layout``) still points there (lost, or restored from before the switch):
    nothing was enqueued. The message says which epoch replaced it."""

    code = "partition_retired"
    status = 503


class DeadLetteredError(EngramError):
    """The operation was moved to the dead-letter stream without being applied.

    ``cause`` is the code that tells why (``too_many_deliveries``, the code of the
    error its commit raised: ``embedder_unavailable``, ``database_error``...) and
    ``detail`` that error's type and content-free message (``worker.causes``)."""

    code = "dead_lettered"
    status = 500

    def __init__(self, message: str, *, cause: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.cause = cause
        self.detail = detail

    def details(self) -> dict[str, Any]:
        return {
            **({"cause": self.cause} if self.cause else {}),
            **({"detail": self.detail} if self.detail else {}),
        }

    @classmethod
    def from_dict(cls, message: str, data: Mapping[str, Any]) -> Self:
        cause, detail = data.get("cause"), data.get("detail")
        return cls(
            message,
            cause=cause if isinstance(cause, str) else "",
            detail=detail if isinstance(detail, str) else "",
        )


class MalformedEntryError(InvalidRequestError):
    """A stream entry that is not a valid operation for its partition: refused as
    ``invalid_request`` (what a waiting producer gets back), with the ``cause`` that
    says what was wrong (``MALFORMED_CAUSES``)."""

    def __init__(self, message: str, *, cause: str) -> None:
        super().__init__(message)
        self.cause = cause

    def details(self) -> dict[str, Any]:
        return {"cause": self.cause}


# What was wrong with a malformed entry, as a dead letter's code names it.
MALFORMED_CAUSES = (
    "invalid_entry",  # its fields are not exactly ``op``, or could not be read at all
    "not_utf8",
    "too_large",
    "invalid_json",
    "unknown_field",  # the operation has a field no operation has
    "missing_field",  # operation_id, kind, scope or request is missing
    "invalid_scope",
    "unknown_kind",
    "invalid_request",  # the request itself: a field of the wrong type, a text too long...
    "wrong_partition",  # a valid operation on a partition its scope does not belong to
)


class WaitTimeout(EngramError, TimeoutError):
    """No reply arrived within the wait. The operation may still commit later.

    Also a builtin ``TimeoutError``; ``worker.TimeoutError`` names this class.
    """

    code = "timeout"
    status = 504


class RepartitionError(InvalidRequestError):
    """``engram repartition`` was asked for something it cannot do; nothing changed."""

    code = "repartition_refused"


class SelectionChangedError(EngramError):
    """The letters a bulk action would take are no longer those its dry run showed."""

    code = "selection_changed"
    status = 409


def error_from_dict(data: Mapping[str, Any]) -> EngramError:
    """Rebuild a typed error, the queue's or the store's, from ``to_dict()`` output.

    An ``invalid_request`` with a malformed entry's ``cause`` is a ``MalformedEntryError``
    again (it shares its code: ``store.errors.error_from_dict`` would not know it)."""
    cause = data.get("cause")
    if data.get("code") == InvalidRequestError.code and cause in MALFORMED_CAUSES:
        return MalformedEntryError(str(data.get("message", "")), cause=str(cause))
    return _store_error_from_dict(data)


__all__ = [
    "DeadLetteredError",
    "EmbeddingMismatchError",
    "EngramError",
    "FencedError",
    "InvalidRequestError",
    "MalformedEntryError",
    "NotFoundError",
    "OperationConflictError",
    "PartitionRetiredError",
    "QueueFullError",
    "QueueUnavailableError",
    "RepartitionError",
    "RevisionConflictError",
    "SelectionChangedError",
    "WaitTimeout",
    "error_from_dict",
]
