"""What an owner of a home that died left behind, stopped and removed: run by the
next owner before it starts, or by the dead owner's watchdog (``engram.watchdog``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from engram.store.server import EmbeddedPostgres
from engram.worker.embedded import runfile
from engram.worker.embedded.valkey import EmbeddedValkey

from .procs import ProcessRecord, stop_processes

log = logging.getLogger(__name__)


def run_file_records(home: Path) -> list[ProcessRecord]:
    """The processes the home's run file names (whoever wrote it, alive or not)."""
    data = runfile.read_any(home) or {}
    try:
        return [ProcessRecord.from_dict(p) for p in data.get("processes", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def clean_home(home: Path) -> None:
    """What an owner that died left: the processes its run file names (newest first),
    servers still running on the home's folders, stale pid and handle files, the run
    file. Only for the holder of the home lock: whatever runs there is not anyone else's.
    Each step is tried even if one before it failed."""
    steps: tuple[Callable[[], object], ...] = (
        lambda: stop_processes(reversed(run_file_records(home)), on_stop=_said_stopped),
        lambda: EmbeddedValkey.stop_stale(home),
        lambda: EmbeddedPostgres.stop_stale(home),
        lambda: runfile.remove(home),
    )
    for step in steps:
        try:
            step()
        except Exception:
            log.exception("cleaning up the home failed at one step")


def _said_stopped(record: ProcessRecord, how: str) -> None:
    log.warning(f"{how} a process left running", extra={"child": record.name, "pid": record.pid})
