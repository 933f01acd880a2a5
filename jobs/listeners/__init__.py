"""The forget listeners the redaction jobs run, in order, after a forget committed.

A listener takes a batch of forget events (forgets that arrived together are
handled together, so costly steps such as rewriting a file run once for all)
and raises if it could not do its part. Built in, by name:

- ``redis``: the forgotten text leaves every key engram owns in Redis, then
  valkey's persistence files (``in_redis``);
- ``postgres``: the row versions the forget deleted leave the tables' pages
  (``in_postgres``);
- ``webhook``: the events are POSTed, signed, to ``ENGRAM_FORGET_WEBHOOK_URL``.

A listener of your own is a ``package.module:callable`` in
``ENGRAM_FORGET_LISTENERS``: a ``store.ForgetListener``, called with each event
in turn (what ``Store.session(on_forget=...)`` takes), that raises on failure.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from engram.store import ForgetEvent

from ..context import JobContext

log = logging.getLogger(__name__)


class Listener(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(self, events: Sequence[ForgetEvent]) -> None: ...


@dataclass(frozen=True, slots=True)
class EachEvent:
    """A listener of one event at a time (a ``store.ForgetListener``), over a batch."""

    name: str
    listener: Callable[[ForgetEvent], None]

    def __call__(self, events: Sequence[ForgetEvent]) -> None:
        for event in events:
            self.listener(event)


def build(ctx: JobContext) -> list[Listener]:
    """The configured listeners, in their order."""
    from .in_postgres import PostgresListener
    from .in_redis import RedisListener
    from .webhook import WebhookListener

    listeners: list[Listener] = []
    config = ctx.settings.redaction
    for name in config.listeners:
        if name == "redis":
            listeners.append(RedisListener(ctx))
        elif name == "postgres":
            listeners.append(PostgresListener(ctx))
        elif name == "webhook":
            if config.webhook_url is None:
                continue  # on only once a URL is configured
            listeners.append(WebhookListener.configured(config))
        else:
            module, _, attr = name.partition(":")
            listeners.append(EachEvent(name, getattr(importlib.import_module(module), attr)))
    return listeners
