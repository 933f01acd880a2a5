"""Group commit: the batches a worker's partition runners hand in at the same
moment are committed together, in one ``store.execute``.

Each runner still reads, orders, replies and acknowledges its own partition;
only the commit is shared. A merged commit is one embedding call and one
transaction carrying every partition's fence, so at moderate load a worker
makes one fsync for many partitions instead of one each, and latency stays
low. Partitions never share a scope, so merging keeps every scope's order.

A runner that finds no commit in progress leads: it takes every request
waiting (up to ``max_ops`` operations), commits them, hands each runner its
outcomes, then hands the lead to a runner still waiting, so no runner is kept
from its own partition by leading for the others. If the store refuses
a fence, only that partition's request fails (``FencedError``); the others are
committed again without it. Any other failure is handed to every runner of
the group, which deals with it as with its own.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from store import Embedder, Fence, FencedError, Operation, Store

from .protocol import Outcome


@dataclass(eq=False, slots=True)
class _Request:
    ops: list[Operation]
    fence: Fence
    stream_entries: dict[str, str]
    finished: bool = False
    outcomes: list[Outcome] | None = None
    error: BaseException | None = None


class Committer:
    def __init__(self, store: Store, embedder: Embedder | None, *, max_ops: int = 2048) -> None:
        self.store = store
        self.embedder = embedder
        self.max_ops = max_ops
        self._cond = threading.Condition()
        self._waiting: list[_Request] = []
        self._leading = False

    def execute(
        self, ops: Sequence[Operation], fence: Fence, stream_entries: dict[str, str]
    ) -> list[Outcome]:
        """Commit ``ops`` under ``fence``, together with whatever else is waiting."""
        request = _Request(list(ops), fence, dict(stream_entries))
        with self._cond:
            self._waiting.append(request)
            while not request.finished:
                if self._leading:
                    self._cond.wait()
                    continue
                self._leading = True
                group = self._take()
                self._cond.release()
                try:
                    self._commit(group)
                finally:
                    self._cond.acquire()
                    self._leading = False
                    self._cond.notify_all()
        if request.error is not None:
            raise request.error
        assert request.outcomes is not None
        return request.outcomes

    def _take(self) -> list[_Request]:
        group: list[_Request] = []
        count = 0
        while self._waiting and (not group or count + len(self._waiting[0].ops) <= self.max_ops):
            request = self._waiting.pop(0)
            group.append(request)
            count += len(request.ops)
        return group

    def _commit(self, group: list[_Request]) -> None:
        while group:
            try:
                outcomes = self.store.execute(
                    [op for r in group for op in r.ops],
                    self.embedder,
                    fence=[r.fence for r in group],
                    stream_entries={k: v for r in group for k, v in r.stream_entries.items()},
                )
            except FencedError as exc:
                stale = [r for r in group if r.fence.name in exc.fences] or group
                for request in stale:
                    _finish(request, error=FencedError(exc.message, fences=(request.fence.name,)))
                group = [r for r in group if r not in stale]
                continue
            except BaseException as exc:
                for request in group:
                    _finish(request, error=exc)
                return
            start = 0
            for request in group:
                _finish(request, outcomes=outcomes[start : start + len(request.ops)])
                start += len(request.ops)
            return


def _finish(
    request: _Request, *, outcomes: list[Outcome] | None = None, error: BaseException | None = None
) -> None:
    request.outcomes = outcomes
    request.error = error
    request.finished = True
