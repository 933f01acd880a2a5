"""One owner per ``ENGRAM_HOME`` at a time, and nothing left running after it.

The owner (``engram up``, or a command that starts the embedded PostgreSQL for
its own use) holds ``ENGRAM_HOME/up.lock`` (``flock``; the kernel releases it
however the holder dies) and records every process it starts in the run file
(``worker.runfile``: pid and start time, so a reused pid is never taken for ours).
A watchdog process shares the lock: when the owner dies without cleaning up,
the watchdog stops what the run file names and whatever still runs on the
home's server folders, then exits, and only then is the home free. If the
watchdog died too, the next owner does the same cleanup before it starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from engram.store.errors import EngramError
from engram.store.home import make_private
from engram.store.masking import mask_url
from engram.worker.embedded import runfile

from .cleanup import clean_home
from .procs import ProcessRecord, live_process, stop_processes
from .watchdog import CLOSED

log = logging.getLogger(__name__)

LOCK_FILE = "up.lock"
UP = "engram up"  # the command of a long-running owner: others never wait for it
# How long a new owner waits for the watchdog of an owner that died to finish its cleanup.
CLEANUP_WAIT_S = 90.0


class HomeInUseError(EngramError):
    """Another engram process owns this ENGRAM_HOME; nothing was started or changed."""

    code = "home_in_use"
    status = 409


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a home's lock, as it wrote itself down in the lock file."""

    pid: int
    create_time: float
    command: str

    def alive(self) -> bool:
        return live_process(self.pid, self.create_time) is not None


class HomeLock:
    """``ENGRAM_HOME/up.lock``, held with ``flock`` (never inherited by the children
    we exec: Python opens files close-on-exec), and who holds it."""

    def __init__(self, home: Path) -> None:
        self.path = Path(home) / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self, command: str) -> bool:
        """Take the lock if it is free (never waits) and write down who holds it; the
        home is made (or narrowed to) its owner's only first (``store.home``)."""
        make_private(self.path.parent)
        f = open(self.path, "a+")  # noqa: SIM115 - held open for as long as the lock
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return False
        me = live_process(os.getpid())
        f.seek(0)
        f.truncate()
        f.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "create_time": me.create_time() if me else 0,
                    "command": command,
                }
            )
        )
        f.flush()
        self._file = f
        return True

    def holder(self) -> Holder | None:
        try:
            data = json.loads(self.path.read_text())
            return Holder(int(data["pid"]), float(data["create_time"]), str(data["command"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @property
    def fd(self) -> int:
        if self._file is None:
            raise RuntimeError("the home lock is not held")
        return self._file.fileno()

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # the last descriptor closed releases the flock
            self._file = None


def in_use_message(home: Path, holder: Holder | None) -> str:
    """Who holds the home, with the URLs its run file publishes."""
    who = f"{holder.command} (pid {holder.pid})" if holder else "another engram process"
    lines = [f"ENGRAM_HOME {Path(home).resolve()} is in use by {who}"]
    run = runfile.read_live(home)
    if run:
        for name, key in (
            ("PostgreSQL", "database_url"),
            ("Redis", "redis_url"),
            ("dashboard", "dashboard_url"),
        ):
            if run.get(key):
                lines.append(f"  {name:<11} {mask_url(str(run[key]))}")
    return "\n".join(lines)


class HomeSession:
    """Owning a home: the lock, the watchdog, and the run file of what we started.

    ``open`` takes the lock (``HomeInUseError`` when another live process holds it;
    if its holder died and a watchdog is still cleaning up after it, waits for that),
    starts the watchdog, and cleans up what a crashed owner left. ``close`` stops
    everything recorded, newest first, removes the run file and frees the home.
    """

    def __init__(self, home: Path, command: str) -> None:
        self.home = Path(home)
        self.command = command
        self.lock = HomeLock(self.home)
        self.records: list[ProcessRecord] = []
        self.published: dict[str, Any] = {}
        self._watchdog: subprocess.Popen[bytes] | None = None

    def open(self) -> HomeSession:
        self._acquire()
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-m", "engram.watchdog", str(self.home.resolve())],
                stdin=subprocess.PIPE,
                pass_fds=(self.lock.fd,),
                # Its own session: a Ctrl-C meant for us does not reach it.
                start_new_session=True,
            )
            clean_home(self.home)
            self._write()
        except BaseException:
            self.close()
            raise
        return self

    def _acquire(self) -> None:
        """Refuse at once if a live ``engram up`` owns the home; wait for a one-off
        command to finish with it, or for the watchdog of a dead owner to clean up."""
        deadline = time.monotonic() + CLEANUP_WAIT_S
        said = None
        while not self.lock.acquire(self.command):
            holder = self.lock.holder()
            alive = holder if holder is not None and holder.alive() else None
            if (alive and alive.command == UP) or time.monotonic() > deadline:
                raise HomeInUseError(in_use_message(self.home, holder))
            why = (
                f"{alive.command} (pid {alive.pid}) to finish with this home"
                if alive
                else "what an engram process that died left running to be stopped"
            )
            if why != said:
                print(f"engram: waiting for {why}", file=sys.stderr, flush=True)
                said = why
            time.sleep(0.2)

    def record(self, record: ProcessRecord) -> None:
        """Note a process we started, in the run file, before anything else happens."""
        self.records = [r for r in self.records if r.name != record.name] + [record]
        self._write()

    def publish(self, **fields: Any) -> None:
        """Add what clients read (URLs) to the run file."""
        self.published.update(fields)
        self._write()

    def _write(self) -> None:
        me = live_process(os.getpid())
        data = {
            "pid": os.getpid(),
            "create_time": me.create_time() if me else 0,
            "command": self.command,
            **self.published,
            "processes": [r.as_dict() for r in self.records],
        }
        runfile.write(self.home, data)

    def close(self) -> None:
        """Stop what we recorded (newest first), remove the run file, free the home."""
        try:
            stop_processes(reversed(self.records))
            self.records = []
            with contextlib.suppress(OSError):
                runfile.remove(self.home)
        finally:
            if self._watchdog is not None:
                self._stop_watchdog(self._watchdog)
                self._watchdog = None
            self.lock.release()

    @staticmethod
    def _stop_watchdog(watchdog: subprocess.Popen[bytes]) -> None:
        """Tell it we closed cleanly: it exits without looking for anything to stop."""
        with contextlib.suppress(OSError):
            if watchdog.stdin is not None:
                watchdog.stdin.write(CLOSED)
                watchdog.stdin.close()
        try:
            watchdog.wait(timeout=30)
        except subprocess.TimeoutExpired:
            watchdog.kill()
            watchdog.wait()

    def __enter__(self) -> HomeSession:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
