"""Answering an operation: its reply, on its own key, for whoever waits on it (the
``Producer``'s ``wait``, the dashboard, a redaction listener updating it later)."""

from __future__ import annotations

from typing import Any

from engram.worker import keys


def send_reply(pipe: Any, op_key: tuple[str, str], body: str, ttl_s: int) -> None:
    """Answer an operation, named by (scope key, operation id), on its reply key (in the
    caller's pipeline). One element at most: a redelivered operation's reply replaces
    the first."""
    key = keys.reply(*op_key)
    pipe.delete(key)
    pipe.rpush(key, body)
    pipe.expire(key, ttl_s)
