"""What a scoped token may reach: the routes marked for it, on its own scope only.

A route takes a token only if its view is marked with ``for_tokens``; every
other route (the operator's lists and actions, every page) refuses one with a
403 before its view runs, so a route added later is the operator's until it is
marked. A marked view checks the rest itself: the capability (403 without it)
and the scope, which is the token's and never the request's. Another scope's
record is answered like an unknown one (404, nothing of it said).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from starlette.requests import Request

from engram.store.errors import NotFoundError
from engram.store.tokens import CAPABILITIES, Grant
from engram.store.values import Scope

from .auth import grant_of
from .errors import ForbiddenError
from .oauth import InsufficientScopeError
from .state import web_of

V = TypeVar("V", bound=Callable[..., Any])
_MARK = "engram_takes_tokens"


def for_tokens(view: V) -> V:
    """Mark ``view`` as one a scoped token may call (it checks scope and capability)."""
    setattr(view, _MARK, True)
    return view


def takes_tokens(view: Callable[..., Any]) -> bool:
    return bool(getattr(view, _MARK, False))


def refuse_unless_marked(request: Request, view: Callable[..., Any]) -> None:
    """A scoped token on a route not marked for it: 403 (it is never an operator)."""
    if grant_of(request) is not None and not takes_tokens(view):
        raise ForbiddenError(
            "a scoped token reaches its own scope's records, recall, operations and "
            "receipts only: this is the operator's"
        )


def capable(request: Request, capability: str) -> Grant | None:
    """The request's grant if it has ``capability`` (403 if not) and is within its rate
    limit (429 if not); None for an operator."""
    grant = grant_of(request)
    if grant is not None:
        if not grant.allows(capability):
            raise InsufficientScopeError(refusal(grant, capability), capability=capability)
        web_of(request).limiter.take(grant, capability)
    return grant


def refusal(grant: Grant, capability: str) -> str:
    """Why a token may not use ``capability``, and what it may use instead."""
    allowed = ", ".join(c for c in CAPABILITIES if c in grant.can)
    return (
        f"token {grant.name} lacks the {capability!r} capability; it may use {allowed}."
        " Ask the operator for a token that has it"
    )


def own_scope(grant: Grant, given: Mapping[str, Any] | Scope | None) -> dict[str, str]:
    """The scope a token's request acts on: its own. A request may repeat it, never name
    another (404, as for a scope with nothing in it for this token)."""
    if given is not None and not grant.covers(given):
        raise NotFoundError("nothing here for this token: a scoped token acts on its own scope")
    return dict(grant.scope)


def log_reads(request: Request, grant: Grant | None, tool: str, returned: Iterable[Any]) -> None:
    """Log what a token's read returned: ``(record_id, revision)`` pairs, nothing else."""
    if grant is not None:
        web_of(request).services.store.tokens.log_reads(grant, tool, returned)
