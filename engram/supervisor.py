"""The children ``engram up`` runs: named commands, restarted when they exit.

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
