"""The model a store asks: a protocol (system and user text in, text out), and
``ask``, the one place a model is called, timed and counted.

Any callable ``llm(prompt) -> str | Completion`` is an ``LLM``: a function in a
test, ``OpenAICompatibleLLM`` (``store.models.llm_client``) against any
chat-completions endpoint. Return a ``Completion`` to report token usage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeVar

from ..errors import EngramError, ModelOutputError, ModelUnavailableError
from ..limits import MAX_MODEL_ANSWER_CHARS

log = logging.getLogger(__name__)
T = TypeVar("T")

# What a model is asked to do: pull facts out of messages, or reconcile facts
# with the records most similar to them. Metrics count calls per kind.
CallKind = Literal["extract", "reconcile"]


@dataclass(frozen=True, slots=True)
class Prompt:
    kind: CallKind
    system: str
    user: str
    # The JSON schema the answer follows, for endpoints that enforce one
    # (``response_format``); the prompt asks for the same shape in words.
    schema: dict[str, Any]
    # ``time.monotonic()`` after which the answer is of no use: a client should
    # neither wait nor retry past it.
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    usage: Usage | None = None
    model_id: str | None = None


class LLM(Protocol):
    def __call__(self, prompt: Prompt) -> str | Completion: ...


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call, as the metrics count it: no text."""

    kind: CallKind
    seconds: float
    usage: Usage | None = None
    failure: str | None = None  # None when it answered; else why not (an error's reason)


def ask(llm: LLM, prompt: Prompt, calls: list[ModelCall]) -> str:
    """Call ``llm`` once; append what the call cost to ``calls``.

    Whatever the model raises becomes a ``ModelUnavailableError`` (its type only:
    an exception's message may quote the prompt); an answer that is not text,
    or is too long, a ``ModelOutputError``.
    """
    started = time.monotonic()
    if prompt.deadline is not None and started >= prompt.deadline:
        error = ModelUnavailableError(f"no time left for the {prompt.kind} call", reason="deadline")
        calls.append(ModelCall(prompt.kind, 0.0, failure=error.reason))
        raise error
    try:
        answer = llm(prompt)
    except ModelUnavailableError as exc:
        calls.append(ModelCall(prompt.kind, time.monotonic() - started, failure=exc.reason))
        raise
    except EngramError as exc:
        calls.append(ModelCall(prompt.kind, time.monotonic() - started, failure=exc.code))
        raise
    except Exception as exc:
        calls.append(ModelCall(prompt.kind, time.monotonic() - started, failure="error"))
        log.warning("model call failed", extra={"kind": prompt.kind, "error": type(exc).__name__})
        raise ModelUnavailableError(
            f"the {prompt.kind} call failed ({type(exc).__name__})", reason="error"
        ) from exc
    seconds = time.monotonic() - started
    completion = Completion(answer) if isinstance(answer, str) else answer
    if not isinstance(completion, Completion) or not isinstance(completion.text, str):
        calls.append(ModelCall(prompt.kind, seconds, failure="output"))
        raise ModelOutputError(f"the {prompt.kind} call answered {type(answer).__name__}, not text")
    if len(completion.text) > MAX_MODEL_ANSWER_CHARS:
        calls.append(ModelCall(prompt.kind, seconds, completion.usage, failure="output"))
        raise ModelOutputError(
            f"the {prompt.kind} answer is longer than {MAX_MODEL_ANSWER_CHARS} characters"
        )
    calls.append(ModelCall(prompt.kind, seconds, completion.usage))
    return completion.text


def ask_and_parse(llm: LLM, prompt: Prompt, calls: list[ModelCall], parse: Callable[[str], T]) -> T:
    """``ask``, then ``parse`` the answer; an answer ``parse`` refuses
    (``ModelOutputError``) counts as a failed call."""
    answer = ask(llm, prompt, calls)
    try:
        return parse(answer)
    except ModelOutputError:
        calls[-1] = replace(calls[-1], failure="output")
        raise
