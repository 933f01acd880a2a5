"""One partition a worker holds, as its consumer sees it, and what travels with it.

A ``Partition`` is the lease, the fence that makes commits under it safe, and how
far the consumer got with its stream; an ``Item`` is one of its entries, decoded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engram.store import Fence, ForgetEvent
from engram.worker import keys
from engram.worker.consuming.leases import Lease
from engram.worker.protocol import Entry

# Hands committed forgets to their redaction listeners: adds the commands that do so to
# the pipeline that carries the cycle's replies, after them (so a listener that finishes
# fast updates a reply that is already there). Built by the composition root.
ForgetHook = Callable[[Sequence[ForgetEvent], Any], None]


@dataclass(eq=False)
class Partition:
    """One partition a worker holds: its lease and how far its consumer got with it."""

    lease: Lease
    # Monotonic time after which nothing is committed for it; the worker moves it on
    # at each renewal. The fence, not this, is what makes it safe.
    valid_until: float
    # How many partitions its layout epoch has (``lease.epoch``): an entry belongs here
    # if its scope hashes here among that many.
    partitions: int
    lost: str | None = None
    release_requested: bool = False
    # Set by the consumer once it has let go: nothing more is committed or acknowledged.
    done: threading.Event = field(default_factory=threading.Event)
    # Until the fence is raised, nothing is read; until the entries left pending are
    # claimed (cursor back to 0-0), no new entry is.
    fenced: bool = False
    draining: bool = True
    cursor: str = "0-0"

    @property
    def number(self) -> int:
        return self.lease.partition

    @property
    def stream(self) -> str:
        return keys.stream(self.lease.partition, self.lease.epoch)

    @property
    def fence(self) -> Fence:
        return Fence(keys.fence_name(self.lease.partition, self.lease.epoch), self.lease.token)

    @property
    def stopping(self) -> bool:
        return self.release_requested or self.lost is not None

    def lose(self, reason: str) -> None:
        """Commit nothing more for it: the lease ran out, or the store refused the fence."""
        self.valid_until = 0.0
        if self.lost is None:
            self.lost = reason

    def ids(self) -> dict[str, Any]:
        ids: dict[str, Any] = {"partition": self.number, "token": self.lease.token}
        if self.lease.epoch:
            ids["epoch"] = self.lease.epoch
        return ids


Item = tuple[Partition, Entry]


def partitions_of(items: Sequence[Item]) -> list[Partition]:
    return list(dict.fromkeys(p for p, _ in items))
