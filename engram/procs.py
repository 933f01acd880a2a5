"""Processes engram starts, named by pid *and* start time, so a reused pid is never mistaken
for one of ours; stopping them; and tying a child's life to its parent's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psutil  # type: ignore[import-untyped]

from engram.store.processes import process_of

# psutil computes a start time from the boot time and the process's start tick: two
# reads of one process agree to far better than this.
_SAME_START_S = 0.05
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """A process we started: how to find it again and how to stop it."""

    name: str
    pid: int
    create_time: float
    stop_signal: int = signal.SIGTERM
    stop_timeout_s: float = 30.0

    @classmethod
    def of(
        cls, name: str, pid: int, *, stop_signal: int = signal.SIGTERM, stop_timeout_s: float = 30.0
    ) -> ProcessRecord:
        return cls(name, pid, psutil.Process(pid).create_time(), stop_signal, stop_timeout_s)

    def process(self) -> psutil.Process | None:
        """The live process this record names, or None (gone, or its pid now someone else's)."""
        return live_process(self.pid, self.create_time)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "create_time": self.create_time,
            "stop_signal": signal.Signals(self.stop_signal).name,
            "stop_timeout_s": self.stop_timeout_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessRecord:
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            create_time=float(data["create_time"]),
            stop_signal=signal.Signals[str(data.get("stop_signal", "SIGTERM"))],
            stop_timeout_s=float(data.get("stop_timeout_s", 30.0)),
        )


def live_process(pid: int, create_time: float | None = None) -> psutil.Process | None:
    """The process ``pid`` if it runs (and started at ``create_time``, when given)."""

    def ours(proc: psutil.Process) -> bool:
        return create_time is None or abs(proc.create_time() - create_time) <= _SAME_START_S

    return process_of(pid, ours)


def stop_processes(
    records: Iterable[ProcessRecord], *, on_stop: Callable[[ProcessRecord, str], None] | None = None
) -> None:
    """Stop each live process in turn: its stop signal, then SIGKILL after its timeout.

    ``on_stop(record, how)`` is told of each one that was still running
    (``how`` is ``stopped`` or ``killed``)."""
    for record in records:
        proc = record.process()
        if proc is None:
            continue
        how = stop_process(proc, record.stop_signal, record.stop_timeout_s)
        if on_stop is not None:
            on_stop(record, how)


def stop_process(proc: psutil.Process, signum: int, timeout_s: float) -> str:
    """Send ``signum``, wait up to ``timeout_s``, then SIGKILL; ``stopped`` or ``killed``."""
    try:
        proc.send_signal(signum)
        proc.wait(timeout=timeout_s)
        return "stopped"
    except psutil.NoSuchProcess:
        return "stopped"
    except psutil.TimeoutExpired:
        pass
    try:
        proc.kill()
        proc.wait(timeout=10)
    except psutil.Error:
        pass
    return "killed"


def wait_gone(pids: Iterable[int], timeout_s: float) -> bool:
    """Whether every one of ``pids`` has exited within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    remaining = set(pids)
    while True:
        remaining = {p for p in remaining if live_process(p) is not None}
        if not remaining or time.monotonic() > deadline:
            return not remaining
        time.sleep(0.05)


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child get SIGTERM when its parent dies, however
    it dies (SIGKILL included): Linux's ``PR_SET_PDEATHSIG``.

    Resolved here, in the parent, so the child does as little as possible between
    fork and exec. A parent that died before the child set it is noticed at once.
    """
    parent = os.getpid()
    prctl: Any = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec
