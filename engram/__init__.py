"""engram: versioned memory for AI agents, and the composition root.

What a user imports is here, under one name::

    from engram import Producer, Store

    producer = Producer.from_env()  # REDIS_URL, else the running ``engram up``'s
    receipt = producer.remember({"user_id": "ada"}, "Ada lives in London.").wait(timeout=5.0)

Every part lives under this one namespace: ``engram.store`` (the versioned store on
PostgreSQL), ``engram.worker`` (the stream protocol, the Producer and the Worker),
``engram.jobs`` (the background jobs) and ``engram.web`` (the dashboard and the HTTP
API). In the source tree they are the folders ``store/``, ``worker/``, ``jobs/`` and
``web/`` beside this one, which holds them as links; what composes them (the ``engram``
command, ``engram up``) is this folder's own modules, and none of the four imports those.

The names below are resolved on first use: ``import engram.store`` alone does not load
the Producer, Redis or the dashboard.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engram.store import Hit, Operation, Receipt, Record, Scope, Store
    from engram.worker import (
        DeadLetteredError,
        EngramError,
        FencedError,
        InvalidRequestError,
        NotFoundError,
        OperationConflictError,
        Pending,
        Producer,
        QueueFullError,
        QueueUnavailableError,
        RevisionConflictError,
        WaitTimeout,
    )

__all__ = [
    "DeadLetteredError",
    "EngramError",
    "FencedError",
    "Hit",
    "InvalidRequestError",
    "NotFoundError",
    "Operation",
    "OperationConflictError",
    "Pending",
    "Producer",
    "QueueFullError",
    "QueueUnavailableError",
    "Receipt",
    "Record",
    "RevisionConflictError",
    "Scope",
    "Store",
    "WaitTimeout",
]
# The store's own names; every other public name is the client's (``engram.worker``).
_STORE = {"Hit", "Operation", "Receipt", "Record", "Scope", "Store"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'engram' has no attribute {name!r}")
    module = "engram.store" if name in _STORE else "engram.worker"
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
