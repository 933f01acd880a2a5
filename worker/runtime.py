"""Finding the servers and connecting to them: ``DATABASE_URL`` / ``REDIS_URL``, else
the run file of the ``engram up`` running on ``ENGRAM_HOME``.

``engram up`` writes ``ENGRAM_HOME/run.json`` (where its embedded servers
listen) while it runs, so ``engram worker``, ``engram enqueue`` and
``engram metrics`` started from another shell find them without any
configuration. ``DATABASE_URL`` / ``REDIS_URL`` always win.

The run file holds the embedded valkey's password (in its ``redis_url``), so it
is written with ``open_private``; a URL printed or logged goes through ``masked``.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import psutil  # type: ignore[import-untyped]
import redis

from store.errors import ConfigError
from store.processes import process_of

from .settings import Settings

RUN_FILE = "run.json"


def read_run_file(home: Path) -> dict[str, Any] | None:
    """What the ``engram up`` running on ``home`` published, or None: no run file, or
    one left by an ``up`` that is gone (its pid is dead, or now another process's)."""
    try:
        data = json.loads((Path(home) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not _running(data.get("pid"), data.get("create_time")):
        return None
    return data


def _running(pid: object, create_time: object) -> bool:
    if not isinstance(pid, int):
        return False

    def ours(proc: psutil.Process) -> bool:
        started = proc.create_time()
        return not isinstance(create_time, int | float) or abs(started - create_time) < 0.05

    return process_of(pid, ours) is not None


def redis_url(settings: Settings) -> str:
    if settings.redis_url:
        return settings.redis_url
    run = read_run_file(settings.home)
    if run and run.get("redis_url"):
        return str(run["redis_url"])
    raise ConfigError(
        f"set REDIS_URL, or start `engram up` with this ENGRAM_HOME ({settings.home.resolve()})"
    )


def database_url(settings: Settings) -> str:
    if settings.database_url:
        return settings.database_url
    run = read_run_file(settings.home)
    if run and run.get("database_url"):
        return str(run["database_url"])
    raise ConfigError(
        f"set DATABASE_URL, or start `engram up` with this ENGRAM_HOME ({settings.home.resolve()})"
    )


def masked(url: str) -> str:
    """``url`` with its password shown as ``***``: what may be printed or logged."""
    parts = urlsplit(url)
    if not parts.password:  # none, or empty (the embedded PostgreSQL's): nothing to hide
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def open_private(path: Path | str) -> IO[str]:
    """``path`` opened to be written over, readable by its owner only from the moment it
    exists (created 0600, not narrowed after). An existing regular file is narrowed to
    0600 before anything is written to it; a pipe or a device is left as it is."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            # Someone else's file we may write to: it keeps the mode its owner gave it.
            with contextlib.suppress(PermissionError):
                os.fchmod(fd, 0o600)
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def connect_redis(url: str) -> redis.Redis:
    """A client for workers and producers: bytes in and out (entries may be any bytes)."""
    return redis.Redis.from_url(
        url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30
    )
