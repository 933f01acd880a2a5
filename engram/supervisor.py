"""The children ``engram up`` runs: named commands, restarted when they exit; and the
embedded servers it started (``ServerWatch``), restarted when they die.

Adding a kind of child (``engram web``, ``engram jobs``) is one more
``ChildSpec``. Every child gets SIGTERM from the kernel when the supervisor
dies, however it dies (``PR_SET_PDEATHSIG``), and each one started is
reported to ``on_start`` (which records it for the home's watchdog).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engram.store.errors import EngramError

from .procs import ProcessRecord, die_with_parent

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChildSpec:
    name: str
    argv: Sequence[str]
    restart: bool = True  # start it again when it exits (after a pause if it exits soon)
    stop_signal: int = signal.SIGTERM
    stop_timeout_s: float = 30.0
    # A child that exits sooner than this after its start is restarted only after a pause.
    restart_pause_s: float = 2.0
    # Descriptors the child inherits under the same numbers (the dashboard's listening socket).
    pass_fds: tuple[int, ...] = ()


@dataclass(slots=True)
class _Running:
    spec: ChildSpec
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)


class Supervisor:
    def __init__(
        self,
        specs: Sequence[ChildSpec],
        env: Mapping[str, str],
        *,
        on_start: Callable[[ProcessRecord], None] = lambda record: None,
    ) -> None:
        if len({s.name for s in specs}) != len(specs):
            raise ValueError("child names must be unique")
        self.specs = list(specs)
        self.env = dict(env)
        self.on_start = on_start
        self.children: list[_Running] = []

    def start(self) -> None:
        self.children = [self._spawn(spec) for spec in self.specs]

    def _spawn(self, spec: ChildSpec) -> _Running:
        process = subprocess.Popen(
            list(spec.argv), env=self.env, pass_fds=spec.pass_fds, preexec_fn=die_with_parent()
        )
        self.on_start(
            ProcessRecord.of(
                spec.name,
                process.pid,
                stop_signal=spec.stop_signal,
                stop_timeout_s=spec.stop_timeout_s,
            )
        )
        log.info(f"{spec.name} started", extra={"pid": process.pid})
        return _Running(spec, process)

    def check(self) -> None:
        """Restart a child that exited (not too eagerly, if it keeps failing)."""
        for i, child in enumerate(self.children):
            code = child.process.poll()
            if code is None or not child.spec.restart:
                continue
            if time.monotonic() - child.started < child.spec.restart_pause_s:
                continue
            log.warning(f"{child.spec.name} exited, restarting", extra={"code": code})
            self.children[i] = self._spawn(child.spec)

    def stop(self) -> None:
        """Signal every child at once, then wait for each (SIGKILL past its timeout)."""
        for child in self.children:
            if child.process.poll() is None:
                child.process.send_signal(child.spec.stop_signal)
        signalled = time.monotonic()
        for child in self.children:
            remaining = signalled + child.spec.stop_timeout_s - time.monotonic()
            try:
                child.process.wait(timeout=max(remaining, 0.1))
            except subprocess.TimeoutExpired:
                log.warning(f"{child.spec.name} did not stop, killing it")
                child.process.kill()
                child.process.wait()
        self.children = []


class ServerGaveUpError(EngramError):
    """An embedded server kept dying: ``up`` stops everything rather than run without it."""

    code = "server_gave_up"
    status = 503


class Server(Protocol):
    """An embedded server (PostgreSQL, valkey): daemonised, so watched by its pid file."""

    @property
    def pid(self) -> int | None: ...

    def running(self) -> bool: ...

    def restart(self) -> object: ...


@dataclass(slots=True)
class RestartBudget:
    """At most ``max_tries`` restart tries within ``window_s``; the pause before each
    doubles from ``first_pause_s`` up to ``max_pause_s``."""

    max_tries: int = 5
    window_s: float = 300.0
    first_pause_s: float = 1.0
    max_pause_s: float = 15.0
    tries: list[float] = field(default_factory=list)

    def next_pause_s(self, now: float) -> float | None:
        """The pause before the next try, counting it; None once the budget is spent."""
        self.tries = [t for t in self.tries if now - t < self.window_s]
        if len(self.tries) >= self.max_tries:
            return None
        pause = min(self.first_pause_s * (1 << len(self.tries)), self.max_pause_s)
        self.tries.append(now)
        return pause


class ServerWatch:
    """Restart ``server`` when it dies (same folder, same port: the URLs handed out stay
    right), after a pause that grows; ``ServerGaveUpError`` once its budget is spent."""

    def __init__(
        self,
        name: str,
        server: Server,
        *,
        budget: RestartBudget | None = None,
        on_start: Callable[[int], None] = lambda pid: None,
    ) -> None:
        self.name = name
        self.server = server
        self.budget = budget or RestartBudget()
        self.on_start = on_start
        self._next_try: float | None = None

    def check(self) -> None:
        now = time.monotonic()
        if self._next_try is None:
            if self.server.running():
                return
            log.warning(f"{self.name} died, restarting")
            self._schedule(now)
        if self._next_try is None or now < self._next_try:
            return
        try:
            self.server.restart()
        except Exception as exc:
            log.warning(f"{self.name} did not start again", extra={"error": repr(exc)})
            self._schedule(now)
            return
        self._next_try = None
        log.warning(f"{self.name} restarted", extra={"pid": self.server.pid})
        if self.server.pid:
            self.on_start(self.server.pid)

    def _schedule(self, now: float) -> None:
        pause = self.budget.next_pause_s(now)
        if pause is None:
            raise ServerGaveUpError(
                f"the embedded {self.name} keeps dying or will not start: {self.budget.max_tries}"
                f" restarts tried within {self.budget.window_s:.0f} s; stopping everything"
            )
        self._next_try = now + pause
