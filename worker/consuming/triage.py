"""Sorting what a cycle read: entries to commit, and entries for the dead letters.

Pure: given the entries read from each partition (with their delivery counts when
claimed), it decides, and touches neither Redis nor the store. An entry is dead
when it is malformed, when it was delivered more than ``max_deliveries`` times
without a commit, or when no commit could take it (``Triage.failed``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engram.store.errors import EngramError
from engram.worker.admin import deadletters
from engram.worker.causes import Cause
from engram.worker.consuming.partition import Item, Partition
from engram.worker.errors import DeadLetteredError
from engram.worker.protocol import Entry, Malformed, decode_entry, raw_op


@dataclass(frozen=True, slots=True)
class Read:
    """Entries read from one partition in a cycle, with their delivery counts when claimed."""

    partition: Partition
    entries: list[Any]
    deliveries: dict[str, int]


@dataclass(frozen=True, slots=True)
class Dead:
    """An entry bound for the dead letters, and why."""

    partition: Partition
    entry_id: str
    operation_id: str | None
    raw: str | None
    reason: str
    error: EngramError
    deliveries: int
    scope_key: str | None = None  # with the operation id, where its refusal is answered


# By (partition, entry id): two streams may give out the same entry id.
EntryKey = tuple[int, str]


@dataclass
class Triage:
    good: list[Item] = field(default_factory=list)
    dead: list[Dead] = field(default_factory=list)
    raws: dict[EntryKey, str | None] = field(default_factory=dict)  # the good ones' op
    deliveries: dict[EntryKey, int] = field(default_factory=dict)  # the claimed ones'

    def failed(self, failed: list[tuple[Partition, Entry, Cause]]) -> None:
        """Entries no commit could take (with the cause of what was raised) join the dead."""
        for p, entry, cause in failed:
            key = (p.number, entry.entry_id)
            op_id = entry.operation.operation_id
            self.dead.append(
                Dead(
                    p,
                    entry.entry_id,
                    op_id,
                    self.raws.get(key),
                    deadletters.FAILED,
                    DeadLetteredError(
                        f"operation {op_id} could not be applied: {cause.detail}",
                        cause=cause.code,
                        detail=cause.detail,
                    ),
                    self.deliveries.get(key, 1),
                    entry.operation.scope.key,
                )
            )


def triage(
    reads: list[Read],
    *,
    max_deliveries: int,
    in_hand: Callable[[Partition, str], bool],
) -> Triage:
    """Sort ``reads``; an entry ``in_hand`` (delivered again while it waits for its
    model) is skipped."""
    out = Triage()
    error: EngramError
    for read in reads:
        p = read.partition
        for entry_id, n in read.deliveries.items():
            out.deliveries[p.number, entry_id] = n
        for raw_id, fields in read.entries:
            item = decode_entry(raw_id, fields or {}, partition=p.number, partitions=p.partitions)
            if in_hand(p, item.entry_id):
                continue
            count = read.deliveries.get(item.entry_id, 1)
            if isinstance(item, Malformed):
                reason, op_id, raw, error = (
                    deadletters.MALFORMED,
                    item.operation_id,
                    item.raw,
                    item.error,
                )
                scope_key = item.scope_key
            elif count > max_deliveries:
                op_id, scope_key = item.operation.operation_id, item.operation.scope.key
                reason, raw = deadletters.DELIVERIES, raw_op(fields or {})
                error = DeadLetteredError(
                    f"operation {op_id} was delivered {count} times without being committed",
                    cause=deadletters.TOO_MANY_DELIVERIES,
                )
            else:
                out.good.append((p, item))
                out.raws[p.number, item.entry_id] = raw_op(fields or {})
                continue
            out.dead.append(Dead(p, item.entry_id, op_id, raw, reason, error, count, scope_key))
    return out
