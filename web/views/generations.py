"""Embedding generations, the live progress of a reembed, and starting one."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from store.limits import MAX_ID_CHARS
from store.model import check_string

from ..errors import UnavailableError
from ..params import Query
from ..progress import progress_of
from ..state import operator_of, web_of


def generation_list(request: Request) -> Response:
    q = Query.of(request, "cursor", "limit")
    web = web_of(request)
    page = web.services.store.browse.generations(cursor=q.cursor(), limit=q.limit())
    rows = [(g, progress_of(g.generation.progress)) for g in page.items]
    return web.render.page(
        request,
        "generations.html",
        "_generations.html",
        page=page,
        rows=rows,
        live=any(p is not None and p.live for _, p in rows),
        can_reembed=web.services.start_reembed is not None,
    )


def start_reembed(request: Request, form: dict[str, str]) -> Response:
    job_id = start(request, form.get("model", ""))
    del job_id  # the generations page shows it, with the progress
    return RedirectResponse("/generations", status_code=303)


def start(request: Request, model: object) -> str:
    """Start a reembed towards ``model`` for the operator asking; the job's id.
    The audit trail says who started it."""
    web = web_of(request)
    name = check_string(model, "model", max_chars=MAX_ID_CHARS)
    # Before anything else: a module path would be imported and called by the starter.
    name = web.services.embedders.check_registered(name)
    starter = web.services.start_reembed
    if starter is None:
        raise UnavailableError(
            "reembed jobs are not available in this deployment (no jobs service is configured)"
        )
    who = operator_of(request).name
    job_id = starter(name, who)
    web.services.store.audit.record(who, "reembed.start", job_id, {"model": name})
    return job_id
