"""Pausing and resuming from the dashboard: a partition's consumption, the jobs queues
(``worker.pause``). Each action is a CSRF-checked form (or an API call) and writes an
audit row under the operator signed in."""

from __future__ import annotations

import redis
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from store.errors import NotFoundError
from worker import layout, pause
from worker.pause import Pause, PausedState

from ..errors import BadRequestError
from ..state import operator_of, web_of


def state(request: Request) -> PausedState:
    services = web_of(request).services
    return pause.paused(services.redis, services.jobs)


def pause_partition(request: Request, number: int, reason: str) -> Pause:
    check(request, number)
    return _hold(request, number, reason)


def resume_partition(request: Request, number: int, why: str = "") -> bool:
    check(request, number)
    return _release(request, number, why)


def pause_jobs(request: Request, reason: str) -> Pause:
    return _hold(request, None, reason)


def resume_jobs(request: Request, why: str = "") -> bool:
    return _release(request, None, why)


def _hold(request: Request, partition: int | None, reason: str) -> Pause:
    web = web_of(request)
    held = Pause.now(operator_of(request).name, reason)
    pause.hold(_client(request, partition), web.services.store.audit, partition, held)
    return held


def _release(request: Request, partition: int | None, why: str) -> bool:
    web = web_of(request)
    who = operator_of(request).name
    client = _client(request, partition)
    return pause.release(client, web.services.store.audit, who, partition, why)


def _client(request: Request, partition: int | None) -> redis.Redis:
    """A partition's pause is the streams'; the jobs' (RQ's suspension) is theirs."""
    services = web_of(request).services
    return services.redis if partition is not None else services.jobs


def number_in_path(request: Request) -> int:
    value = str(request.path_params["partition"])
    if not (value.isascii() and value.isdigit()) or len(value) > 6:
        raise BadRequestError("a partition is a number, from 0")
    return int(value)


def check(request: Request, number: int) -> None:
    web = web_of(request)
    # A pause names a partition of the epoch the workers serve (``worker.layout``).
    served = layout.read(web.services.redis, web.config.partitions).serving.partitions
    try:
        pause.check_partition(number, served)
    except ValueError as exc:
        raise NotFoundError(str(exc)) from None


# -- the overview's forms --------------------------------------------------------------


def pause_partition_form(request: Request, form: dict[str, str]) -> Response:
    number = form.get("partition", "")
    if not (number.isascii() and number.isdigit()) or len(number) > 6:
        raise BadRequestError("partition must be a partition's number")
    pause_partition(request, int(number), form.get("reason", ""))
    return RedirectResponse("/", 303)


def resume_partition_form(request: Request, form: dict[str, str]) -> Response:
    resume_partition(request, number_in_path(request), form.get("reason", ""))
    return RedirectResponse("/", 303)


def pause_jobs_form(request: Request, form: dict[str, str]) -> Response:
    pause_jobs(request, form.get("reason", ""))
    return RedirectResponse("/", 303)


def resume_jobs_form(request: Request, form: dict[str, str]) -> Response:
    resume_jobs(request, form.get("reason", ""))
    return RedirectResponse("/", 303)
