"""The errors a producer sees: the store's, plus the queue's own.

Every class is rooted in ``EngramError`` and has a stable ``code``; a worker
sends ``to_dict()`` through Redis and ``error_from_dict`` rebuilds the same
class on the producer side. Messages carry ids and counts, never memory text.
"""

from __future__ import annotations

from typing import Any

from store.errors import (
    EmbeddingMismatchError,
    EngramError,
    FencedError,
    InvalidRequestError,
    NotFoundError,
    OperationConflictError,
    RevisionConflictError,
)
from store.errors import error_from_dict as _store_error_from_dict


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
    """The operation was moved to the dead-letter stream without being applied."""

    code = "dead_lettered"
    status = 500


class WaitTimeout(EngramError, TimeoutError):
    """No reply arrived within the wait. The operation may still commit later.

    Also a builtin ``TimeoutError``; ``worker.TimeoutError`` names this class.
    """

    code = "timeout"
    status = 504


_WORKER_ERRORS: dict[str, type[EngramError]] = {
    cls.code: cls
    for cls in (
        QueueUnavailableError,
        QueueFullError,
        PartitionRetiredError,
        DeadLetteredError,
        WaitTimeout,
    )
}


def error_from_dict(data: dict[str, Any]) -> EngramError:
    """Rebuild a typed error, the queue's or the store's, from ``to_dict()`` output."""
    cls = _WORKER_ERRORS.get(str(data.get("code")))
    if cls is not None:
        return cls(str(data.get("message", cls.code)))
    return _store_error_from_dict(data)


__all__ = [
    "DeadLetteredError",
    "EmbeddingMismatchError",
    "EngramError",
    "FencedError",
    "InvalidRequestError",
    "NotFoundError",
    "OperationConflictError",
    "PartitionRetiredError",
    "QueueFullError",
    "QueueUnavailableError",
    "RevisionConflictError",
    "WaitTimeout",
    "error_from_dict",
]
