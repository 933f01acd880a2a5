"""``engram demo-reembed``: move the store to another model while writes go on.

Against a running ``engram up`` (its stream workers, its servers): it writes
records through the streams, then keeps writing at a steady rate while a
re-embedding runs (in a jobs worker, started here for the demo if none is
running), shows the progress bar, and at the end how many writes were
committed and refused, and a recall answered by the new model.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import psutil  # type: ignore[import-untyped]
import redis

from engram.jobs import reembed, runner
from engram.jobs.settings import JobsSettings
from engram.store import Operation, Store
from engram.store.errors import EngramError
from engram.store.vectors.registry import EmbedderRegistry
from engram.worker.embedded import runtime
from engram.worker.producer import Pending, Producer
from engram.worker.settings import Settings

from . import jobs_redis, procs, wiring
from .database import wait_for_store
from .following import follow

SCOPE = {"user_id": "engram-demo-reembed"}
FACTS = (
    "The demo user drinks green tea every morning.",
    "The demo user's sister lives in Lisbon.",
    "The demo user is allergic to peanuts.",
    "The demo user plays the cello on weekends.",
    "The demo user's flight to Tokyo leaves on Friday.",
)


@dataclass
class SteadyWriter:
    """Remembers sent through the streams at ``rate_per_s``, until ``stop``; then the
    receipts of all of them, counted (committed, and refused by error code)."""

    producer: Producer
    rate_per_s: float
    scope: dict[str, str]
    prefix: str
    sent: list[Pending] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> SteadyWriter:
        self._thread = threading.Thread(target=self._run, name="steady-writer", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            n = len(self.sent)
            op = Operation.build(
                "remember",
                self.scope,
                {"text": f"Note {n} written while the store moves to another model."},
                f"{self.prefix}:{n}",
            )
            self.sent.append(self.producer.enqueue(op))
            pause = started + (n + 1) / self.rate_per_s - time.monotonic()
            if pause > 0:
                self._stop.wait(pause)

    def stop(self, timeout_s: float = 120.0) -> Counter[str]:
        """Stop writing; wait for every receipt: ``{"committed": n, "<error code>": m}``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        outcomes: Counter[str] = Counter()
        deadline = time.monotonic() + timeout_s
        for pending in self.sent:
            try:
                pending.wait(max(deadline - time.monotonic(), 0.1))
                outcomes["committed"] += 1
            except EngramError as exc:
                outcomes[exc.code] += 1
        return outcomes


def run_demo(settings: Settings, *, model: str, rate_per_s: float, seed_records: int) -> int:
    redis_url = runtime.redis_url(settings)
    client = jobs_redis.connect(settings)
    store = wait_for_store(runtime.database_url(settings), 2)
    registry = wiring.registry(settings)
    stamp = int(time.time())
    try:
        with Producer.from_url(redis_url, partitions=settings.worker.partitions) as producer:
            _seed(producer, seed_records, stamp)
            target = _target(store, registry.create(model).model_id, model)
            with _jobs_worker(client):
                writer = SteadyWriter(producer, rate_per_s, SCOPE, f"demo:{stamp}:live").start()
                started = reembed.start(
                    store,
                    client,
                    registry,
                    target,
                    requested_by="demo",
                    settings=JobsSettings.from_env().reembed,
                )
                print(f"re-embedding to {target}: generation {started.generation_id}")
                code = follow(store, started.generation_id)
                outcomes = writer.stop()
        print(
            f"writes meanwhile: {len(writer.sent)} sent at {rate_per_s:g}/s,"
            f" {outcomes['committed']} committed, {len(writer.sent) - outcomes['committed']}"
            f" refused {dict(outcomes - Counter(committed=outcomes['committed']))}"
        )
        _recall(store, registry)
        return code
    finally:
        store.close()
        client.close()


def _seed(producer: Producer, count: int, stamp: int) -> None:
    texts = [*FACTS, *(f"Background note {i} of the demo user." for i in range(count))]
    ops = [
        Operation.build("remember", SCOPE, {"text": t}, f"demo:{stamp}:seed:{i}")
        for i, t in enumerate(texts)
    ]
    print(f"writing {len(ops)} records through the streams...")
    for start in range(0, len(ops), 500):
        for pending in producer.enqueue_many(ops[start : start + 500]):
            pending.wait(120)


def _target(store: Store, model_id: str, model: str) -> str:
    """The model to move to: ``model``, or back to wordllama if ``model`` is active."""
    active = store.embeddings.active()
    if active is not None and active.model_id == model_id:
        print(f"{model} is already active: moving back to wordllama instead")
        return "wordllama"
    return model


def _recall(store: Store, registry: EmbedderRegistry) -> None:
    active = store.embeddings.active()
    if active is None:
        return
    embedder = registry.for_model(active.model_id, active.dims)
    query = "Which instrument does the demo user play?"
    hits = store.session(SCOPE, embedder=embedder).recall(query, top_k=1)
    print(f"active model: {active.model_id}; recall {query!r}:")
    for hit in hits:
        print(f"  -> {hit.record.text!r} ({hit.match})")


@contextlib.contextmanager
def _jobs_worker(client: redis.Redis) -> Iterator[None]:
    """A jobs worker for the demo's length, unless one is running already."""
    if runner.live_workers(client):
        yield
        return
    print("starting `engram jobs` for the demo")
    child = subprocess.Popen(
        [sys.executable, "-m", "engram", "--log-level", "WARNING", "jobs"],
        env=os.environ.copy(),
        preexec_fn=procs.die_with_parent(),
    )
    try:
        yield
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.stop_process(psutil.Process(child.pid), signal.SIGTERM, 30)
        child.wait()
