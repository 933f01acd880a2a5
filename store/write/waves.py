"""Committing a batch whose operations have model phases, in waves.

An operation's model phase must see what the operations before it in its scope
did: its candidates are read, and its model asked, after they commit. So a
batch is committed in waves: each wave takes, per scope, the operations up to
the next one with a model phase that is not the scope's first in the wave, and
the model phases of those first ones run before the wave commits. A batch
with no model phase is one wave: one transaction, as always.

``Store.execute`` runs the phases one after another; the stream worker runs
them concurrently, holding each scope's later operations back meanwhile
(``worker.models``), by the same rule: it holds what ``held_back`` says, and
releases a scope's held operations a wave at a time (``next_wave``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..models.llm import LLM
from ..vectors.embedders import Embedder, EmbedderResolver
from .operations import Operation
from .options import WriteOptions
from .prepare import prepare
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


def held_back(
    items: Sequence[T],
    scope_of: Callable[[T], str],
    has_phase: Callable[[T], bool],
    holding: Callable[[str], bool],
) -> tuple[list[int], list[int]]:
    """The indexes of the items that may commit now, and of those held back until a
    model phase before them in their scope has ended: per scope, every item from its
    first one with a model phase on, and all of a scope already ``holding`` some."""
    now: list[int] = []
    held: list[int] = []
    blocked: set[str] = set()
    for i, item in enumerate(items):
        scope = scope_of(item)
        if scope in blocked or holding(scope) or has_phase(item):
            blocked.add(scope)
            held.append(i)
        else:
            now.append(i)
    return now, held


def execute_in_waves(
    writer: Writer,
    pool: Any,
    ops: Sequence[Operation],
    embedder: Embedder | EmbedderResolver | None,
    *,
    llm: LLM | None,
    has_phase: Callable[[Operation], bool],
    options: WriteOptions,
) -> list[Result]:
    results: list[Result | None] = [None] * len(ops)
    decided = dict(options.decisions)
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
                decided[op.key] = prepared.decision
        committing = [i for i in wave if results[i] is None]
        if committing:
            outcomes = writer.execute(
                [ops[i] for i in committing], embedder, options.deciding(decided)
            )
            for i, outcome in zip(committing, outcomes, strict=True):
                results[i] = outcome
        waiting = [waiting[i] for i in later]
    return [r for r in results if r is not None]
