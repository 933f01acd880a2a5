"""Finding a record in any scope: by its id or the id's beginning, or by the words of
its current text.

An id is read through the byte-ordered indexes of migration 009: a prefix is one
range scan of the records and one of the tombstones, so a forgotten record is found
by its id (and shows as forgotten). Text is matched on the current revisions with
the full-text index recall's lexical list uses, the query read the same way (words
lower-cased, English stop words dropped unless nothing else is left), ranked by
``ts_rank_cd``. A forgotten record's revisions are deleted: its old text finds
nothing. Both answer at most ``limit`` hits, and say when more matched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..errors import InvalidRequestError
from ..limits import MAX_ID_CHARS
from ..rows import scope_from_key
from ..values import Scope, check_string
from .paging import MAX_PAGE_SIZE

FIND_LIMIT = 50
MAX_FIND_TEXT_CHARS = 500
SNIPPET_CHARS = 240

# What ts_headline puts around a matched word: private-use characters, split out
# here, so the words can be marked without any HTML from the database.
_START, _STOP = "\ue000", "\ue001"
_HEADLINE = f'StartSel="{_START}", StopSel="{_STOP}", MaxWords=35, MinWords=15'

FoundStatus = Literal["active", "retracted", "forgotten"]
Piece = tuple[str, bool]  # a stretch of text, and whether it is a matched word


@dataclass(frozen=True, slots=True)
class Found:
    record_id: str
    scope_id: int
    scope: Scope
    status: FoundStatus
    expired: bool
    # Of the current text: where the words matched (a text hit), or its beginning (an
    # id hit); empty for a forgotten record, which has no text.
    snippet: tuple[Piece, ...]

    @property
    def snippet_text(self) -> str:
        return "".join(text for text, _ in self.snippet)


@dataclass(frozen=True, slots=True)
class Findings:
    hits: list[Found]
    more: bool  # more matched than the hits shown


def find_by_id(pool: Any, prefix: str, *, limit: int = FIND_LIMIT) -> Findings:
    """Records and tombstones whose id begins with ``prefix`` (an exact id first), in
    byte order of their ids."""
    check_string(prefix, "an id or its beginning", max_chars=MAX_ID_CHARS)
    params = {"pattern": like_prefix(prefix), "n": _checked_limit(limit) + 1}
    params["clip"] = SNIPPET_CHARS
    with pool.connection() as conn:
        rows = conn.execute(_BY_ID, params).fetchall()
    hits = [_found(row, _beginning(row[6])) for row in rows[:limit]]
    return Findings(hits, len(rows) > limit)


def find_by_text(pool: Any, text: str, *, limit: int = FIND_LIMIT) -> Findings:
    """Records whose current text holds the query's words (web search syntax: all the
    words, a "quoted phrase", or, -not), best ranked first."""
    check_string(text, "the text to find", max_chars=MAX_FIND_TEXT_CHARS)
    params = {"text": text, "n": _checked_limit(limit) + 1, "options": _HEADLINE}
    with pool.connection() as conn:
        rows = conn.execute(_BY_TEXT, params).fetchall()
    hits = [_found(row, snippet(row[6])) for row in rows[:limit]]
    return Findings(hits, len(rows) > limit)


def like_prefix(value: str) -> str:
    """A LIKE pattern for values beginning with ``value``, its ``%``, ``_`` and ``\\``
    taken literally."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def snippet(headline: str, limit: int = SNIPPET_CHARS) -> tuple[Piece, ...]:
    """A ts_headline's text cut into plain and matched pieces, ``limit`` characters in
    all at most (an ellipsis ends a cut one)."""
    pieces: list[Piece] = []
    left = limit
    for i, part in enumerate(headline.split(_START)):
        matched, _, plain = part.rpartition(_STOP) if i else ("", "", part)
        for piece, is_match in ((matched, True), (plain, False)):
            if not piece:
                continue
            if len(piece) > left:
                pieces.append((piece[: max(left - 1, 0)] + "…", is_match))
                return tuple(pieces)
            pieces.append((piece, is_match))
            left -= len(piece)
    return tuple(pieces)


def _beginning(text: str | None) -> tuple[Piece, ...]:
    if not text:
        return ()
    return ((text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…", False),)


def _checked_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidRequestError(f"a find answers 1 to {MAX_PAGE_SIZE} hits")
    return limit


def _found(row: Any, pieces: tuple[Piece, ...]) -> Found:
    record_id, scope_id, key, status, expired = row[:5]
    return Found(record_id, scope_id, scope_from_key(key), status, bool(expired), pieces)


# Each list read in its index's order and cut there; the records' current text, a
# tombstone's nothing. The pattern is a parameter, its metacharacters escaped.
_BY_ID = """
    WITH found AS (
        (SELECT r.id COLLATE "C" AS id, r.scope_id, false AS forgotten FROM engram_records r
         WHERE r.id COLLATE "C" LIKE %(pattern)s ORDER BY r.id COLLATE "C" LIMIT %(n)s)
        UNION ALL
        (SELECT f.record_id COLLATE "C", f.scope_id, true FROM engram_forgotten f
         WHERE f.record_id COLLATE "C" LIKE %(pattern)s
         ORDER BY f.record_id COLLATE "C" LIMIT %(n)s)
        ORDER BY id, forgotten, scope_id LIMIT %(n)s
    )
    SELECT found.id, found.scope_id, s.key,
           CASE WHEN found.forgotten THEN 'forgotten' ELSE r.status END,
           r.expires_at IS NOT NULL AND r.expires_at <= now(),
           NULL, left(v.text, %(clip)s + 1)
    FROM found
    LEFT JOIN engram_records r
        ON NOT found.forgotten AND r.scope_id = found.scope_id
        AND r.id = found.id COLLATE "default"
    LEFT JOIN engram_revisions v
      ON v.scope_id = r.scope_id AND v.record_id = r.id AND v.revision = r.revision
    JOIN engram_scopes s ON s.id = found.scope_id
    ORDER BY found.id, found.forgotten, found.scope_id
"""

# The query read as recall reads it (migration 006): stop words dropped, unless the
# query is nothing else. Only the hits shown get a headline.
_BY_TEXT = """
    WITH q AS MATERIALIZED (
        SELECT websearch_to_tsquery('engram_text', %(text)s) AS query
    ), hits AS (
        SELECT v.scope_id, v.record_id, v.revision,
               ts_rank_cd(v.tsv, (SELECT query FROM q)) AS rank
        FROM engram_revisions v
        WHERE v.tsv @@ (SELECT query FROM q) AND v.current
        ORDER BY rank DESC, v.record_id COLLATE "C", v.scope_id LIMIT %(n)s
    )
    SELECT h.record_id, v.scope_id, s.key, r.status,
           r.expires_at IS NOT NULL AND r.expires_at <= now(), h.rank,
           ts_headline('engram_text', v.text, (SELECT query FROM q), %(options)s)
    FROM hits h
    JOIN engram_revisions v
      ON v.scope_id = h.scope_id AND v.record_id = h.record_id AND v.revision = h.revision
    JOIN engram_records r ON r.scope_id = h.scope_id AND r.id = h.record_id
    JOIN engram_scopes s ON s.id = v.scope_id
    ORDER BY h.rank DESC, h.record_id COLLATE "C", h.scope_id
"""
