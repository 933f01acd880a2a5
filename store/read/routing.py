"""Where a read goes: a streaming replica's pool when the store has one and it is fresh
enough for the reader, else the primary's.

A commit position is a PostgreSQL WAL location (an LSN, ``"16/B374D848"``). A writer
on a store with a replica records on each receipt the primary's WAL insert position
read right after its COMMIT (``Receipt.position``): the commit record ends at or
before it. A reader that passes that position (``after=``) is served by the replica
only once the replica has replayed that far (``pg_last_wal_replay_lsn()``), else by the
primary, so it always sees its own write. A reader that passes none reads the replica
as it is: behind the primary by its replay lag.

A replica that cannot be reached, or fails a read, is rested for a few seconds (its
reads go to the primary meanwhile) and the read is run again on the primary: a
reader never sees the replica's failure. Every read is idempotent, so running one
again is safe. Nothing here ever writes: the write path never sees this route.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Concatenate, ParamSpec, TypeVar

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import InvalidRequestError

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S")

# How a receipt's position is read on the primary, right after COMMIT on the same
# connection: the insert position is at or after the end of the commit record just
# written (the write or flush position may still be before it, with an asynchronous
# commit).
COMMIT_POSITION = "SELECT pg_current_wal_insert_lsn()::text"

# On the replica: how far it has replayed; a server not in recovery (a read URL that
# reached a primary, e.g. through target_session_attrs=prefer-standby) is never behind.
_REPLAYED = "SELECT pg_last_wal_replay_lsn()::text, pg_is_in_recovery()"

_LSN = re.compile(r"[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}")
_ALWAYS_CURRENT = 1 << 64  # a primary's connection: past any position

# How long a read may wait for a replica connection before it takes the primary's;
# and how long a replica that failed is left alone before a read tries it again.
CHECKOUT_TIMEOUT_S = 0.5
REST_S = 5.0


def parse_position(value: str | None, what: str = "position") -> int | None:
    """A commit position (``"16/B374D848"``) as a number; None stays None."""
    if value is None:
        return None
    if not isinstance(value, str) or not _LSN.fullmatch(value):
        raise InvalidRequestError(f"{what} must be a commit position such as 0/16B3748")
    high, low = value.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def format_position(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


@dataclass(frozen=True, slots=True)
class _Reading:
    """What the reads running in this context may use."""

    after: int | None = None  # the position they must see
    primary_only: bool = False  # the replica failed this read: run it again on the primary
    retrying: bool = False  # inside ``run``: a replica failure is run again, not raised


_UNROUTED = _Reading()  # frozen: one value shared by every context is safe
_READING: ContextVar[_Reading] = ContextVar("engram_reading", default=_UNROUTED)


class _ReplicaFailed(Exception):
    """A read failed on the replica: ``run`` runs it again on the primary."""


class ReadRoute:
    """The pool-like object the read paths take their connections from.

    ``connection()`` hands out a replica connection or the primary's, as the context
    allows; ``run(read, after=)`` runs a read there and, if the replica fails it, again
    on the primary. ``served`` counts where reads went (``replica``, ``primary``,
    ``behind``: sent to the primary because the replica had not replayed the reader's
    position, ``failed``: run again on the primary after the replica failed, ``busy``:
    sent to the primary because every replica connection was in use)."""

    def __init__(
        self,
        primary: ConnectionPool[Any],
        replica: ConnectionPool[Any] | None = None,
        *,
        checkout_timeout_s: float = CHECKOUT_TIMEOUT_S,
        rest_s: float = REST_S,
    ) -> None:
        self.primary = primary
        self.replica = replica
        self.checkout_timeout_s = checkout_timeout_s
        self.rest_s = rest_s
        self.served: Counter[str] = Counter()
        self._resting_until = 0.0
        self._lock = threading.Lock()
        # How far each replica connection was last seen to have replayed (a server's
        # replay position only moves forward): a reader already covered costs no query.
        self._replayed: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def run(self, read: Callable[[], T], *, after: str | int | None = None) -> T:
        """``read()``, its connections routed for a reader who must see ``after``."""
        if self.replica is None:
            _position(after)  # checked all the same: a bad position is refused anywhere
            return read()  # one server: nothing to route
        reading = _READING.get()
        token = _READING.set(
            replace(reading, after=_later(_position(after), reading.after), retrying=True)
        )
        try:
            return read()
        except _ReplicaFailed:
            self._count("failed")
            _READING.set(replace(_READING.get(), primary_only=True))
            return read()
        finally:
            _READING.reset(token)

    @contextmanager
    def after(self, position: str | int | None) -> Iterator[None]:
        """Every read inside sees ``position`` (the dashboard's and the API's ``after``)."""
        if position is None:
            yield
            return
        reading = _READING.get()
        token = _READING.set(replace(reading, after=_later(_position(position), reading.after)))
        try:
            yield
        finally:
            _READING.reset(token)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        if self.replica is None:
            with self.primary.connection() as primary:
                yield primary
            return
        reading = _READING.get()
        conn = None
        if not reading.primary_only and not self._resting():
            conn = self._replica_connection(reading.after)
        if conn is None:
            self._count("primary")
            with self.primary.connection() as primary:
                yield primary
            return
        self._count("replica")
        try:
            yield conn
        except psycopg.errors.QueryCanceled:
            raise  # past the read's own bound (statement_timeout): not run again anywhere
        except psycopg.Error as exc:
            self._failed(conn, exc)
            if reading.retrying:
                raise _ReplicaFailed from exc
            raise
        finally:
            self.replica.putconn(conn)

    def close(self) -> None:
        if self.replica is not None:
            self.replica.close()

    # -- the replica's state ---------------------------------------------------------

    def _replica_connection(self, after: int | None) -> psycopg.Connection[Any] | None:
        """A replica connection that has replayed ``after``, or None (use the primary)."""
        assert self.replica is not None
        try:
            conn: psycopg.Connection[Any] = self.replica.getconn(timeout=self.checkout_timeout_s)
        except PoolTimeout as exc:
            if self.replica.get_stats().get("pool_size", 0) == 0:
                self._rest(exc)  # no connection at all: the replica cannot be reached
            else:
                self._count("busy")  # every replica connection in use: this read only
            return None
        except psycopg.OperationalError as exc:
            self._rest(exc)
            return None
        if after is None:
            return conn
        try:
            if self._replayed.get(conn, -1) < after:
                self._replayed[conn] = _replay_position(conn)
        except psycopg.Error as exc:
            self.replica.putconn(conn)
            self._failed(conn, exc)
            return None
        if self._replayed[conn] >= after:
            return conn
        self.replica.putconn(conn)
        self._count("behind")
        return None

    def _resting(self) -> bool:
        return time.monotonic() < self._resting_until

    def _failed(self, conn: psycopg.Connection[Any], exc: Exception) -> None:
        """A connection that broke means the replica is gone: rest it. A statement that
        failed on a healthy connection (a recovery conflict cancelled it) does not."""
        if conn.closed or conn.broken:
            self._rest(exc)

    def _rest(self, exc: Exception) -> None:
        with self._lock:
            was_resting = self._resting()
            self._resting_until = time.monotonic() + self.rest_s
        if not was_resting:  # once per outage, not per read
            log.warning(
                "read replica unavailable, reading the primary",
                extra={"error": type(exc).__name__, "retry_in_s": self.rest_s},
            )

    def _count(self, where: str) -> None:
        with self._lock:
            self.served[where] += 1


def routed(method: Callable[Concatenate[S, P], T]) -> Callable[Concatenate[S, P], T]:
    """A read method of an object whose ``pool`` is a ``ReadRoute``: run by the route, so
    a replica failure runs it again on the primary."""

    def read(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        route: ReadRoute = self.pool  # type: ignore[attr-defined]
        return route.run(lambda: method(self, *args, **kwargs))

    functools.update_wrapper(read, method)
    return read


def _position(value: str | int | None) -> int | None:
    if value is None or isinstance(value, int):
        return value
    return parse_position(value, "after")


def _later(one: int | None, other: int | None) -> int | None:
    return other if one is None else one if other is None else max(one, other)


def _replay_position(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(_REPLAYED).fetchone()
    assert row is not None
    replayed, in_recovery = row
    if not in_recovery:
        return _ALWAYS_CURRENT
    return parse_position(replayed) or 0
