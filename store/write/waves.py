"""Committing a batch whose operations have model phases, in waves.

An operation's model phase must see what the operations before it in its scope
did: its candidates are read, and its model asked, after they commit. So a
batch is committed in waves: each wave takes, per scope, the operations up to
the next one with a model phase that is not the scope's first in the wave, and
the model phases of those first ones run before the wave commits. A batch
with no model phase is one wave: one transaction, as always.

``Store.execute`` runs the phases one after another; the stream worker runs
them concurrently, holding each scope's later operations back meanwhile
(``worker.models``), by the same rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..models.llm import LLM
from ..vectors.embedders import Embedder, EmbedderResolver
from .operations import Operation
from .prepare import prepare
from .reconcile import Decision
from .writer import Result, Writer

T = TypeVar("T")


def next_wave(
    items: Sequence[T], scope_of: Callable[[T], str], has_phase: Callable[[T], bool]
) -> tuple[list[int], list[int]]:
    """The indexes of the items that go in the next wave, and of those that wait.

    Per scope, in order: the items up to (not including) the next one with a
    model phase that is not the scope's first in this wave; everything after
    it waits too, so each scope keeps its order."""
    taken: list[int] = []
    later: list[int] = []
    started: set[str] = set()
    blocked: set[str] = set()
    for i, item in enumerate(items):
        scope = scope_of(item)
        if scope in blocked or (has_phase(item) and scope in started):
            blocked.add(scope)
            later.append(i)
        else:
            started.add(scope)
            taken.append(i)
    return taken, later


def execute_in_waves(
    writer: Writer,
    pool: Any,
    ops: Sequence[Operation],
    embedder: Embedder | EmbedderResolver | None,
    *,
    llm: LLM | None,
    has_phase: Callable[[Operation], bool],
    decisions: Mapping[str, Decision],
    **options: Any,
) -> list[Result]:
    results: list[Result | None] = [None] * len(ops)
    decided = dict(decisions)
    waiting = list(range(len(ops)))
    while waiting:
        taken, later = next_wave([ops[i] for i in waiting], lambda op: op.scope.key, has_phase)
        wave = [waiting[i] for i in taken]
        for i in wave:
            op = ops[i]
            if not has_phase(op):
                continue
            prepared = prepare(pool, op, embedder=embedder, llm=llm)
            if prepared.error is not None:
                results[i] = prepared.error  # nothing committed: it may be sent again
            elif prepared.decision is not None:
                decided[op.operation_id] = prepared.decision
        committing = [i for i in wave if results[i] is None]
        if committing:
            outcomes = writer.execute(
                [ops[i] for i in committing], embedder, decisions=decided, **options
            )
            for i, outcome in zip(committing, outcomes, strict=True):
                results[i] = outcome
        waiting = [waiting[i] for i in later]
    return [r for r in results if r is not None]
