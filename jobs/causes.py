"""A failed re-embedding's root cause: one short line, its error's type and message,
that never holds memory text.

The embedder is the likely culprit, and its message may quote what it was given
(``cannot embed 'my PIN is ...'``). ``Guarded`` wraps the embedder a slice uses
and turns what it raises into ``EmbedderFailedError``, whose cause is written
knowing the texts of that call: a message that repeats a run of one of them is
left out, the error's type kept. engram's own errors are content-free by
contract and keep their message; any other error (a database's, whose detail
line may quote a row) keeps its type only. The wording is ``worker.causes``'s. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from engram.store.errors import EngramError
from engram.store.vectors.embedders import Embedder, Vectors
from engram.worker.causes import MAX_CAUSE_CHARS, described, quotes, shorten

__all__ = ["MAX_CAUSE_CHARS", "EmbedderFailedError", "Guarded", "described", "of", "quotes"]


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
        return shorten(f"{type(exc).__name__}: {exc.message}")
    return type(exc).__name__
