"""Pausing and resuming: a partition's consumption, and the jobs queues.

A paused partition is neither read (``XREADGROUP``) nor claimed (``XAUTOCLAIM``)
by any worker: the operations sent meanwhile wait in its stream, and the entries
pending on it stay where they are (nobody delivers them again, so none moves
towards the dead letters). Producers are unaffected. Once resumed, its worker
claims what is pending and reads on, in stream order. Workers look at
``keys.PAUSED`` at most once every ``PAUSE_CHECK_S`` (``PauseWatch``) and report
what they saw in their hash (field ``paused``), so whoever paused can tell when the
pause is in effect.

The jobs queues pause with RQ's own suspension (``rq.suspension``), which an RQ
worker checks before it waits for a job; engram's jobs worker looks again right
before it starts each job it took (a job taken after the pause goes back to the
front of its queue) and, while it holds the pause, says so in its RQ worker hash
(field ``JOBS_SEEN_FIELD``: the pause's ``at_ms``). Once every live jobs worker
says so (``jobs_not_yet_seen`` is empty), no job starts until the jobs are resumed;
until then a worker left in it may still be running the job in hand
(``jobs.runner.JobsWorker``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import redis
from rq.suspension import is_suspended, resume, suspend

from engram.worker import keys

if TYPE_CHECKING:
    from engram.store.audit import Audit

# How often a worker reads the paused partitions: a pause or a resume takes effect
# within about this long plus one blocking read (``ENGRAM_BLOCK_MS``).
PAUSE_CHECK_S = 1.0
# Longest reason kept, in characters.
MAX_REASON_CHARS = 200


@dataclass(frozen=True, slots=True)
class Pause:
    """Who paused something, when, and why."""

    by: str
    at_ms: int
    reason: str = ""

    @property
    def at(self) -> datetime | None:
        return datetime.fromtimestamp(self.at_ms / 1000, UTC) if self.at_ms else None

    def as_dict(self) -> dict[str, Any]:
        at = self.at
        return {"by": self.by, "at": at.isoformat() if at else None, "reason": self.reason}

    def encode(self) -> str:
        return json.dumps({"by": self.by, "at_ms": self.at_ms, "reason": self.reason})

    def describe(self) -> str:
        """Who, since when and why, for a message: ``by ada since 2026-12-04 21:30:05
        UTC (reindex)``. Read from Redis: what is not printable is shown as a space."""
        at = self.at
        since = f" since {at:%Y-%m-%d %H:%M:%S} UTC" if at else ""
        why = f" ({_printable(self.reason)})" if self.reason else ""
        return f"by {_printable(self.by)}{since}{why}"

    @classmethod
    def decode(cls, raw: bytes | str | None) -> Pause:
        """Whatever is stored; something unreadable is a pause by ``unknown``."""
        try:
            data = json.loads(raw or "")
            return cls(str(data["by"]), int(data["at_ms"]), str(data.get("reason") or ""))
        except (ValueError, TypeError, KeyError):
            return cls("unknown", 0)

    @classmethod
    def now(cls, by: str, reason: str = "") -> Pause:
        return cls(by, int(time.time() * 1000), clean_reason(reason))


def clean_reason(reason: str) -> str:
    """An operator's why for a pause or a resume: printable, at most ``MAX_REASON_CHARS``."""
    printable = "".join(c if c.isprintable() else " " for c in reason)
    return printable.strip()[:MAX_REASON_CHARS]


@dataclass(frozen=True, slots=True)
class PausedState:
    """What is paused: partitions by number, and the jobs queues (or ``None``)."""

    partitions: dict[int, Pause]
    jobs: Pause | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "partitions": [
                {"partition": n, **p.as_dict()} for n, p in sorted(self.partitions.items())
            ],
            "jobs": {"paused": True, **self.jobs.as_dict()}
            if self.jobs is not None
            else {"paused": False, "by": None, "at": None, "reason": ""},
        }


def check_partition(partition: int, partitions: int) -> None:
    if not 0 <= partition < partitions:
        raise ValueError(f"no partition {partition}: they are numbered 0 to {partitions - 1}")


# -- partitions ----------------------------------------------------------------------


def pause_partition(client: redis.Redis, partition: int, pause: Pause, *, pipe: Any = None) -> None:
    (pipe if pipe is not None else client).hset(keys.PAUSED, str(partition), pause.encode())


def resume_partition(client: redis.Redis, partition: int, *, pipe: Any = None) -> bool:
    """Whether it was paused (always ``True`` in a pipeline)."""
    if pipe is not None:
        pipe.hdel(keys.PAUSED, str(partition))
        return True
    return bool(client.hdel(keys.PAUSED, str(partition)))


def paused_partitions(client: redis.Redis) -> dict[int, Pause]:
    found = {}
    for field, raw in client.hgetall(keys.PAUSED).items():
        number = _int(field)
        if number is not None:
            found[number] = Pause.decode(raw)
    return found


def paused_numbers(client: redis.Redis) -> frozenset[int]:
    """The paused partitions' numbers alone: what a worker reads each second."""
    return frozenset(n for f in client.hkeys(keys.PAUSED) if (n := _int(f)) is not None)


