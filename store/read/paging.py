"""Pages of a list read by keyset: the rows, and the cursor of the next page."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..errors import InvalidRequestError
from . import cursors

T = TypeVar("T")

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    next: str | None  # the cursor of the next page; None on the last one


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidRequestError(f"a page holds 1 to {MAX_PAGE_SIZE} rows")
    return limit


def paged(
    rows: Sequence[Any],
    limit: int,
    cursor: tuple[cursors.Cursors, str],
    key: Callable[[Any], Sequence[cursors.Key]],
    build: Callable[[Any], T],
) -> Page[T]:
    """A page from up to ``limit + 1`` rows read in order: the extra row, if any, only
    says there is a next page, which starts after the last row shown (its ``cursor``,
    a list's kind signed by the ``Cursors`` given)."""
    signer, kind = cursor
    shown = rows[:limit]
    more = len(rows) > limit
    return Page(
        items=[build(r) for r in shown],
        next=signer.encode(kind, key(shown[-1])) if more and shown else None,
    )
