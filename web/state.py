"""What every view reaches through its request: the app's settings and services."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from .auth import Authenticator, Operator
from .config import WebConfig
from .csrf import Csrf
from .render import Renderer
from .services import Services


@dataclass(frozen=True, slots=True)
class WebState:
    config: WebConfig
    services: Services
    auth: Authenticator
    csrf: Csrf
    render: Renderer


def web_of(request: Request) -> WebState:
    state: WebState = request.app.state.web
    return state


def operator_of(request: Request) -> Operator:
    """Who is asking (the gate let them in, so there is someone)."""
    operator: Operator = request.state.operator
    return operator
