"""Background jobs (RQ): every queue by state, a job with its error, retry."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from store import Page
from store.errors import InvalidRequestError, NotFoundError

from .. import rqjobs
from ..errors import BadRequestError
from ..params import Query
from ..render import path_quote
from ..state import operator_of, web_of


@dataclass(frozen=True, slots=True)
class Listing:
    summaries: list[rqjobs.QueueSummary]
    queue: str
    state: str
    page: Page[rqjobs.JobRow]


def listing(request: Request) -> Listing:
    """Every queue's counts, and a page of one queue's jobs in one state (by default the
    first queue's failed jobs: what an operator comes for)."""
    web = web_of(request)
    queues = web.config.job_queues
    q = Query.of(request, "queue", "state", "cursor", "limit")
    queue = q.choice("queue", queues, queues[0]) or queues[0]
    state = q.choice("state", rqjobs.JOB_STATES, "failed") or "failed"
    page = rqjobs.page(
        web.services.redis,
        queue,
        state,
        cursor=q.cursor(),
        limit=q.limit(),
        signer=web.services.store.cursors,
    )
    return Listing(rqjobs.summaries(web.services.redis, queues), queue, state, page)


def job_list(request: Request) -> Response:
    found = listing(request)
    return web_of(request).render.page(
        request,
        "jobs.html",
        "_jobs.html",
        summaries=found.summaries,
        queue=found.queue,
        state=found.state,
        page=found.page,
        states=rqjobs.JOB_STATES,
    )


def job_page(request: Request) -> Response:
    Query.of(request)  # takes none
    job = get_job(request)
    return web_of(request).render.page(request, "job.html", job=job)


def retry(request: Request, form: dict[str, str]) -> Response:
    job = retry_job(request)
    return RedirectResponse(f"/jobs/{path_quote(job.id)}", status_code=303)


def retry_job(request: Request) -> rqjobs.JobRow:
    web = web_of(request)
    job_id = job_id_of(request)
    job = rqjobs.retry(web.services.redis, job_id)
    web.services.store.audit.record(
        operator_of(request).name, "job.retry", job_id, {"queue": job.queue}
    )
    return job


def get_job(request: Request) -> rqjobs.JobRow:
    job_id = job_id_of(request)
    job = rqjobs.get(web_of(request).services.redis, job_id)
    if job is None:
        raise NotFoundError(f"no job {job_id}")
    return job


def job_id_of(request: Request) -> str:
    try:
        return rqjobs.check_job_id(request.path_params["job_id"])
    except InvalidRequestError as exc:
        raise BadRequestError(exc.message) from None
