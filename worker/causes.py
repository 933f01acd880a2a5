"""Why something could not be done, fit to show: a code that tells the causes apart
and one short line, the error's type and message, that never holds memory text.

engram's own errors are content-free by contract: their code and message are kept.
A database's detail line may quote a row: a ``psycopg`` error keeps its class and
SQLSTATE only. Any other error (an embedder's, a model client's) may quote what it
was given (``cannot embed 'my PIN is ...'``): its message is kept unless it repeats
a run of one of the texts the call was given (``quotes``), its type always. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from engram.store.errors import EngramError

MAX_CAUSE_CHARS = 200
# A message that holds this many characters of a text in a row quotes it.
_QUOTED_RUN = 12
# Texts shorter than this are too common to look for in a message, except quoted.
_SHORT = 4

# The code of an error that is neither engram's nor the database's.
UNEXPECTED = "unexpected_error"
DATABASE = "database_error"


@dataclass(frozen=True, slots=True)
class Cause:
    """A root cause: its stable ``code`` and its content-free ``detail`` line."""

    code: str
    detail: str


def cause_of(exc: BaseException, texts: Sequence[str] = ()) -> Cause:
    """The cause to show for ``exc``, raised by a call that was given ``texts``."""
    if isinstance(exc, EngramError):
        return Cause(exc.code, shorten(f"{type(exc).__name__}: {' '.join(exc.message.split())}"))
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate
        name = type(exc).__name__
        return Cause(DATABASE, f"{name} (SQLSTATE {state})" if state else name)
    return Cause(UNEXPECTED, described(exc, texts))


def described(exc: BaseException, texts: Sequence[str]) -> str:
    """``Type: message``, shortened; the type alone when the message quotes a text."""
    name = type(exc).__name__
    message = shorten(" ".join(str(exc).split()))
    if not message:
        return name
    if quotes(message, texts):
        return f"{name} (its message quoted a record's text and is not kept)"
    return shorten(f"{name}: {message}")


def quotes(message: str, texts: Sequence[str]) -> bool:
    """Whether ``message`` repeats a run of any of ``texts`` (or a short one, quoted)."""
    said = message.casefold()
    for text in texts:
        plain = " ".join(text.split()).casefold()
        forms = {plain, repr(text)[1:-1].casefold()}
        if len(plain) < _SHORT:
            if any(f"{q}{plain}{q}" in said for q in ("'", '"')) and plain:
                return True
            continue
        run = min(len(plain), _QUOTED_RUN)
        if any(said[i : i + run] in form for i in range(len(said) - run + 1) for form in forms):
            return True
    return False


def strings_in(value: Any) -> list[str]:
    """Every string value an operation's JSON holds (not its field names): what a
    message that quotes the operation would repeat."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in strings_in(v)]
    return []


def shorten(line: str) -> str:
    return line if len(line) <= MAX_CAUSE_CHARS else line[: MAX_CAUSE_CHARS - 1] + "…"
