"""Dead letters: the entries no worker could apply, with why; retry or discard, one at
a time or every one a filter matches (after a dry run that shows which)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from engram.store.audit import AuditEntry
from engram.store.errors import InvalidRequestError, NotFoundError
from engram.store.read.paging import Page, paged
from engram.store.values import SCOPE_FIELDS
from engram.store.write.operations import OPERATION_KINDS
from engram.worker.admin import deadletter_selection as selection
from engram.worker.admin import deadletters
from engram.worker.admin.deadletter_selection import Bulk, Match
from engram.worker.admin.deadletters import DeadLetter
from engram.worker.errors import SelectionChangedError
from engram.worker.layout import Epoch
from engram.worker.producer import Producer

from ..bodies import why_of
from ..errors import BadRequestError
from ..params import Query
from ..render import path_quote
from ..state import operator_of, web_of

MATCH_FIELDS = selection.MATCH_FIELDS
PREVIEW = 20  # letters a dry run lists
MAX_READ = 5_000  # letters a filtered page reads at most


def match_of(request: Request, params: Mapping[str, Any]) -> Match:
    """The filter in ``params`` (a query, a form or a JSON object): a reason, a partition,
    an error code, an operation kind, a span of time; an operation id, a record id, scope
    fields (``selection.match_from``, which the CLI reads its options with too)."""
    try:
        return selection.match_from(params)
    except InvalidRequestError as exc:
        raise BadRequestError(exc.message) from None


def plan(request: Request, action: str, match: Match) -> Bulk:
    web = web_of(request)
    try:
        return selection.plan(
            web.services.redis, action, match, partitions=web.services.producer.partitions
        )
    except InvalidRequestError as exc:
        if action not in selection.BULK_ACTIONS:
            raise BadRequestError(exc.message) from None
        raise


def apply(request: Request, bulk: Bulk, seen: Any, why: str | None) -> int:
    """Do ``bulk`` if it takes the letters its dry run saw (``seen``: count and digest)."""
    seen = seen if isinstance(seen, Mapping) else {}
    bulk.check(seen.get("count"), seen.get("digest"))
    web = web_of(request)
    return selection.apply_bulk(
        web.services.redis, web.services.store.audit, operator_of(request).name, bulk, why
    )


def filter_query(match: Match) -> str:
    return urlencode({k: v for k, v in match.as_dict().items() if v is not None})


def form_values(match: Match) -> dict[str, str]:
    """The filter as the list's form shows it (times in UTC, as a datetime-local field
    takes them)."""
    values = dict.fromkeys(MATCH_FIELDS, "")
    values.update({k: "" if v is None else str(v) for k, v in match.as_dict().items()})
    for name, at_ms in (("since", match.since_ms), ("until", match.until_ms)):
        if at_ms is not None:
            spec = "seconds" if at_ms % 1000 == 0 else "milliseconds"
            values[name] = (
                datetime.fromtimestamp(at_ms // 1000, UTC)
                .replace(tzinfo=None, microsecond=at_ms % 1000 * 1000)
                .isoformat(timespec=spec)
            )
    return values


@dataclass(frozen=True, slots=True)
class LetterPage:
    letters: list[DeadLetter]
    next: str | None  # the cursor of the next page
    cut_after: int | None  # letters read when the search stopped at its bound, else None


def letter_page_of(request: Request) -> tuple[list[DeadLetter], str | None]:
    found = letters_of(request)
    return found.letters, found.next


def letters_of(request: Request) -> LetterPage:
    """A page of dead letters, newest first (the cursor holds the id to read on from).
    With a filter, at most ``MAX_READ`` letters are read: a filter that matches few
    shows what it found so far, and the next page searches on."""
    q = Query.of(request, "cursor", "limit", *selection.MATCH_FIELDS)
    limit, cursor = q.limit(), q.cursor()
    match = match_of(request, q.params)
    signer = web_of(request).services.store.cursors
    before = None
    if cursor is not None:
        (last,) = signer.decode(cursor, "dead_letters", (str,))
        before = dead_id(str(last))
    found = selection.search(
        web_of(request).services.redis, match, before=before, limit=limit + 1, max_read=MAX_READ
    )
    if found.last_read is not None:
        cut = signer.encode("dead_letters", (found.last_read,))
        return LetterPage(found.letters[:limit], cut, found.read)
    page: Page[DeadLetter] = paged(
        found.letters, limit, (signer, "dead_letters"), lambda d: (d.id,), lambda d: d
    )
    return LetterPage(page.items, page.next, None)


def _epoch_now(producer: Producer) -> Epoch:
    """The partitions producers send to: the layout in Redis (a repartition's), else the
    configured count."""
    return producer.layout(fresh=True).current


def letter_list(request: Request) -> Response:
    found = letters_of(request)
    match = match_of(request, request.query_params)
    total = deadletters.count(web_of(request).services.redis)
    now = _epoch_now(web_of(request).services.producer)
    return web_of(request).render.page(
        request,
        "dead_letters.html",
        "_dead_letters.html",
        letters=found.letters,
        next_cursor=found.next,
        cut_after=found.cut_after,
        total=total,
        homes={x.id: deadletters.home_partition(x, now) for x in found.letters},
        kinds_of={x.id: selection.kind_of(x) for x in found.letters},
        match=match,
        filters=form_values(match),
        filter_query=filter_query(match),
        reasons=deadletters.REASONS,
        kinds=OPERATION_KINDS,
        scope_fields=SCOPE_FIELDS,
    )


def bulk_page(request: Request) -> Response:
    """The dry run: how many letters, and which, an action on the filter would take."""
    q = Query.of(request, "action", *selection.MATCH_FIELDS)
    action = q.choice("action", selection.BULK_ACTIONS) or "discard"
    return _dry_run(request, plan(request, action, match_of(request, q.params)))


def _dry_run(request: Request, bulk: Bulk, status_code: int = 200, **refused: Any) -> Response:
    return web_of(request).render.page(
        request,
        "dead_letters.html",
        "_bulk.html",
        status_code=status_code,
        bulk=bulk,
        preview=bulk.taken[:PREVIEW],
        filter_query=filter_query(bulk.match),
        why=refused.get("why", ""),
        refused=refused.get("refused"),
    )


def bulk(request: Request, form: dict[str, str]) -> Response:
    """The confirmed action, then what was done (each letter, and where to follow it).
    Refused because the matching letters changed since the dry run: the dry run of
    what matches now, with the filter and the why as typed, to confirm again."""
    count = form.get("count", "")
    seen = {"count": int(count) if count.isdigit() else None, "digest": form.get("digest")}
    done = plan(request, form.get("action", ""), match_of(request, form))
    try:
        apply(request, done, seen, why_of(form.get("why")))
    except SelectionChangedError as exc:
        return _dry_run(request, done, exc.status, why=form.get("why", ""), refused=exc)
    return web_of(request).render.page(
        request,
        "dead_letters.html",
        "_bulk_done.html",
        kind="dead letters",
        done=done,
        why=why_of(form.get("why")),
        filter_query=filter_query(done.match),
    )


def confirm_discard(request: Request) -> Response:
    Query.of(request)  # takes none
    letter = get_letter(request)
    earlier = earlier_attempts(request, letter)
    return web_of(request).render.page(
        request, "dead_letter.html", letter=letter, confirm=True, earlier=earlier
    )


def letter_page(request: Request) -> Response:
    Query.of(request)  # takes none
    letter = get_letter(request)
    web = web_of(request)
    home = deadletters.home_partition(letter, _epoch_now(web.services.producer))
    return web.render.page(
        request,
        "dead_letter.html",
        letter=letter,
        home=home,
        earlier=earlier_attempts(request, letter),
    )


def earlier_attempts(request: Request, letter: DeadLetter) -> list[AuditEntry]:
    """The retries of this letter's operation before it was dead-lettered again."""
    if letter.operation_id is None:
        return []
    return web_of(request).services.store.audit.retries_of(letter.operation_id)


def retry(request: Request, form: dict[str, str]) -> Response:
    letter, _, _ = retry_letter(request, why_of(form.get("why")))
    if letter.operation_id:
        scope = letter.scope  # an operation id is its scope's: the page is told which
        query = f"?{urlencode(scope.as_dict())}" if scope is not None else ""
        return RedirectResponse(f"/operations/{path_quote(letter.operation_id)}{query}", 303)
    return RedirectResponse("/dead-letters", 303)


def discard(request: Request, form: dict[str, str]) -> Response:
    discard_letter(request, why_of(form.get("why")))
    return RedirectResponse("/dead-letters", 303)


def retry_letter(request: Request, why: str | None = None) -> tuple[DeadLetter, int, str]:
    """Enqueue the letter's operation again on the partition its scope belongs to (a letter
    that can never be applied is refused); the audit trail says who and why."""
    letter = get_letter(request)
    home = deadletters.home_partition(letter, _epoch_now(web_of(request).services.producer))
    if home is None:
        raise InvalidRequestError(
            f"dead letter {letter.id} holds no operation valid on any partition: discard it"
        )
    return letter, home, _retry(request, letter, home, why)


def discard_letter(request: Request, why: str | None = None) -> DeadLetter:
    letter = get_letter(request)
    _discard(request, letter, why)
    return letter


def _retry(request: Request, letter: DeadLetter, home: int | None, why: str | None) -> str:
    web = web_of(request)
    return deadletters.retry_audited(
        web.services.redis, web.services.store.audit, operator_of(request).name, letter, home, why
    )


def _discard(request: Request, letter: DeadLetter, why: str | None) -> None:
    web = web_of(request)
    deadletters.discard_audited(
        web.services.redis, web.services.store.audit, operator_of(request).name, letter, why
    )


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
