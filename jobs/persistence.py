"""Purging valkey's persistence files of what was deleted from it.

valkey keeps every write in its append-only file until the file is rewritten:
a deleted stream entry's ``XADD`` (with its text) stays on disk. ``purge``
rewrites the append-only file (``BGREWRITEAOF``) and, if the server also keeps
RDB snapshots, saves a new one (``BGSAVE``), and waits until a rewrite (and a
save) that began after the call has finished well. Concurrent callers share
rewrites: valkey runs one at a time; each caller starts one only when none is
under way, and waits for the first that covers its deletions (counted with
``aof_rewrites`` / ``rdb_saves`` from ``INFO persistence``).

valkey 8 keeps a multi-part append-only file (a directory with a base file,
increments and a manifest); after a rewrite the old parts become history and
are deleted. When the directory is on this machine, ``purge`` also checks that
nothing but the manifest's current files remains in it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

log = logging.getLogger(__name__)


class PurgeError(Exception):
    """A rewrite or save failed, or did not finish in time."""


@dataclass(frozen=True, slots=True)
class Purged:
    aof_rewritten: bool
    rdb_saved: bool
    files_checked: bool  # the append-only directory was on this machine and is clean


def purge(client: redis.Redis, *, wait_s: float) -> Purged:
    deadline = time.monotonic() + wait_s
    config = _config(
        client, "appendonly", "save", "dir", "dbfilename", "appenddirname", "appendfilename"
    )
    info = client.info("persistence")
    aof = config["appendonly"] == "yes"
    # Snapshots on a schedule, or an old snapshot file here (a SAVE once asked for).
    here = Path(config["dir"])
    rdb = bool(config["save"].strip()) or (
        here.is_absolute() and (here / config["dbfilename"]).is_file()
    )
    if aof:
        _rewrite(client, info, deadline)
    if rdb:
        _save(client, info, deadline)
    checked = aof and _history_gone(config, deadline)
    log.info("redis persistence purged", extra={"aof": aof, "rdb": rdb, "files_checked": checked})
    return Purged(aof, rdb, checked)


def _rewrite(client: redis.Redis, info: dict[str, Any], deadline: float) -> None:
    _covered(
        client,
        info,
        deadline,
        count="aof_rewrites",
        busy=("aof_rewrite_in_progress", "aof_rewrite_scheduled"),
        start=client.bgrewriteaof,
        status="aof_last_bgrewrite_status",
        what="append-only file rewrite",
    )


def _save(client: redis.Redis, info: dict[str, Any], deadline: float) -> None:
    _covered(
        client,
        info,
        deadline,
        count="rdb_saves",
        busy=("rdb_bgsave_in_progress",),
        start=lambda: client.bgsave(schedule=True),
        status="rdb_last_bgsave_status",
        what="RDB save",
    )


def _covered(
    client: redis.Redis,
    info: dict[str, Any],
    deadline: float,
    *,
    count: str,
    busy: tuple[str, ...],
    start: Callable[[], Any],
    status: str,
    what: str,
) -> None:
    """Wait until a run (a rewrite, a save) that began after ``info`` was read has ended
    well; start one whenever none is under way. One under way when ``info`` was read
    may have begun before our deletions: then the next one is needed."""
    need = int(info.get(count, 0)) + 1 + int(info.get(busy[0], 0))
    while True:
        now = client.info("persistence")
        running = any(int(now.get(field, 0)) for field in busy)
        if int(now.get(count, 0)) >= need and not running:
            break
        if not running:
            # Another caller may have just started one: then wait for it.
            with contextlib.suppress(redis.ResponseError):
                start()
        if time.monotonic() > deadline:
            raise PurgeError(f"the {what} did not finish in time")
        time.sleep(0.05)
    ended = client.info("persistence").get(status)
    if ended != "ok":
        raise PurgeError(f"the {what} ended with status {ended}")


def _history_gone(config: dict[str, str], deadline: float) -> bool:
    """True once the append-only directory, if it is here, holds only current parts."""
    folder = Path(config["dir"]) / config["appenddirname"]
    manifest = folder / f"{config['appendfilename']}.manifest"
    if not manifest.is_file():
        return False  # not on this machine (or not multi-part): nothing to look at
    while True:
        current = _current_parts(manifest.read_text())
        stale = [
            p.name
            for p in folder.iterdir()
            if p.is_file() and p.name != manifest.name and p.name not in current
        ]
        if not stale:
            return True
        if time.monotonic() > deadline:
            raise PurgeError(f"old append-only file parts are still there: {', '.join(stale)}")
        time.sleep(0.05)


def _current_parts(manifest: str) -> set[str]:
    """The base and increment files a manifest lists (not its history)."""
    parts = set()
    for line in manifest.splitlines():
        fields = line.split()
        info = dict(zip(fields[::2], fields[1::2], strict=False))
        if info.get("type") in ("b", "i") and "file" in info:
            parts.add(info["file"])
    return parts


def _config(client: redis.Redis, *names: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for name in names:
        for key, value in client.config_get(name).items():
            k = key.decode() if isinstance(key, bytes) else str(key)
            found[k] = value.decode() if isinstance(value, bytes) else str(value)
    return {name: found.get(name, "") for name in names}
