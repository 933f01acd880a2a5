"""The jobs' settings, read once from the environment and passed explicitly.

Durations are written with a unit: ``30d``, ``12h``, ``15m``, ``45s``
(``off`` or ``0`` turns a retention off).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from engram.store.errors import InvalidRequestError
from engram.store.masking import MASKED_URL, masked_repr

BUILTIN_LISTENERS = ("redis", "postgres", "webhook")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True, slots=True)
class Retention:
    """How long history, receipts, dead letters and the scoped tokens' read log are
    kept; None keeps them."""

    history_s: float | None = 30 * 86400
    # Off by default: a pruned receipt no longer deduplicates its operation id.
    receipts_s: float | None = None
    dead_letters_s: float | None = 14 * 86400
    # The read log (store.tokens): who read which record revision, content-free.
    token_reads_s: float | None = 90 * 86400
    every_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class Redaction:
    """The forget listeners and how they run."""

    # Built-in names and package.module:callable plug-ins, in the order they run.
    listeners: tuple[str, ...] = ("redis", "postgres", "webhook")
    webhook_url: str | None = field(default=None, metadata=MASKED_URL)
    webhook_secret: str | None = field(default=None, repr=False)
    # Pauses before each retry of a failed redaction job; the last failure is final.
    retry_s: tuple[int, ...] = (10, 60, 300)
    # Rewrite valkey's append-only file (and save its RDB file, if it keeps one) so that
    # a forgotten text leaves its persistence files too.
    purge_redis_files: bool = True
    # Rebuild the full-text index after the VACUUM: its keys keep forgotten words.
    reindex_text: bool = True
    # How long a listener waits for open transactions, a file rewrite or stream entries.
    wait_s: float = 60.0
    # A forget still pending this long after its commit is handed to the listeners again.
    sweep_after_s: float = 300.0
    # A forget whose redaction job was lost this many times (handed over again each
    # time) is not handed over again: it ends failed, and later forgets go on.
    max_handovers: int = 5

    __repr__ = masked_repr


@dataclass(frozen=True, slots=True)
class Reembed:
    batch_size: int = 64
    # One RQ job does at most this much work, then enqueues the next slice: the other
    # queues are served in between, and a stopped worker leaves a slice to resume.
    slice_s: float = 60.0
    lease_ttl_ms: int = 30_000
    # A switch holds writes off while it embeds the last gaps: for about this long at
    # most (at the rate measured so far), and never for fewer than a batch.
    switch_hold_s: float = 1.0
    # After three passes without a switch (records kept changing), wait this long.
    resume_after_s: float = 2.0
    # Retries of a slice that raised, before the re-embedding is marked failed.
    retry_s: tuple[int, ...] = (5, 30, 120)


@dataclass(frozen=True, slots=True)
class JobsSettings:
    retention: Retention = Retention()
    redaction: Redaction = Redaction()
    reembed: Reembed = Reembed()
    # How often a jobs worker runs its scheduler, its schedules and its watchdogs: a
    # delayed job or a retry waits up to this much longer than asked.
    tick_s: float = 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JobsSettings:
        env = os.environ if env is None else env
        listeners = tuple(
            name.strip()
            for name in env.get("ENGRAM_FORGET_LISTENERS", ",".join(BUILTIN_LISTENERS)).split(",")
            if name.strip()
        )
        for name in listeners:
            if name not in BUILTIN_LISTENERS and not re.fullmatch(r"[\w.]+:\w+", name):
                raise InvalidRequestError(
                    f"ENGRAM_FORGET_LISTENERS: {name!r} is neither "
                    f"{', '.join(BUILTIN_LISTENERS)} nor package.module:callable"
                )
        return cls(
            retention=Retention(
                history_s=duration(env, "ENGRAM_RETAIN_HISTORY", "30d"),
                receipts_s=duration(env, "ENGRAM_RETAIN_RECEIPTS", "off"),
                dead_letters_s=duration(env, "ENGRAM_RETAIN_DEAD_LETTERS", "14d"),
                token_reads_s=duration(env, "ENGRAM_RETAIN_TOKEN_READS", "90d"),
                every_s=duration(env, "ENGRAM_PRUNE_EVERY", "1h") or 3600.0,
            ),
            redaction=Redaction(
                listeners=listeners,
                webhook_url=env.get("ENGRAM_FORGET_WEBHOOK_URL") or None,
                webhook_secret=env.get("ENGRAM_FORGET_WEBHOOK_SECRET") or None,
                retry_s=_seconds_list(env, "ENGRAM_REDACTION_RETRY", "10s,60s,300s"),
                purge_redis_files=env.get("ENGRAM_REDIS_PURGE_FILES", "on") != "off",
                reindex_text=env.get("ENGRAM_REDACTION_REINDEX", "on") != "off",
                wait_s=duration(env, "ENGRAM_REDACTION_WAIT", "60s") or 60.0,
                sweep_after_s=duration(env, "ENGRAM_REDACTION_SWEEP_AFTER", "5m") or 300.0,
                max_handovers=int(env.get("ENGRAM_REDACTION_MAX_HANDOVERS") or 5),
            ),
            reembed=Reembed(
                batch_size=int(env.get("ENGRAM_REEMBED_BATCH_SIZE") or 64),
                slice_s=duration(env, "ENGRAM_REEMBED_SLICE", "60s") or 60.0,
                lease_ttl_ms=int(1000 * (duration(env, "ENGRAM_REEMBED_LEASE_TTL", "30s") or 30.0)),
                switch_hold_s=duration(env, "ENGRAM_REEMBED_SWITCH_HOLD", "1s") or 1.0,
                resume_after_s=duration(env, "ENGRAM_REEMBED_RESUME_AFTER", "2s") or 2.0,
                retry_s=_seconds_list(env, "ENGRAM_REEMBED_RETRY", "5s,30s,120s"),
            ),
            tick_s=duration(env, "ENGRAM_JOBS_TICK", "5s") or 5.0,
        )


def parse_duration(value: str, what: str = "duration") -> float | None:
    """``"30d"`` -> 2592000.0; ``"off"`` or ``"0"`` -> None."""
    text = value.strip().lower()
    if text in ("off", "0", "none"):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", text)
    if not match:
        raise InvalidRequestError(f"{what} must look like 30d, 12h, 15m, 45s or off, not {value!r}")
    return float(match[1]) * _UNITS[match[2]]


def duration(env: Mapping[str, str], name: str, default: str) -> float | None:
    return parse_duration(env.get(name) or default, name)


def _seconds_list(env: Mapping[str, str], name: str, default: str) -> tuple[int, ...]:
    values = [parse_duration(v, name) for v in (env.get(name) or default).split(",") if v.strip()]
    return tuple(max(1, round(v)) for v in values if v is not None)
