"""The API of the pipeline: start a reembed, jobs, dead letters."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from store.validation import Fields

from ..params import Query
from ..views import deadletters, jobs
from ..views.generations import start
from .serialize import dead_letter_json, job_json, page_json, queue_json


def reembed(request: Request, body: Any) -> Response:
    f = Fields(body, "reembed", ("model",))
    return JSONResponse({"job_id": start(request, f.get("model"))}, status_code=202)


def job_list(request: Request) -> Response:
    found = jobs.listing(request)
    return JSONResponse(
        {"queues": [queue_json(s) for s in found.summaries], **page_json(found.page, job_json)}
    )


def job(request: Request) -> Response:
    Query.of(request)  # takes none
    return JSONResponse(job_json(jobs.get_job(request)))


def job_retry(request: Request) -> Response:
    return JSONResponse(job_json(jobs.retry_job(request)))


def dead_letter_list(request: Request) -> Response:
    letters, next_cursor = deadletters.letter_page_of(request)
    return JSONResponse({"items": [dead_letter_json(d) for d in letters], "next": next_cursor})


def dead_letter(request: Request) -> Response:
    Query.of(request)  # takes none
    return JSONResponse(dead_letter_json(deadletters.get_letter(request)))


def dead_letter_retry(request: Request) -> Response:
    letter, entry = deadletters.retry_letter(request)
    return JSONResponse(
        {"operation_id": letter.operation_id, "partition": letter.partition, "entry": entry}
    )


def dead_letter_discard(request: Request) -> Response:
    Query.of(request)  # takes none
    deadletters.discard_letter(request)
    return Response(status_code=204)
