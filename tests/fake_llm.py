"""A scripted model for the tests: it answers each kind of call (``extract``,
``reconcile``) from a script and keeps every prompt it was shown."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from engram.store import Completion, Prompt, Usage

Answer = str | Completion | Callable[[Prompt], str | Completion]


def events(*items: dict[str, Any]) -> str:
    """A reconciliation answer: ``events({"event": "ADD", "text": "..."})``."""
    return json.dumps({"memory": list(items)})


def facts(*items: dict[str, Any]) -> str:
    """An extraction answer: ``facts({"text": "...", "sources": ["s0"]})``."""
    return json.dumps({"facts": list(items)})


class ScriptedLLM:
    """Answers ``extract`` and ``reconcile`` calls with what it was given: a text, a
    ``Completion``, a function of the prompt, or a list of those used in turn."""

    def __init__(
        self,
        *,
        extract: Answer | list[Answer] | None = None,
        reconcile: Answer | list[Answer] | None = None,
    ) -> None:
        self.script: dict[str, Any] = {"extract": extract, "reconcile": reconcile}
        self.prompts: list[Prompt] = []
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        return len(self.prompts)

    def of(self, kind: str) -> list[Prompt]:
        return [p for p in self.prompts if p.kind == kind]

    def __call__(self, prompt: Prompt) -> str | Completion:
        with self._lock:
            self.prompts.append(prompt)
            answer = self.script[prompt.kind]
            if isinstance(answer, list):
                answer = answer.pop(0)
        if answer is None:
            raise AssertionError(f"the script has no {prompt.kind} answer")
        return answer(prompt) if callable(answer) else answer


def with_usage(text: str, prompt_tokens: int = 10, completion_tokens: int = 5) -> Completion:
    return Completion(text, Usage(prompt_tokens, completion_tokens), "scripted")
