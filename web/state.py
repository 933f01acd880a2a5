"""What every view reaches through its request: the app's settings and services, and
the values too costly to compute at every poll."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, cast

from starlette.requests import Request

from .auth import Authenticator, Operator, grant_of
from .config import WebConfig
from .csrf import Csrf
from .oauth import Verifier
from .ratelimit import Limiter
from .render import Renderer
from .services import Services

T = TypeVar("T")

COSTLY_TTL_S = 30.0


class Costly:
    """Values computed at most every ``ttl_s`` seconds per name, however often pages poll
    (the overview's vector counts scan the vectors table). Time is what the caller says
    (the app's injected clock): a clock that went back recomputes.

    Two requests that find a value stale together may both compute it: harmless, and
    cheaper than making every poll wait on a lock."""

    def __init__(self, ttl_s: float = COSTLY_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._values: dict[str, tuple[float, object]] = {}

    def get(self, name: str, now_s: float, compute: Callable[[], T]) -> T:
        held = self._values.get(name)
        if held is not None and 0 <= now_s - held[0] < self.ttl_s:
            return cast(T, held[1])
        value = compute()
        self._values[name] = (now_s, value)
        return value


@dataclass(frozen=True, slots=True)
class WebState:
    config: WebConfig
    services: Services
    auth: Authenticator
    csrf: Csrf
    render: Renderer
    limiter: Limiter
    costly: Costly = field(default_factory=Costly)
    # The access tokens of the operator's authorization server (WebConfig.oauth), or None.
    oauth: Verifier | None = None


def web_of(request: Request) -> WebState:
    state: WebState = request.app.state.web
    return state


def actor_of(request: Request) -> str:
    """The name what this request asks for goes under: the scoped token's
    (``token:NAME``, authenticated) or the operator's."""
    grant = grant_of(request)
    return grant.actor if grant is not None else operator_of(request).name


def operator_of(request: Request) -> Operator:
    """Who is asking (the gate let them in, so there is someone)."""
    operator: Operator = request.state.operator
    return operator
