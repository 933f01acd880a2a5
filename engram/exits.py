"""The ``engram`` command's exit codes, and which error ends with which.

Data goes to stdout; diagnostics (logs, errors, hints) to stderr.
"""

from __future__ import annotations

import psycopg
import redis

from engram.store.errors import ConfigError, EngramError, InvalidRequestError, SchemaVersionError
from engram.worker.errors import QueueFullError, QueueUnavailableError

from .home import HomeInUseError

OK = 0
# The answer is an error: the operation was refused (its reply, on stdout, says why),
# or what was asked for does not exist.
REFUSED = 1
# Bad usage or input, or nothing configured: nothing was sent, started or changed.
USAGE = 2
# A wait ran out: the operation is enqueued and may still commit (``engram wait`` it).
PENDING = 3
# ENGRAM_HOME is owned by another engram process: nothing was started.
HOME_IN_USE = 4
# PostgreSQL or Redis could not be reached, or a partition stream is full.
UNAVAILABLE = 5


def for_error(exc: BaseException) -> int:
    if isinstance(exc, HomeInUseError):
        return HOME_IN_USE
    if isinstance(exc, InvalidRequestError | ConfigError | SchemaVersionError | ValueError):
        return USAGE
    if isinstance(
        exc, QueueUnavailableError | QueueFullError | redis.RedisError | psycopg.OperationalError
    ):
        return UNAVAILABLE
    if isinstance(exc, EngramError):
        return REFUSED
    raise exc
