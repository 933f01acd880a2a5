"""The stream protocol, the Producer client and the stream Worker.

>>> from worker import Producer
>>> p = Producer.from_env()  # REDIS_URL, else the running ``engram up``'s
>>> receipt = p.remember({"user_id": "ada"}, "Ada lives in London.").wait(timeout=5.0)

``Operation`` and ``Scope`` (the store's value types) are here too, for
``Producer.enqueue_many``. Nothing here connects at import time.
"""

from engram.store import Operation, Scope
from engram.store.errors import ConfigError
from engram.worker.consuming.worker import Worker
from engram.worker.errors import (
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
from engram.worker.producer import Pending, Producer
from engram.worker.protocol import StreamReceipt, partition_of
from engram.worker.settings import Settings, WorkerConfig

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