def report(client: redis.Redis, worker_id: str, paused: Iterable[int]) -> None:
    """What this worker last saw paused, in its hash: the pause is in effect there."""
    client.hset(keys.worker(worker_id), "paused", ",".join(map(str, sorted(paused))))


def not_yet_seen(partition: int, workers: Iterable[Mapping[str, Any]]) -> list[str]:
    """The ids of ``workers`` (live workers' descriptions, as
    ``membership.live_workers`` gives them) whose last report does not hold
    ``partition`` paused. A pause is asynchronous: it is in effect everywhere once
    this is empty; until then a worker left in it may still read the partition."""
    return [
        str(w.get("id"))
        for w in workers
        if str(partition) not in str(w.get("paused") or "").split(",")
    ]


class PauseWatch:
    """A worker's view of the paused partitions, read again once ``due``."""

    def __init__(self, every_s: float = PAUSE_CHECK_S) -> None:
        self.every_s = every_s
        self.paused: frozenset[int] = frozenset()
        self._next_s = 0.0
        self._seen = False

    def due(self, now_s: float) -> bool:
        return now_s >= self._next_s

    def update(self, paused: frozenset[int], now_s: float) -> bool:
        """Take what was read; whether it differs from what was seen before."""
        changed = not self._seen or paused != self.paused
        self.paused, self._seen, self._next_s = paused, True, now_s + self.every_s
        return changed


# -- the jobs queues -------------------------------------------------------------------


def pause_jobs(client: redis.Redis, pause: Pause) -> None:
    """Suspend the RQ workers, saying who and why."""
    client.set(keys.PAUSED_JOBS, pause.encode())
    suspend(client)


def resume_jobs(client: redis.Redis) -> bool:
    """Whether the jobs were paused."""
    was = bool(is_suspended(client))
    resume(client)
    client.delete(keys.PAUSED_JOBS)
    return was


# The field of an RQ worker's hash in which an engram jobs worker says which pause of
# the jobs it holds (the pause's ``at_ms``; absent when it holds none).
JOBS_SEEN_FIELD = "engram_paused"


def report_jobs(client: redis.Redis, worker_key: str, held: Pause | None) -> None:
    """What a jobs worker holds, in its RQ worker hash (``worker_key``): ``held``, a
    pause it saw with no job in hand (it starts none until resumed), or None."""
    if held is None:
        client.hdel(worker_key, JOBS_SEEN_FIELD)
    else:
        client.hset(worker_key, JOBS_SEEN_FIELD, str(held.at_ms))


def jobs_not_yet_seen(held: Pause, workers: Iterable[Mapping[str, Any]]) -> list[str]:
    """The names of ``workers`` (live jobs workers, as ``jobs.runner.pause_reports``
    describes them) that do not yet hold the pause ``held``: the pause is in effect
    once this is empty."""
    return [str(w.get("name")) for w in workers if w.get("paused") != str(held.at_ms)]


def jobs_paused(client: redis.Redis) -> Pause | None:
    """Who paused the jobs, or ``None``; a suspension made elsewhere (``rq suspend``)
    is a pause by ``rq``."""
    if not is_suspended(client):
        return None
    raw = client.get(keys.PAUSED_JOBS)
    return Pause.decode(raw) if raw is not None else Pause("rq", 0)


def paused(client: redis.Redis, jobs_client: redis.Redis | None = None) -> PausedState:
    """The paused partitions (on the streams' ``client``) and the jobs (on the jobs'
    Redis, ``jobs_client``, when they live on another server)."""
    return PausedState(paused_partitions(client), jobs_paused(jobs_client or client))


# -- audited: what the dashboard and the CLI do -----------------------------------------


def hold(client: redis.Redis, audit: Audit, partition: int | None, pause: Pause) -> None:
    """Pause ``partition`` (``None``: the jobs), then write who and why to the audit
    trail."""
    detail = {"reason": pause.reason} if pause.reason else {}
    if partition is None:
        pause_jobs(client, pause)
        audit.record(pause.by, "jobs.pause", "jobs", detail)
    else:
        pause_partition(client, partition, pause)
        audit.record(pause.by, "partition.pause", str(partition), detail)


def release(
    client: redis.Redis, audit: Audit, who: str, partition: int | None, why: str = ""
) -> bool:
    """Resume ``partition`` (``None``: the jobs) and audit it, with who and why; whether
    it was paused."""
    why = clean_reason(why)
    if partition is None:
        was = resume_jobs(client)
        audit.record(who, "jobs.resume", "jobs", _detail(was, why))
    else:
        was = resume_partition(client, partition)
        audit.record(who, "partition.resume", str(partition), _detail(was, why))
    return was


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else " " for c in text)[:MAX_REASON_CHARS]


def _detail(was: bool, why: str) -> dict[str, bool | str]:
    return {"was_paused": was, "reason": why} if why else {"was_paused": was}


def _int(value: bytes | str) -> int | None:
    text = value.decode() if isinstance(value, bytes) else value
    return int(text) if text.isdigit() else None
