"""Pausing and resuming from the dashboard: a partition's consumption, the jobs queues
(``worker.pause``). Each action is a CSRF-checked form (or an API call) and writes an
audit row under the operator signed in."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from engram.jobs.runner import pause_reports
from engram.store.errors import NotFoundError
from engram.worker import layout
from engram.worker.admin import pause
from engram.worker.admin.pause import MAX_REASON_CHARS, Pause, PausedState
from engram.worker.consuming.membership import live_workers

from ..errors import BadRequestError
from ..state import operator_of, web_of


def state(request: Request) -> PausedState:
    services = web_of(request).services
    return pause.paused(services.redis, services.jobs)


@dataclass(frozen=True, slots=True)
class Seen:
    """Whether a pause is in effect: the live workers it concerns, the ids of those yet
    to see it and, for the jobs, the jobs still in the hands of those."""

    workers: int
    waiting: tuple[str, ...]
    running: tuple[str, ...] = ()

    @property
    def in_effect(self) -> bool:
        return not self.waiting


def seen(request: Request, paused: PausedState) -> dict[str, Seen]:
    """For each pause of ``paused``, keyed by its partition's number (``"jobs"`` for
    the jobs), which live workers have seen it (``worker.pause``)."""
    services, config = web_of(request).services, web_of(request).config
    found: dict[str, Seen] = {}
    if paused.partitions:
        workers = live_workers(services.redis, config.lease_ttl_ms)
        for number in paused.partitions:
            waiting = pause.not_yet_seen(number, workers)
            found[str(number)] = Seen(len(workers), tuple(waiting))
    if paused.jobs is not None:
        reports = pause_reports(services.jobs)
        waiting = pause.jobs_not_yet_seen(paused.jobs, reports)
        running = tuple(str(r["job"]) for r in reports if r["name"] in waiting and r["job"])
        found["jobs"] = Seen(len(reports), tuple(waiting), running)
    return found


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


def reason_of(form: dict[str, str]) -> str:
    """A form's why, under the API's rule (and every other why's): at most
    ``MAX_REASON_CHARS`` characters, else a 400 that changes nothing, never cut short."""
    reason = form.get("reason", "")
    if len(reason) > MAX_REASON_CHARS:
        raise BadRequestError(f"reason must be text of {MAX_REASON_CHARS} characters at most")
    return reason


def pause_partition_form(request: Request, form: dict[str, str]) -> Response:
    number = form.get("partition", "")
    if not (number.isascii() and number.isdigit()) or len(number) > 6:
        raise BadRequestError("partition must be a partition's number")
    pause_partition(request, int(number), reason_of(form))
    return RedirectResponse("/", 303)


def resume_partition_form(request: Request, form: dict[str, str]) -> Response:
    resume_partition(request, number_in_path(request), reason_of(form))
    return RedirectResponse("/", 303)


def pause_jobs_form(request: Request, form: dict[str, str]) -> Response:
    pause_jobs(request, reason_of(form))
    return RedirectResponse("/", 303)


def resume_jobs_form(request: Request, form: dict[str, str]) -> Response:
    resume_jobs(request, reason_of(form))
    return RedirectResponse("/", 303)
