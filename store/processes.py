"""Is this pid still the process we mean? A pid is reused once its process is gone,
so a pid read from a file (a server's pid file, ``engram up``'s run file) names
ours only while the process there also looks like ours: its name, its folder, or
the time it started."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psutil  # type: ignore[import-untyped]


def process_of(
    pid: int, is_ours: Callable[[psutil.Process], bool] = lambda proc: True
) -> psutil.Process | None:
    """The live process ``pid``, if ``is_ours`` says it is (a zombie is not live)."""
    try:
        proc = psutil.Process(pid)
        if not is_ours(proc) or proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except (OSError, psutil.Error):
        return None
    return proc


def process_in_pid_file(
    path: Path, is_ours: Callable[[psutil.Process], bool]
) -> psutil.Process | None:
    """The process named by the first line of the pid file ``path``, if it is ours."""
    try:
        pid = int(path.read_text().split("\n", 1)[0].strip())
    except (OSError, ValueError):
        return None
    return process_of(pid, is_ours)
