"""What a cycle's outcomes become: its counts, and the commands that answer it.

Pure but for the pipeline it is handed: ``BatchStats`` from the outcomes and the
dead, the forgets whose listeners run, and ``answer``, which adds to one pipeline
every reply, dead letter, listener hand-over and acknowledgement of a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engram.store import ForgetEvent, WriteResult
from engram.store.errors import EngramError
from engram.store.models.llm import ModelCall
from engram.store.write.operations import Forget
from engram.worker import keys
from engram.worker.admin import deadletters
from engram.worker.admin.metrics import BatchStats
from engram.worker.consuming.partition import ForgetHook, Item, Partition
from engram.worker.consuming.replies import send_reply
from engram.worker.consuming.triage import Dead
from engram.worker.protocol import Outcome, encode_reply

Outcomes = list[tuple[Item, Outcome]]


def acknowledged(outcomes: Outcomes, dead: Sequence[Dead]) -> dict[Partition, list[str]]:
    """The entries answered, by partition: committed, refused or dead-lettered."""
    done: dict[Partition, list[str]] = {}
    for (p, entry), _ in outcomes:
        done.setdefault(p, []).append(entry.entry_id)
    for d in dead:
        done.setdefault(d.partition, []).append(d.entry_id)
    return done


def batch_stats(
    outcomes: Outcomes, dead: Sequence[Dead], *, entries: int, model_calls: list[ModelCall]
) -> BatchStats:
    stats = BatchStats(entries=entries, model_calls=model_calls)
    for _, outcome in outcomes:
        if isinstance(outcome, EngramError):
            stats.failed[outcome.code] += 1
        elif outcome.replayed:
            stats.replayed += 1
        else:
            stats.committed += 1
    for d in dead:
        stats.dead[d.reason] += 1
    return stats


def forget_events(outcomes: Outcomes) -> list[ForgetEvent]:
    """The forgets whose listeners run (again): committed or replayed, not ``none``."""
    events = []
    for (_, entry), outcome in outcomes:
        request = entry.operation.request
        if not isinstance(request, Forget) or not isinstance(outcome, WriteResult):
            continue
        if outcome.redaction in (None, "none"):
            continue
        events.append(
            ForgetEvent(
                scope=entry.operation.scope,
                record_id=request.id,
                revisions=outcome.revisions,
                operation_id=entry.operation.operation_id,
                already_forgotten=outcome.already_forgotten,
            )
        )
    return events


@dataclass(frozen=True, slots=True)
class Answers:
    """A cycle's answers, written into a pipeline by ``add_to`` (once, or again after a
    failed send: every command is idempotent)."""

    outcomes: Outcomes
    dead: Sequence[Dead]
    done: dict[Partition, list[str]]
    reply_ttl_s: int
    on_forget: ForgetHook | None

    def add_to(self, pipe: Any) -> None:
        ttl = self.reply_ttl_s
        for (_, entry), outcome in self.outcomes:
            send_reply(pipe, entry.operation.key, encode_reply(outcome, entry.entry_id), ttl)
        for d in self.dead:
            deadletters.add(
                pipe,
                partition=d.partition.number,
                entry_id=d.entry_id,
                operation_id=d.operation_id,
                raw=d.raw,
                reason=d.reason,
                error=d.error,
                deliveries=d.deliveries,
                epoch=d.partition.lease.epoch,
            )
            if d.operation_id is not None and d.scope_key is not None:
                send_reply(
                    pipe, (d.scope_key, d.operation_id), encode_reply(d.error, d.entry_id), ttl
                )
        if self.on_forget is not None:
            forgets = forget_events(self.outcomes)
            if forgets:
                self.on_forget(forgets, pipe)
        for p, entry_ids in self.done.items():
            if entry_ids:
                pipe.xack(p.stream, keys.GROUP, *entry_ids)
                # Acknowledged entries are deleted: the stream holds only work to do,
                # and no memory text lingers in Redis after its commit.
                pipe.xdel(p.stream, *entry_ids)
