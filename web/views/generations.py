"""Embedding generations, the live progress of a reembed (its root cause when it
failed, superseded or cancelled), starting one and cancelling a pending one."""

from __future__ import annotations

from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from engram.jobs import reembed
from engram.jobs.progress import progress_of
from engram.store import Generation
from engram.store.errors import (
    EngramError,
    GenerationNotPendingError,
    InvalidRequestError,
    NotFoundError,
)
from engram.store.limits import MAX_ID_CHARS
from engram.store.values import check_string
from engram.worker.admin import pause

from .. import rqjobs
from ..bodies import why_of
from ..errors import BadRequestError, UnavailableError
from ..params import Query, integer
from ..state import operator_of, web_of

MAX_GENERATION_ID = 2**31 - 1  # a serial


def generation_list(request: Request) -> Response:
    started = Query.of(request, "cursor", "limit", "started").params.get("started")
    if started is None:
        return _list_page(request)
    try:  # the job the redirect after a start names, said above the list
        return _list_page(request, started=rqjobs.check_job_id(started))
    except InvalidRequestError as exc:
        raise BadRequestError(exc.message) from None


def _list_page(request: Request, *, status_code: int = 200, **asked: object) -> Response:
    """The generations, and the reembed form: filled with what was ``asked`` (the
    model and why typed, the refusal and what to do next) when a start was refused."""
    q = Query.of(request, "cursor", "limit", "started")
    web = web_of(request)
    page = web.services.store.browse.generations(cursor=q.cursor(), limit=q.limit())
    rows = [(g, progress_of(g.generation.progress)) for g in page.items]
    return web.render.page(
        request,
        "generations.html",
        "_generations.html",
        status_code=status_code,
        page=page,
        rows=rows,
        live=any(p is not None and p.live for _, p in rows),
        can_reembed=web.services.start_reembed is not None,
        model_names=web.services.embedders.described_names(),
        asked={"model": "", "why": "", "refused": None, "started": None, **asked},
        # A live reembed waits while the jobs are paused: its row says so.
        jobs_paused=pause.jobs_paused(web.services.jobs),
    )


def start_reembed(request: Request, form: dict[str, str]) -> Response:
    """Asked first (the form's Start): what starting would replace, to confirm with a
    why; confirmed (``confirm=yes``), start it, then the generations page saying so.
    Refused, the generations page with the form as typed, why, and what to ask for."""
    model, why = form.get("model", ""), form.get("why", "")
    try:
        if form.get("confirm") != "yes":
            return _confirm_start(request, registered(request, model), why)
        job_id = start(request, model, why_of(why))
    except EngramError as exc:
        if exc.status >= 500 and not isinstance(exc, UnavailableError):
            raise
        return _list_page(request, status_code=exc.status, model=model, why=why, refused=exc)
    return RedirectResponse(f"/generations?started={quote(job_id, safe='')}", status_code=303)


def _confirm_start(request: Request, model: str, why: str) -> Response:
    """The confirmation: the generation recall runs on now (retired, its vectors deleted,
    once the new one is complete) and a pending one of another model (retired at once)."""
    web = web_of(request)
    embeddings = web.services.store.embeddings
    if web.services.start_reembed is None:
        raise UnavailableError(
            "reembed jobs are not available in this deployment (no jobs service is configured)"
        )
    active = embeddings.active()
    pending = next((g for g in embeddings.all() if g.status == "pending"), None)
    return web.render.page(
        request,
        "generations.html",
        starting={"model": model, "why": why},
        active=active,
        active_vectors=embeddings.vector_count(active.id) if active else 0,
        pending=pending,
        pending_vectors=embeddings.vector_count(pending.id) if pending else 0,
        can_reembed=True,
    )


def registered(request: Request, model: object) -> str:
    """The model asked for, as a registered name (``UnregisteredModelError`` else)."""
    name = check_string(model, "model", max_chars=MAX_ID_CHARS)
    return web_of(request).services.embedders.check_registered(name)


def start(request: Request, model: object, why: str | None = None) -> str:
    """Start a reembed towards ``model`` for the operator asking; the job's id.
    The audit trail says who started it."""
    web = web_of(request)
    # Before anything else: a module path would be imported and called by the starter.
    name = registered(request, model)
    starter = web.services.start_reembed
    if starter is None:
        raise UnavailableError(
            "reembed jobs are not available in this deployment (no jobs service is configured)"
        )
    who = operator_of(request).name
    job_id = starter(name, who)
    detail = {"model": name} if why is None else {"model": name, "reason": why}
    web.services.store.audit.record(who, "reembed.start", job_id, detail)
    return job_id


def cancel_confirm(request: Request) -> Response:
    """The confirmation step: what cancelling this pending reembed will do."""
    Query.of(request)  # takes none
    web = web_of(request)
    generation = pending_generation(request)
    return web.render.page(
        request,
        "generations.html",
        cancelling=generation,
        progress=progress_of(generation.progress),
        vectors=web.services.store.embeddings.vector_count(generation.id),
        can_reembed=web.services.start_reembed is not None,
    )


def cancel(request: Request, form: dict[str, str]) -> Response:
    cancel_generation(request, why_of(form.get("why")))
    return RedirectResponse("/generations", status_code=303)


def cancel_generation(request: Request, why: str | None) -> Generation:
    """Cancel the pending generation of the path for the operator asking; audited."""
    return reembed.cancel(
        web_of(request).services.store,
        generation_id_of(request),
        requested_by=operator_of(request).name,
        why=why,
    )


def pending_generation(request: Request) -> Generation:
    generation_id = generation_id_of(request)
    generation = web_of(request).services.store.embeddings.get(generation_id)
    if generation is None:
        raise NotFoundError(f"no generation {generation_id}")
    if generation.status != "pending":
        raise GenerationNotPendingError(
            f"generation {generation_id} is {generation.status}: only a pending generation "
            "can be cancelled"
        )
    return generation


def generation_id_of(request: Request) -> int:
    value = str(request.path_params["generation_id"])
    return integer(value, "generation id", maximum=MAX_GENERATION_ID)
