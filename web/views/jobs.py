"""Background jobs (RQ): every queue by state, a job with its error; retry or discard
one failed job, or every failed job of a queue (after a dry run that shows which)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from engram.store import Page
from engram.store.errors import InvalidRequestError, NotFoundError
from engram.worker.errors import SelectionChangedError

from .. import rqjobs
from ..bodies import why_of
from ..errors import BadRequestError
from ..params import Query
from ..render import path_quote
from ..state import operator_of, web_of


@dataclass(frozen=True, slots=True)
class Listing:
    summaries: list[rqjobs.QueueSummary]
    queue: str
    state: str
    where: rqjobs.JobFilter
    found: rqjobs.JobPage

    @property
    def page(self) -> Page[rqjobs.JobRow]:
        return self.found.page


JOB_FILTERS = ("queue", "state", "function", "ticks")


def listing(request: Request, *, ticks_shown: bool = True) -> Listing:
    """Every queue's counts, and a page of one queue's jobs in one state (by default the
    first queue's failed jobs: what an operator comes for), of one function if asked;
    the scheduled maintenance ticks shown unless ``ticks=hide`` (or, by default, unless
    ``ticks_shown`` is False and not ``ticks=show``)."""
    web = web_of(request)
    queues = web.config.job_queues
    q = Query.of(request, *JOB_FILTERS, "cursor", "limit")
    queue = q.choice("queue", queues, queues[0]) or queues[0]
    state = q.choice("state", rqjobs.JOB_STATES, "failed") or "failed"
    ticks = q.choice("ticks", ("show", "hide"), "show" if ticks_shown else "hide")
    where = rqjobs.JobFilter(q.choice("function", rqjobs.JOB_FUNCTIONS), ticks == "show")
    found = rqjobs.find(
        web.services.jobs,
        queue,
        state,
        where,
        cursor=q.cursor(),
        limit=q.limit(),
        signer=web.services.store.cursors,
    )
    return Listing(rqjobs.summaries(web.services.jobs, queues), queue, state, where, found)


def job_list(request: Request) -> Response:
    """The dashboard's list hides the maintenance ticks unless asked (``ticks=show``):
    a prune every hour would bury the jobs that matter."""
    found = listing(request, ticks_shown=False)
    return web_of(request).render.page(
        request,
        "jobs.html",
        "_jobs.html",
        summaries=found.summaries,
        queue=found.queue,
        state=found.state,
        where=found.where,
        page=found.page,
        hidden_ticks=found.found.hidden_ticks,
        cut_after=found.found.cut_after,
        states=rqjobs.JOB_STATES,
        functions=rqjobs.JOB_FUNCTIONS,
        queues=web_of(request).config.job_queues,
    )


def job_page(request: Request) -> Response:
    Query.of(request)  # takes none
    job = get_job(request)
    return web_of(request).render.page(
        request, "job.html", "_job.html", job=job, confirm_discard=False
    )


def retry(request: Request, form: dict[str, str]) -> Response:
    job = retry_job(request, why_of(form.get("why")))
    return RedirectResponse(f"/jobs/{path_quote(job.id)}", status_code=303)


def confirm_discard(request: Request) -> Response:
    """A discard asks first: the job, its error, and a why."""
    Query.of(request)  # takes none
    job = get_job(request)
    return web_of(request).render.page(request, "job.html", job=job, confirm_discard=True)


def discard(request: Request, form: dict[str, str]) -> Response:
    job = discard_job(request, why_of(form.get("why")))
    return RedirectResponse(f"/jobs?queue={path_quote(job.queue)}&state=failed", 303)


def retry_job(request: Request, why: str | None = None) -> rqjobs.JobRow:
    return _act(request, "retry", job_id_of(request), why)


def discard_job(request: Request, why: str | None = None) -> rqjobs.JobRow:
    return _act(request, "discard", job_id_of(request), why)


def _act(
    request: Request, action: str, job_id: str, why: str | None, bulk: int = 0
) -> rqjobs.JobRow:
    """Retry or discard one failed job, then its audit row: who, why, the queue."""
    web = web_of(request)
    act = rqjobs.retry if action == "retry" else rqjobs.discard
    job = act(web.services.jobs, job_id)
    detail: dict[str, Any] = {"queue": job.queue}
    if why is not None:
        detail["reason"] = why
    if bulk:
        detail["bulk"] = bulk  # one of this many, confirmed together
    web.services.store.audit.record(operator_of(request).name, f"job.{action}", job_id, detail)
    return job


BULK_ACTIONS = ("retry", "discard")


@dataclass(frozen=True, slots=True)
class JobBulk:
    """What retrying or discarding a queue's failed jobs would do: the jobs it takes,
    exactly those the action on one job accepts, and the ones it leaves with why (a
    retry leaves the unreadable ones, which never run, and the ones listed among the
    failed jobs whose own state is another)."""

    action: str
    queue: str
    taken: list[rqjobs.JobRow]
    left: list[tuple[rqjobs.JobRow, str]]

    @property
    def count(self) -> int:
        return len(self.taken)

    @property
    def digest(self) -> str:
        return rqjobs.digest([j.id for j in self.taken])


@dataclass(frozen=True, slots=True)
class Skipped:
    """A job a confirmed bulk action took but did not act on: it changed in between."""

    id: str
    reason: str


def plan(request: Request, queue: object, action: object = "retry") -> JobBulk:
    queues = web_of(request).config.job_queues
    if queue in (None, ""):
        queue = queues[0]
    if not isinstance(queue, str) or queue not in queues:
        raise BadRequestError(f"queue must be one of {', '.join(queues)}")
    if action not in BULK_ACTIONS:
        raise BadRequestError("action must be retry or discard")
    found = rqjobs.failed(web_of(request).services.jobs, queue)
    if len(found) > rqjobs.MAX_BULK:
        raise InvalidRequestError(
            f"more than {rqjobs.MAX_BULK} failed jobs: {action} fewer at a time"
        )
    if action == "discard":  # a discard takes every job listed among the failed ones
        return JobBulk("discard", queue, found, [])
    verdicts = [(j, rqjobs.not_retried(j)) for j in found]
    taken = [j for j, why in verdicts if why is None]
    return JobBulk("retry", queue, taken, [(j, why) for j, why in verdicts if why is not None])


def apply(request: Request, bulk: JobBulk, seen: Any, why: str | None) -> list[Skipped]:
    """Retry or discard the jobs of ``bulk`` if they are those its dry run saw (count
    and digest), else nothing. A job that changed since ``bulk`` was planned (a moment
    ago: another operator, a worker) is skipped, not an error halfway through: the
    jobs skipped, and why."""
    seen = seen if isinstance(seen, Mapping) else {}
    if seen.get("count") != bulk.count or seen.get("digest") != bulk.digest:
        raise SelectionChangedError(
            f"{bulk.count} failed jobs match now, not the ones the dry run showed: look again"
        )
    skipped = []
    for job in bulk.taken:
        try:
            _act(request, bulk.action, job.id, why, bulk.count)
        except (InvalidRequestError, NotFoundError) as exc:
            skipped.append(Skipped(job.id, exc.message))
    return skipped


def bulk_page(request: Request) -> Response:
    """The dry run: which failed jobs of a queue a bulk retry or discard would take."""
    q = Query.of(request, "queue", "action")
    return _dry_run(
        request, plan(request, q.params.get("queue"), q.params.get("action") or "retry")
    )


def _dry_run(request: Request, bulk: JobBulk, status_code: int = 200, **refused: Any) -> Response:
    return web_of(request).render.page(
        request,
        "jobs.html",
        "_bulk.html",
        status_code=status_code,
        kind="jobs",
        bulk=bulk,
        preview=bulk.taken[:20],
        why=refused.get("why", ""),
        refused=refused.get("refused"),
    )


def bulk(request: Request, form: dict[str, str]) -> Response:
    """The confirmed action, then what was done: the jobs, each skipped one and why, and
    where to go next. Refused because the failed jobs changed since the dry run: the
    dry run of the jobs now, with the why as typed, to confirm again."""
    count = form.get("count", "")
    seen = {"count": int(count) if count.isdigit() else None, "digest": form.get("digest")}
    done = plan(request, form.get("queue"), form.get("action") or "retry")
    try:
        skipped = apply(request, done, seen, why_of(form.get("why")))
    except SelectionChangedError as exc:
        return _dry_run(request, done, exc.status, why=form.get("why", ""), refused=exc)
    return web_of(request).render.page(
        request,
        "jobs.html",
        "_bulk_done.html",
        kind="jobs",
        done=done,
        skipped=skipped,
        why=why_of(form.get("why")),
    )


def get_job(request: Request) -> rqjobs.JobRow:
    job_id = job_id_of(request)
    job = rqjobs.get(web_of(request).services.jobs, job_id)
    if job is None:
        raise NotFoundError(f"no job {job_id}")
    return job


def job_id_of(request: Request) -> str:
    try:
        return rqjobs.check_job_id(request.path_params["job_id"])
    except InvalidRequestError as exc:
        raise BadRequestError(exc.message) from None
