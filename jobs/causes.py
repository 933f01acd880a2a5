"""A failed re-embedding's root cause: one short line, its error's type and message,
that never holds memory text.

The embedder is the likely culprit, and its message may quote what it was given
(``cannot embed 'my PIN is ...'``). ``Guarded`` wraps the embedder a slice uses
and turns what it raises into ``EmbedderFailedError``, whose cause is written
knowing the texts of that call: a message that repeats a run of one of them is
left out, the error's type kept. engram's own errors are content-free by
contract and keep their message; any other error (a database's, whose detail
line may quote a row) keeps its type only. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from store.errors import EngramError
from store.vectors.embedders import Embedder, Vectors

MAX_CAUSE_CHARS = 200
# A message that holds this many characters of a text in a row quotes it.
_QUOTED_RUN = 12
# Texts shorter than this are too common to look for in a message, except quoted.
_SHORT = 4


class EmbedderFailedError(Exception):
    """The embedder raised; ``cause`` is its type and content-free message."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class Guarded:
    """An embedder whose errors carry a cause fit to show (``EmbedderFailedError``)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dims(self) -> int:
        return self.inner.dims

    def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]] | Vectors:
        try:
            return self.inner.embed(texts)
        except EngramError:
            raise
        except Exception as exc:
            raise EmbedderFailedError(described(exc, texts)) from exc


def of(exc: BaseException) -> str:
    """The cause to show for an error that ended a slice."""
    if isinstance(exc, EmbedderFailedError):
        return exc.cause
    if isinstance(exc, EngramError):
        return _shorten(f"{type(exc).__name__}: {exc.message}")
    return type(exc).__name__


def described(exc: BaseException, texts: Sequence[str]) -> str:
    """``Type: message``, shortened; the type alone when the message quotes a text."""
    name = type(exc).__name__
    message = _shorten(" ".join(str(exc).split()))
    if not message:
        return name
    if quotes(message, texts):
        return f"{name} (its message quoted a record's text and is not kept)"
    return _shorten(f"{name}: {message}")


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


def _shorten(line: str) -> str:
    return line if len(line) <= MAX_CAUSE_CHARS else line[: MAX_CAUSE_CHARS - 1] + "…"
