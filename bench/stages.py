"""Where an operation's time goes, stage by stage, in an engram worker (for
``bench.bench_worker --stages``).

A worker started through ``run_worker`` wraps the consumer's steps with clock
readings (``time.perf_counter``: ``CLOCK_MONOTONIC`` on Linux, one clock for
every process of the machine, the benchmark's producers and collector included)
and writes, when it stops, one line per cycle:

- ``start``: the cycle began (the consumer's own ``started``); before its read it
  looks at its leases, the paused partitions and stray entries;
- ``sent`` / ``back``: the ``XREADGROUP`` (in the pipeline that carries the last
  cycle's replies and acknowledgements) was sent, and returned its entries;
- ``commit`` / ``committed``: ``Committer.commit`` began and returned (triage and the
  model phase's bookkeeping come before it);
- ``embed_ms``, ``tx_ms``, ``execute_ms``: the embedding call, the transaction
  (its two pipelined round trips and the COMMIT, which waits for the WAL's fsync)
  and all of ``store.execute`` (the replay look-up, pool checkout, results);
- ``end``: the cycle's answers were ready (``Consumer._finish`` returned);
- ``replied``: when the pipeline that carried them was sent (the next cycle's read,
  the stray check's looks, or a ``_send`` of their own; for the looks, when they
  returned);
- ``ops``: the operation ids it committed.

Nothing here changes what the worker does; the wrapping costs a few clock
readings per cycle, so the CPU figures of the runs that use it are not reported.
"""

from __future__ import annotations

import atexit
import json
import sys
import time
from functools import wraps
from pathlib import Path
from typing import Any

from engram.store.write.writer import Writer
from engram.worker.consuming.committer import Committer
from engram.worker.consuming.consumer import Consumer

_cycles: list[dict[str, Any]] = []
# The cycle under way and the last one whose answers were not yet sent (one consumer
# thread per worker process).
_now: dict[str, Any] = {}
_unsent: list[dict[str, Any]] = []


def _clock() -> float:
    return time.perf_counter()


def install(path: Path) -> None:
    """Wrap the consumer's steps; write the cycles to ``path`` (JSON lines) at exit."""
    cycle = Consumer._cycle

    @wraps(cycle)
    def traced_cycle(self: Consumer, active: Any) -> None:
        _now.clear()
        _now["start"] = _clock()
        cycle(self, active)
        if _now.get("ops"):
            _now["end"] = _clock()
            _cycles.append(dict(_now))
            _unsent.append(_cycles[-1])

    read_all = Consumer._read_all

    @wraps(read_all)
    def traced_read_all(self: Consumer, partitions: Any, block_ms: Any, unsent: Any) -> Any:
        sent = _clock()
        if unsent is not None:
            _replied(sent)
        found = read_all(self, partitions, block_ms, unsent)
        _now["sent"], _now["back"] = sent, _clock()
        return found

    send = Consumer._send

    @wraps(send)
    def traced_send(self: Consumer) -> None:
        if self._unsent is not None:
            _replied(_clock())
        send(self)

    strays = Consumer._find_strays

    @wraps(strays)
    def traced_strays(self: Consumer, active: Any) -> None:
        unsent = self._unsent
        strays(self, active)
        if unsent is not None and self._unsent is None:  # they went with its looks
            _replied(_clock())

    commit = Committer.commit

    @wraps(commit)
    def traced_commit(self: Committer, good: Any, **kwargs: Any) -> Any:
        _now["commit"] = _clock()
        try:
            return commit(self, good, **kwargs)
        finally:
            _now["committed"] = _clock()
            _now.setdefault("ops", []).extend(entry.operation.operation_id for _, entry in good)

    _timed(Writer, "_embed", "embed_ms")
    _timed(Writer, "_commit", "tx_ms")
    _timed(Writer, "execute", "execute_ms")
    Consumer._cycle = traced_cycle  # type: ignore[method-assign]
    Consumer._read_all = traced_read_all  # type: ignore[method-assign]
    Consumer._send = traced_send  # type: ignore[method-assign]
    Consumer._find_strays = traced_strays  # type: ignore[method-assign]
    Committer.commit = traced_commit  # type: ignore[method-assign]
    atexit.register(_write, path)


def _replied(at: float) -> None:
    for c in _unsent:
        c["replied"] = at
    _unsent.clear()


def _timed(cls: type, name: str, field: str) -> None:
    method = getattr(cls, name)

    @wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = _clock()
        try:
            return method(*args, **kwargs)
        finally:
            _now[field] = _now.get(field, 0.0) + (_clock() - began) * 1000

    setattr(cls, name, timed)


def _write(path: Path) -> None:
    with path.open("a") as out:
        for c in _cycles:
            out.write(json.dumps(c) + "\n")


def run_worker(path: str, argv: list[str]) -> int:
    """``python -c 'from bench.stages import run_worker; run_worker(PATH, ARGV)'``."""
    install(Path(path))
    from engram.cli import main

    return main(argv)


def read_cycles(paths: list[Path]) -> list[dict[str, Any]]:
    cycles = []
    for path in paths:
        if path.exists():
            cycles += [json.loads(line) for line in path.read_text().splitlines() if line]
    return cycles


if __name__ == "__main__":
    sys.exit(run_worker(sys.argv[1], sys.argv[2:]))
