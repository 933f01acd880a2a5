"""The consumer's model phase: operations that need a model (a reconciling remember
or extract, an inferring extract) wait out of the cycle's commit while their calls
run on a bounded pool of threads, so a slow model never stalls the other scopes
and partitions of a worker.

Per scope, in stream order (a scope lives on one partition, read in order):

- an operation with a model phase, and every later operation of its scope, is
  held (``admit``); the scope's earlier operations commit in this cycle;
- after that commit its phase starts (``start``), so it sees all of them;
- once the phase has ended (or its deadline passed), the operation is released
  with its decision (or its error), together with the operations after it up
  to the scope's next one with a model phase (``ready``), and they commit with
  the next cycle, in order.

Held entries are not acknowledged: a worker that dies, or loses the partition,
leaves them pending, and the partition's next owner runs them again. A
partition being released, or a worker stopping, first finishes what it holds
(the consumer reads nothing more for it meanwhile).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engram.store import LLM, Embedder, Store
from engram.store.errors import EngramError, ModelUnavailableError
from engram.store.models.llm import CallKind, ModelCall
from engram.store.vectors.embedders import EmbedderResolver
from engram.store.write.needs import infers, needs_model
from engram.store.write.operations import Extract, Operation, OpKey
from engram.store.write.prepare import Prepared
from engram.store.write.reconcile import Decision
from engram.store.write.waves import held_back, next_wave
from engram.worker.causes import Cause, cause_of, strings_in
from engram.worker.defaults import BACKOFF_MAX_S
from engram.worker.protocol import Entry

if TYPE_CHECKING:
    from engram.worker.consuming.partition import Partition

log = logging.getLogger(__name__)

Item = tuple["Partition", Entry]

# While model calls run, the consumer does not block in its read of the streams
# (Redis times out a blocked read at its ``hz``, ten times a second by default:
# too coarse to notice a finished call); it reads without blocking, then waits this
# long for a call to finish (a finishing call wakes it at once): the longest a new
# entry then waits to be read.
POLL_S = 0.005


@dataclass(eq=False)
class _Held:
    item: Item
    phase: bool  # the operation has a model phase (a queue's head always has)
    future: Future[Prepared] | None = None
    started: float = 0.0
    deadline: float = 0.0
    retry_at: float = 0.0  # after a database failure, when to run the phase again


@dataclass
class Released:
    """What ``ready`` lets go: to commit (with the decisions), to answer with an
    error (nothing committed), to dead-letter (its phase raised something
    unexpected), and the model calls made, for the metrics."""

    items: list[Item] = field(default_factory=list)
    decisions: dict[OpKey, Decision] = field(default_factory=dict)
    failures: list[tuple[Item, EngramError]] = field(default_factory=list)
    broken: list[tuple[Item, Cause]] = field(default_factory=list)
    calls: list[ModelCall] = field(default_factory=list)


class ModelPhase:
    def __init__(
        self,
        store: Store,
        embedder: Embedder | EmbedderResolver | None,
        llm: LLM | None,
        *,
        concurrency: int,
        deadline_s: float,
        transient: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.llm = llm
        self.concurrency = concurrency
        self.deadline_s = deadline_s
        self.transient = transient  # a phase that raised one of these runs again
        self._queues: dict[str, deque[_Held]] = {}  # scope key -> its held operations
        self._held: set[tuple[int, str]] = set()  # (partition, entry id)
        self._per_partition: Counter[int] = Counter()
        self._executor: ThreadPoolExecutor | None = None
        self._finished = threading.Event()  # set by a model phase as it ends

    def has_phase(self, op: Operation) -> bool:
        return needs_model(op.request, self.llm is not None)

    # -- what the consumer asks ------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether any operation is held."""
        return bool(self._queues)

    def held(self, partition: Partition) -> int:
        return self._per_partition[partition.number]

    def holds(self, partition: Partition, entry_id: str) -> bool:
        """Whether this entry is held (read again, claimed after a Redis failure, say)."""
        return (partition.number, entry_id) in self._held

    def has_ready(self) -> bool:
        now = time.monotonic()
        return any(
            h.future is not None and (h.future.done() or now >= h.deadline)
            for h in (q[0] for q in self._queues.values())
        )

    @property
    def running(self) -> bool:
        """Whether a model phase is under way or due again (then the consumer must not
        block in a read: it would not notice the phase end)."""
        return any(q[0].future is not None or q[0].retry_at for q in self._queues.values())

    def wait(self) -> None:
        """Wait until a model phase ends, ``POLL_S`` at most."""
        if self._finished.wait(POLL_S):
            self._finished.clear()

    # -- the cycle -------------------------------------------------------------------

    def admit(self, items: list[Item]) -> list[Item]:
        """The items to commit in this cycle; the others are held, in their scope's order."""
        now, held = held_back(
            items,
            lambda item: item[1].operation.scope.key,
            lambda item: self.has_phase(item[1].operation),
            lambda scope: scope in self._queues,
        )
        for i in held:
            partition, entry = item = items[i]
            queue = self._queues.setdefault(entry.operation.scope.key, deque())
            queue.append(_Held(item, self.has_phase(entry.operation)))
            self._held.add((partition.number, entry.entry_id))
            self._per_partition[partition.number] += 1
        return [items[i] for i in now]

    def start(self) -> None:
        """Start the phase of each scope's first held operation. Called after a commit,
        and between cycles: the phase sees everything before it in its scope."""
        now = time.monotonic()
        for queue in self._queues.values():
            head = queue[0]
            if head.future is None and head.retry_at <= now:
                head.retry_at = 0.0
                head.started = now
                head.deadline = head.started + self.deadline_s
                head.future = self._pool().submit(
                    self.store.prepare,
                    head.item[1].operation,
                    embedder=self.embedder,
                    llm=self.llm,
                    deadline=head.deadline,
                )
                head.future.add_done_callback(lambda _: self._finished.set())

    def ready(self) -> Released:
        out = Released()
        now = time.monotonic()
        for scope, queue in list(self._queues.items()):
            head = queue[0]
            if head.future is None or not (head.future.done() or now >= head.deadline):
                continue
            if not self._end_phase(head, out, now):
                continue
            # The head (its item went out with its phase's end) and the operations after
            # it, up to the scope's next one with a model phase: one wave.
            wave, _ = next_wave(queue, _scope_of, lambda held: held.phase)
            out.items += [self._release(queue.popleft()) for _ in wave][1:]
            if not queue:
                del self._queues[scope]
        return out

    def _end_phase(self, head: _Held, out: Released, now: float) -> bool:
        """Settle a head whose phase ended or ran out of time; False: it runs again."""
        assert head.future is not None
        op = head.item[1].operation
        if not head.future.done():
            # The thread goes on (the client gives up at the same deadline); its
            # answer, when it comes, is dropped.
            out.calls.append(ModelCall(_call_kind(op), now - head.started, failure="deadline"))
            out.failures.append(
                (
                    head.item,
                    ModelUnavailableError(
                        f"the model phase of operation {op.operation_id} took more than"
                        f" {self.deadline_s:g} s",
                        reason="deadline",
                    ),
                )
            )
            return True
        try:
            prepared = head.future.result()
        except self.transient as exc:
            # Its database reads failed (before or between its calls): run it again.
            log.warning(
                "model phase interrupted, will run again",
                extra={
                    "operation_id": op.operation_id,
                    "error": type(exc).__name__,
                    "retry_in_s": BACKOFF_MAX_S,
                },
            )
            head.future = None
            head.retry_at = now + BACKOFF_MAX_S
            return False
        except Exception as exc:
            out.broken.append((head.item, cause_of(exc, strings_in(op.to_dict()))))
            return True
        out.calls += prepared.calls
        if prepared.error is not None:
            out.failures.append((head.item, prepared.error))
        else:
            if prepared.decision is not None:
                out.decisions[op.key] = prepared.decision
            out.items.append(head.item)  # with a decision, or a replay its receipt answers
        return True

    def _release(self, held: _Held) -> Item:
        partition, entry = held.item
        self._held.discard((partition.number, entry.entry_id))
        self._per_partition[partition.number] -= 1
        return held.item

    def drop(self, partition: Partition) -> None:
        """Forget what a partition let go of holds: its next owner runs it again."""
        for scope, queue in list(self._queues.items()):
            if queue[0].item[0].number == partition.number:
                for held in queue:
                    self._release(held)
                del self._queues[scope]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self.concurrency, thread_name_prefix="engram-model"
            )
        return self._executor


def _call_kind(op: Operation) -> CallKind:
    """What kind of call a phase that ran out of time was most likely making."""
    r: Any = op.request
    return "extract" if isinstance(r, Extract) and infers(r, True) else "reconcile"


def _scope_of(held: _Held) -> str:
    return held.item[1].operation.scope.key
