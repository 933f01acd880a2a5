"""Dead letters: the entries no worker could apply, with why; retry or discard."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from store.errors import NotFoundError
from worker import deadletters
from worker.deadletters import DeadLetter

from ..errors import BadRequestError
from ..params import Query
from ..render import path_quote
from ..state import operator_of, web_of


def letter_page_of(request: Request) -> tuple[list[DeadLetter], str | None]:
    """A page of dead letters, newest first (the cursor holds the last one's id)."""
    q = Query.of(request, "cursor", "limit")
    limit, cursor = q.limit(), q.cursor()
    signer = web_of(request).services.store.cursors
    before = None
    if cursor is not None:
        (last,) = signer.decode(cursor, "dead_letters", (str,))
        before = dead_id(str(last))
    letters = deadletters.page(web_of(request).services.redis, before=before, count=limit + 1)
    shown = letters[:limit]
    more = len(letters) > limit and shown
    return shown, signer.encode("dead_letters", (shown[-1].id,)) if more else None


def letter_list(request: Request) -> Response:
    letters, next_cursor = letter_page_of(request)
    total = deadletters.count(web_of(request).services.redis)
    return web_of(request).render.page(
        request,
        "dead_letters.html",
        "_dead_letters.html",
        letters=letters,
        next_cursor=next_cursor,
        total=total,
    )


def letter_page(request: Request) -> Response:
    Query.of(request)  # takes none
    letter = get_letter(request)
    return web_of(request).render.page(request, "dead_letter.html", letter=letter)


def retry(request: Request, form: dict[str, str]) -> Response:
    letter, _ = retry_letter(request)
    if letter.operation_id:
        return RedirectResponse(f"/operations/{path_quote(letter.operation_id)}", 303)
    return RedirectResponse("/dead-letters", 303)


def discard(request: Request, form: dict[str, str]) -> Response:
    discard_letter(request)
    return RedirectResponse("/dead-letters", 303)


def retry_letter(request: Request) -> tuple[DeadLetter, str]:
    """Enqueue the letter's operation again on its partition; the audit trail says who."""
    web = web_of(request)
    letter = get_letter(request)
    entry = deadletters.retry(web.services.redis, letter.id)
    if entry is None:
        raise NotFoundError(f"no dead letter {letter.id}")
    web.services.store.audit.record(
        operator_of(request).name,
        "dead_letter.retry",
        letter.id,
        {"partition": letter.partition, "entry": entry, "operation_id": letter.operation_id},
    )
    return letter, entry


def discard_letter(request: Request) -> DeadLetter:
    web = web_of(request)
    letter = get_letter(request)
    if not deadletters.discard(web.services.redis, letter.id):
        raise NotFoundError(f"no dead letter {letter.id}")
    web.services.store.audit.record(
        operator_of(request).name,
        "dead_letter.discard",
        letter.id,
        {"partition": letter.partition, "operation_id": letter.operation_id},
    )
    return letter


def get_letter(request: Request) -> DeadLetter:
    letter_id = dead_id(request.path_params["letter_id"])
    letter = deadletters.get(web_of(request).services.redis, letter_id)
    if letter is None:
        raise NotFoundError(f"no dead letter {letter_id}")
    return letter


def dead_id(value: str) -> str:
    try:
        return deadletters.check_id(value)
    except Exception:
        raise BadRequestError("a dead letter id looks like 1700000000000-0") from None
