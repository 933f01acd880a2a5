"""The API of pausing: ``POST /api/v1/partitions/{n}/pause|resume``, ``POST
/api/v1/queues/pause|resume`` (a JSON body: ``{}``, nothing, or ``{"reason": "..."}``:
why, kept in the audit row) and ``GET /api/v1/paused``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engram.store.errors import InvalidRequestError
from engram.worker.admin.pause import MAX_REASON_CHARS

from ..bodies import read_json
from ..endpoints import Endpoint
from ..params import Query
from ..state import web_of
from ..views import pause


def with_reason(view: Callable[[Request, str], Response]) -> Endpoint:
    """A pause or a resume: ``{}``, no body, or ``{"reason": "..."}`` (up to 200
    characters, kept in the audit row)."""

    async def endpoint(request: Request) -> Response:
        body = await read_json(request, web_of(request).config.max_json_bytes, empty={})
        if not isinstance(body, dict) or set(body) - {"reason"}:
            raise InvalidRequestError('a pause or resume takes {} or {"reason": "..."}')
        reason = body.get("reason", "")
        if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
            raise InvalidRequestError(
                f"reason must be text of {MAX_REASON_CHARS} characters at most"
            )
        return await run_in_threadpool(view, request, reason)

    endpoint.__name__ = view.__name__
    return endpoint


def paused(request: Request) -> Response:
    """What is paused, and whether each pause is in effect (every live worker it
    concerns has seen it; ``pause.seen``)."""
    Query.of(request)  # takes none
    state = pause.state(request)
    seen = pause.seen(request, state)
    body = state.as_dict()
    for entry in body["partitions"]:
        body_seen(entry, seen[str(entry["partition"])])
    if state.jobs is not None:
        body_seen(body["jobs"], seen["jobs"])
        body["jobs"]["running"] = list(seen["jobs"].running)
    return JSONResponse(body)


def body_seen(entry: dict[str, Any], seen: pause.Seen) -> None:
    entry["in_effect"] = seen.in_effect
    entry["waiting_for"] = list(seen.waiting)


def partition_pause(request: Request, reason: str) -> Response:
    Query.of(request)  # takes none
    number = pause.number_in_path(request)
    held = pause.pause_partition(request, number, reason)
    return JSONResponse({"partition": number, "paused": True, **held.as_dict()})


def partition_resume(request: Request, reason: str) -> Response:
    Query.of(request)  # takes none
    number = pause.number_in_path(request)
    was = pause.resume_partition(request, number, reason)
    return JSONResponse({"partition": number, "paused": False, "was_paused": was})


def jobs_pause(request: Request, reason: str) -> Response:
    Query.of(request)  # takes none
    held = pause.pause_jobs(request, reason)
    return JSONResponse({"paused": True, **held.as_dict()})


def jobs_resume(request: Request, reason: str) -> Response:
    Query.of(request)  # takes none
    return JSONResponse({"paused": False, "was_paused": pause.resume_jobs(request, reason)})
