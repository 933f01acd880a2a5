"""The jobs' errors, and the rule that keeps memory text out of RQ's failure records.

RQ stores the traceback of a job that raised (its exception's message included)
in Redis. A message can quote data: a database error's detail line, an
embedder's complaint about a text. So a job function never lets an exception
out as it is: ``content_free`` logs its type and frames (code, not data) and
raises ``JobFailedError``, whose message names the job and its cause as a dead
letter's does (``worker.causes``): engram's own errors, content-free by contract,
with their message (``prune failed: InvalidRequestError: ...``); a database's with
its class and SQLSTATE; any other with its type only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import traceback
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import psycopg

from engram.store.errors import EngramError
from engram.worker.causes import cause_of

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


class JobFailedError(EngramError):
    """A job raised; its message names the job and the error's type, never its text."""

    code = "job_failed"
    status = 500


def content_free(what: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Wrap a job function so that what it raises reaches RQ without its message."""

    def wrap(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return func(*args, **kwargs)
            except JobFailedError:
                raise
            except Exception as exc:
                with contextlib.suppress(Exception):  # nothing but ours may get out
                    log.error(
                        "job failed",
                        extra={
                            "job": what,
                            "job_args": _ids(args),
                            "error": type(exc).__name__,
                            "where": "".join(traceback.format_tb(exc.__traceback__))[-2000:],
                        },
                    )
                raise JobFailedError(f"{what} failed: {_cause(exc)}") from None

        return run

    return wrap


def _cause(exc: Exception) -> str:
    """What a failed job's error says of why: no text a job was given can be in it (the
    job knows no texts to look for, so another error's message is not kept)."""
    if isinstance(exc, EngramError | psycopg.Error):
        return cause_of(exc).detail
    return type(exc).__name__


def _ids(args: tuple[Any, ...]) -> str:
    """The arguments of a job, which are ids and numbers, for a log line."""
    return ", ".join(repr(a) for a in args if isinstance(a, (int, str)))[:200]
