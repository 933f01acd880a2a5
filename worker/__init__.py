"""The stream protocol, the Producer client and the stream Worker.

>>> from worker import Producer
>>> p = Producer.from_env()  # REDIS_URL, else the running ``engram up``'s
>>> receipt = p.remember({"user_id": "ada"}, "Ada lives in London.").wait(timeout=5.0)

``Operation`` and ``Scope`` (the store's value types) are here too, for
``Producer.enqueue_many``. Nothing here connects at import time.
"""

from store import Operation, Scope
from store.errors import ConfigError

from .errors import (
    DeadLetteredError,
    EmbeddingMismatchError,
    EngramError,
    FencedError,
    InvalidRequestError,
    NotFoundError,
    OperationConflictError,
    PartitionRetiredError,
    QueueFullError,
    QueueUnavailableError,
    RevisionConflictError,
    WaitTimeout,
)
from .producer import Pending, Producer
from .protocol import StreamReceipt, partition_of
from .settings import Settings, WorkerConfig
from .worker import Worker

# DESIGN's name for a wait that ran out; also a builtin TimeoutError subclass.
TimeoutError = WaitTimeout

__all__ = [
    "ConfigError",
    "DeadLetteredError",
    "EmbeddingMismatchError",
    "EngramError",
    "FencedError",
    "InvalidRequestError",
    "NotFoundError",
    "Operation",
    "OperationConflictError",
    "PartitionRetiredError",
    "Pending",
    "Producer",
    "QueueFullError",
    "QueueUnavailableError",
    "RevisionConflictError",
    "Scope",
    "Settings",
    "StreamReceipt",
    "TimeoutError",
    "WaitTimeout",
    "Worker",
    "WorkerConfig",
    "partition_of",
]
