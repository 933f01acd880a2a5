"""The run file, ``ENGRAM_HOME/run.json``: what the owner of a home (``engram up``, or
a command holding the home lock) publishes while it runs.

It names the owner (pid and start time, so a reused pid is never taken for it),
the URLs its embedded servers listen on (engram's own: their Unix sockets; valkey's
TCP URL apart, ``redis_tcp_url``, for other clients), and every process it started
(for its watchdog, and for the next owner should it die). It holds the embedded
valkey's password (in those URLs), so it is written owner-readable only, and
whole: a reader sees the old file or the new, never half of one.

Written by ``engram.home``; read here by whoever looks for the servers (a
worker, a producer, the CLI: ``runtime``), and by the cleanup of a dead owner.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from engram.store.processes import process_of
from engram.worker.embedded.private import open_private

NAME = "run.json"


def path(home: Path) -> Path:
    return Path(home) / NAME


def read_live(home: Path) -> dict[str, Any] | None:
    """What the owner running on ``home`` published, or None: no run file, or one left
    by an owner that is gone (its pid is dead, or now another process's)."""
    data = read_any(home)
    if data is None or not _running(data.get("pid"), data.get("create_time")):
        return None
    return data


def read_any(home: Path) -> dict[str, Any] | None:
    """The run file as it is, whoever wrote it, alive or not (for the cleanup of a
    dead owner); None if there is none or it is not a JSON object."""
    try:
        data = json.loads(path(home).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write(home: Path, data: dict[str, Any]) -> None:
    target = path(home)
    tmp = target.with_suffix(".tmp")
    with open_private(tmp) as f:  # it holds the Redis password
        f.write(json.dumps(data, indent=2))
    os.replace(tmp, target)


def remove(home: Path) -> None:
    path(home).unlink(missing_ok=True)


def _running(pid: object, create_time: object) -> bool:
    if not isinstance(pid, int):
        return False

    def ours(proc: Any) -> bool:
        started = proc.create_time()
        return not isinstance(create_time, int | float) or abs(started - create_time) < 0.05

    return process_of(pid, ours) is not None
