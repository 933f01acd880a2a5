"""Which operations have a model phase: seed 000's defaults, as pure functions.

``supersede`` is ``reconcile`` when the executor has a model and ``add`` when it
has none (a remember naming its record ``id`` adds); ``infer`` is true with a
model and false without. An explicit ``reconcile`` or ``infer: true`` without a
model is an ``InvalidRequestError`` that says what to configure.
"""

from __future__ import annotations

from ..errors import InvalidRequestError
from .operations import Extract, Remember, Request

CONFIGURE = (
    "configure a model (ENGRAM_LLM_URL and ENGRAM_LLM_MODEL for the workers, or llm= for a session)"
)


def supersede_of(request: Remember | Extract, has_llm: bool) -> str:
    if request.supersede is not None:
        return request.supersede
    if isinstance(request, Remember) and request.id is not None:
        return "add"  # the caller named the record: the text goes there
    return "reconcile" if has_llm else "add"


def infers(request: Extract, has_llm: bool) -> bool:
    return request.infer if request.infer is not None else has_llm


def needs_model(request: Request, has_llm: bool) -> bool:
    """Whether the operation has a model phase (which makes a call only when needed)."""
    if isinstance(request, Remember):
        return supersede_of(request, has_llm) == "reconcile"
    if isinstance(request, Extract):
        return infers(request, has_llm) or supersede_of(request, has_llm) == "reconcile"
    return False


def missing_model(request: Request) -> InvalidRequestError:
    if isinstance(request, Extract) and request.infer:
        what = "extract with infer"
    else:
        what = f"{request.kind_name} with supersede 'reconcile'"
    return InvalidRequestError(f"{what} needs a model: {CONFIGURE}")
