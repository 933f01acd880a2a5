"""Model tools that write through the streams: ``store.models.tools.MemoryTools`` bound to a
Producer. Each write is enqueued with its derived operation id and its receipt
awaited, so the worker applies it (once, however often the call is replayed)
and no database connection is needed. ``memory_recall`` reads, which the
streams do not: give it a reader (a store session's ``recall``, or a client of
the HTTP API), or leave it out with ``include``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engram.store import MemoryTools, Operation, Scope
from engram.store.models.tools import Recall
from engram.store.values import Receipt
from engram.worker.producer import Producer


def stream_tools(
    producer: Producer,
    scope: Scope | Mapping[str, Any],
    *,
    run_id: str | None = None,
    recall: Recall | None = None,
    include: Sequence[str] | None = None,
    prefix: str = "memory",
    wait_s: float = 30.0,
) -> MemoryTools:
    def write(op: Operation) -> Receipt:
        return producer.enqueue(op).wait(wait_s)

    return MemoryTools(scope, write, recall, run_id=run_id, include=include, prefix=prefix)
