"""What the web app works with, built by the composition root and handed in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import redis

from store import Embedder, Store
from worker import Producer


class ReembedStarter(Protocol):
    """Starts a reembed job towards ``model`` on behalf of ``requested_by``; returns the
    job's id. Raises ``InvalidRequestError`` for a model it does not know."""

    def __call__(self, model: str, requested_by: str) -> str: ...


@dataclass(frozen=True, slots=True)
class Services:
    store: Store
    redis: redis.Redis  # bytes in and out, as the workers' and RQ's
    producer: Producer
    # The query embedder for recall: the active generation's model, or None (then
    # recall is by text only, and says so).
    embedder: Embedder | None = None
    # None until the jobs are deployed: the reembed form and POST /api/v1/reembed say so.
    start_reembed: ReembedStarter | None = None
