"""How a batch is written, beyond its operations: one typed value that goes from the
caller (the stream worker's committer, a ``Session``, a test) through
``Store.execute`` and its waves to the writer and the planner, unchanged on the way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..values import Fence
from .operations import OpKey
from .reconcile import Decision


@dataclass(frozen=True, slots=True)
class WriteOptions:
    # Every partition fence the batch commits under: a stale one refuses it whole.
    fences: tuple[Fence, ...] = ()
    # The forget listeners will run after the commit (a forget's redaction: pending).
    listeners: bool = False
    # The stream entry each operation came in, by ``Operation.key`` (kept on its receipt).
    stream_entries: Mapping[OpKey, str] = field(default_factory=dict)
    # Look the receipts up before embedding (replays cost no embedding); the stream
    # worker skips it for entries read the first time.
    check_replays: bool = True
    # What the model phase decided, by ``Operation.key`` (``prepare``): no model is asked.
    decisions: Mapping[OpKey, Decision] = field(default_factory=dict)

    def deciding(self, more: Mapping[OpKey, Decision]) -> WriteOptions:
        return replace(self, decisions={**self.decisions, **more})


# The options of a plain call: no fence, no listeners, replays looked up.
DEFAULTS = WriteOptions()
