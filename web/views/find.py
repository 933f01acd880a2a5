"""Find a record in any scope: one box, read as the beginning of an id and as words of
a record's current text; every hit links to its record's page.

The query stays in the URL (a GET, so a search can be linked and reloaded); the access
log never writes query strings. The text search reads memory text across scopes, so it
is the signed-in operator's, as forgetting is: the gate (``web.middleware.Gate``) lets
no one else reach this page when the dashboard has a token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from starlette.requests import Request
from starlette.responses import Response

from engram.store.limits import MAX_ID_CHARS
from engram.store.read.find import MAX_FIND_TEXT_CHARS, Findings, find_by_id, find_by_text

from ..params import Query
from ..state import web_of

FindBy = Literal["any", "id", "text"]
FIND_BY: tuple[FindBy, ...] = ("any", "id", "text")


@dataclass(frozen=True, slots=True)
class FindResults:
    query: str
    by_id: Findings | None  # None: not asked for
    by_text: Findings | None


def find_page(request: Request) -> Response:
    q = Query.of(request, "q")
    query = q.text("q", max_chars=MAX_FIND_TEXT_CHARS)
    found = find_records(request, query, "any") if query is not None else None
    return web_of(request).render.page(request, "find.html", "_find.html", found=found)


def find_records(request: Request, query: str, by: FindBy) -> FindResults:
    """Both searches, or one; an id is never longer than ``MAX_ID_CHARS``, so a longer
    query finds no id without asking the database."""
    reads = web_of(request).services.store.reads  # a replica when there is one
    by_id = None
    if by in ("any", "id"):
        by_id = (
            reads.run(lambda: find_by_id(reads, query))
            if len(query) <= MAX_ID_CHARS
            else Findings([], False)
        )
    by_text = reads.run(lambda: find_by_text(reads, query)) if by in ("any", "text") else None
    return FindResults(query, by_id, by_text)
