"""The API of the pipeline: start or cancel a reembed, jobs, dead letters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engram.store.errors import InvalidRequestError
from engram.store.read.listed import GenerationItem
from engram.store.write.validation import Fields

from ..bodies import read_json, why_of
from ..endpoints import Endpoint
from ..params import Query
from ..state import web_of
from ..views import deadletters, jobs
from ..views.generations import cancel_generation, start
from .serialize import audit_json, generation_json, job_json, page_json, queue_json


def reembed(request: Request, body: Any) -> Response:
    f = Fields(body, "reembed", ("model", "reason"))
    why = why_of(f.get("reason"))
    return JSONResponse({"job_id": start(request, f.get("model"), why)}, status_code=202)


def generation_cancel(request: Request, why: str | None) -> Response:
    ended = cancel_generation(request, why)
    vectors = web_of(request).services.store.embeddings.vector_count(ended.id)
    return JSONResponse(generation_json(GenerationItem(ended, vectors)))


def job_list(request: Request) -> Response:
    found = jobs.listing(request)
    return JSONResponse(
        {"queues": [queue_json(s) for s in found.summaries], **page_json(found.page, job_json)}
    )


def job(request: Request) -> Response:
    Query.of(request)  # takes none
    return JSONResponse(job_json(jobs.get_job(request)))


def job_retry(request: Request, why: str | None) -> Response:
    return JSONResponse(job_json(jobs.retry_job(request, why)))


def job_discard(request: Request, why: str | None) -> Response:
    return JSONResponse(job_json(jobs.discard_job(request, why)))


def job_bulk(request: Request, body: Any) -> Response:
    """Retry or discard every failed job of a queue: without ``confirm`` a dry run, as
    for dead letters; with it, the action, if the failed jobs are those the dry run saw."""
    f = Fields(body, "bulk", ("action", "filter", "reason", "confirm"))
    action = f.get("action")
    if action not in jobs.BULK_ACTIONS:
        raise InvalidRequestError("action must be retry or discard")
    found = f.get("filter") or {}
    if not isinstance(found, dict) or set(found) - {"queue"}:
        raise InvalidRequestError("filter is an object: {queue?}")
    why = why_of(f.get("reason"))  # checked even for a dry run
    bulk = jobs.plan(request, found.get("queue"), action)
    seen = {"count": bulk.count, "digest": bulk.digest}
    answer = {"action": bulk.action, "filter": {"queue": bulk.queue}, **seen}
    left = [j.id for j, _ in bulk.left]
    left_why = {j.id: reason for j, reason in bulk.left}
    if f.get("confirm") is None:
        items = [job_json(j) for j in bulk.taken[:20]]
        return JSONResponse(
            {
                **answer,
                "dry_run": True,
                "items": items,
                "left": left,
                "left_why": left_why,
                "confirm": seen,
            }
        )
    skipped = jobs.apply(request, bulk, f.get("confirm"), why)
    return JSONResponse(
        {
            **answer,
            "dry_run": False,
            "left": left,
            "left_why": left_why,
            "skipped": [{"id": s.id, "reason": s.reason} for s in skipped],
        }
    )


def dead_letter_list(request: Request) -> Response:
    letters, next_cursor = deadletters.letter_page_of(request)
    return JSONResponse({"items": [d.as_dict() for d in letters], "next": next_cursor})


def dead_letter(request: Request) -> Response:
    Query.of(request)  # takes none
    letter = deadletters.get_letter(request)
    earlier = deadletters.earlier_attempts(request, letter)
    return JSONResponse({**letter.as_dict(), "earlier_attempts": [audit_json(e) for e in earlier]})


def reasoned(view: Callable[[Request, str | None], Response]) -> Endpoint:
    """An action that takes nothing but, optionally, why: ``{}``, no body, or
    ``{"reason": "..."}`` (kept in the audit row)."""

    async def endpoint(request: Request) -> Response:
        body = await read_json(request, web_of(request).config.max_json_bytes, empty={})
        if not isinstance(body, dict) or set(body) - {"reason"}:
            raise InvalidRequestError('this action takes {} or {"reason": "..."}')
        why = why_of(body.get("reason"))
        return await run_in_threadpool(view, request, why)

    endpoint.__name__ = view.__name__
    return endpoint


def dead_letter_retry(request: Request, why: str | None) -> Response:
    letter, home, entry = deadletters.retry_letter(request, why)
    return JSONResponse({"operation_id": letter.operation_id, "partition": home, "entry": entry})


def dead_letter_discard(request: Request, why: str | None) -> Response:
    Query.of(request)  # takes none
    deadletters.discard_letter(request, why)
    return Response(status_code=204)


def dead_letter_bulk(request: Request, body: Any) -> Response:
    """Without ``confirm``, a dry run: the count and the first letters the action would
    take, and the ``confirm`` to send back; with it, the action, if the set is unchanged."""
    f = Fields(body, "bulk", ("action", "filter", "reason", "confirm"))
    found = f.get("filter")
    if found is not None and not isinstance(found, dict):
        raise InvalidRequestError("filter is an object: {reason?, partition?, code?, ...}")
    if found and set(found) - set(deadletters.MATCH_FIELDS):
        raise InvalidRequestError(f"filter takes {', '.join(deadletters.MATCH_FIELDS)}")
    why = why_of(f.get("reason"))  # checked even for a dry run
    bulk = deadletters.plan(request, f.get("action"), deadletters.match_of(request, found or {}))
    seen = {"count": bulk.count, "digest": bulk.digest}
    answer = {"action": bulk.action, "filter": bulk.match.as_dict(), **seen}
    if f.get("confirm") is None:
        items = [x.as_dict() for x, _ in bulk.taken[: deadletters.PREVIEW]]
        left = [x.id for x in bulk.left]
        return JSONResponse(
            {**answer, "dry_run": True, "items": items, "left": left, "confirm": seen}
        )
    deadletters.apply(request, bulk, f.get("confirm"), why)
    return JSONResponse({**answer, "dry_run": False})
