"""The model phase of an operation: everything a remember or an extract asks of a
model, done before (and never inside) the transaction that commits it.

Which operations have one is ``needs``'s rules. ``prepare`` runs one
operation's phase:

1. an operation that already has a receipt is a replay: no model call at all;
2. an inferring extract shows the model its readable sources (the
   untrusted-source policy of ``extraction``), tagged ``[s0]``, ``[s1]``...,
   and reads back the facts and the tags they cite;
3. a reconciling write reads the active records most similar to its texts
   (``similar``); when there are none, it adds them without a call; else one
   call answers ADD / UPDATE / DELETE / NOOP, resolved under the origin rules.

The result is a ``Decision`` the planner applies under the scope's lock, so the
calls happen once per operation whatever the transaction's retries.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..errors import EngramError
from ..limits import DEFAULT_KIND, DEFAULT_TOP_K, RAW_EXTRACT_KIND
from ..models.llm import LLM, ModelCall, ask_and_parse
from ..models.prompts import extraction_prompt, reconcile_prompt
from ..models.similar import similar_records
from ..values import Source
from ..vectors.embedders import Embedder, EmbedderResolver
from .answers import parse_events, parse_facts
from .apply import stored_receipts
from .extraction import Readable, readable_sources
from .needs import infers, missing_model, supersede_of
from .operations import Extract, Operation, Remember
from .reconcile import Decision, Fact, add_all, resolve

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Prepared:
    """One operation's model phase: its decision, or the error that ends it, or
    nothing to decide (a replay: its receipt answers). ``calls`` is what it cost."""

    decision: Decision | None = None
    error: EngramError | None = None
    calls: list[ModelCall] = field(default_factory=list)

    @property
    def replay(self) -> bool:
        return self.decision is None and self.error is None


def prepare(
    pool: Any,
    op: Operation,
    *,
    embedder: Embedder | EmbedderResolver | None,
    llm: LLM | None,
    deadline: float | None = None,
) -> Prepared:
    """Run ``op``'s model phase. Typed errors are returned; a database error raises
    (the phase may be run again: its calls come after every read that can fail but one)."""
    with pool.connection() as conn:
        if stored_receipts(conn, [op.key]):
            return Prepared()
    if llm is None:
        return Prepared(error=missing_model(op.request))
    calls: list[ModelCall] = []
    try:
        decision = _decide(pool, op, embedder, llm, deadline, calls)
    except EngramError as error:
        log.info(
            "model phase failed",
            extra={"operation_id": op.operation_id, "code": error.code, "calls": len(calls)},
        )
        return Prepared(error=error, calls=calls)
    return Prepared(decision=decision, calls=calls)


def _decide(
    pool: Any,
    op: Operation,
    embedder: Embedder | EmbedderResolver | None,
    llm: LLM,
    deadline: float | None,
    calls: list[ModelCall],
) -> Decision:
    r = op.request
    assert isinstance(r, Remember | Extract)
    if isinstance(r, Remember):
        facts = [Fact(r.text, r.cited(), r.kind, r.importance)]
        origin = r.origin
    else:
        facts = _extract_facts(op, r, llm, deadline, calls)
        origin = "inferred"
    if not facts or supersede_of(r, True) == "add":
        return Decision(add_all(facts), len(calls))
    top_k = r.top_k or DEFAULT_TOP_K
    candidates = similar_records(pool, op.scope, [f.text for f in facts], embedder, top_k)
    if not candidates:
        return Decision(add_all(facts, skip_repeats=True), len(calls))
    prompt = reconcile_prompt(
        [c.text for c in candidates], [f.text for f in facts], deadline=deadline
    )
    actions = ask_and_parse(
        llm,
        prompt,
        calls,
        lambda answer: resolve(parse_events(answer, len(candidates)), candidates, facts, origin),
    )
    return Decision(actions, len(calls))


def _extract_facts(
    op: Operation, r: Extract, llm: LLM, deadline: float | None, calls: list[ModelCall]
) -> list[Fact]:
    readable = readable_sources(r.messages, r.trusted_tools, op.scope.chat_id)
    if not infers(r, True):
        return [Fact(x.text, (x.source,), r.kind or RAW_EXTRACT_KIND) for x in readable]
    if not readable:
        return []  # nothing to show a model: the operation commits an empty receipt
    prompt = extraction_prompt(readable, r.instructions, deadline=deadline)
    proposed = ask_and_parse(llm, prompt, calls, lambda a: parse_facts(a, len(readable)))
    return [
        Fact(
            p.text,
            _cited(readable, p.tags),
            r.kind or p.kind or DEFAULT_KIND,
            p.importance,
        )
        for p in proposed
    ]


def _cited(readable: list[Readable], tags: tuple[int, ...]) -> tuple[Source, ...]:
    """The sources a fact cites; one citing no known tag cites every source read."""
    return tuple(readable[i].source for i in tags) if tags else tuple(x.source for x in readable)
