"""The jobs' settings, read once from the environment and passed explicitly.

Durations are written with a unit (``engram.store.env``): ``30d``, ``12h``, ``15m``,
``45s``, ``500ms`` (``off`` or ``0`` turns a retention off).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from engram.store.env import Env, duration_form, is_off
from engram.store.env import parse_duration as seconds_of
from engram.store.errors import ConfigError, InvalidRequestError
from engram.store.masking import MASKED_URL, masked_repr

BUILTIN_LISTENERS = ("redis", "postgres", "webhook")


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
    listeners: tuple[str, ...] = BUILTIN_LISTENERS
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
        read = Env(env)
        return cls(
            retention=_retention(read),
            redaction=_redaction(read),
            reembed=_reembed(read),
            tick_s=read.duration("ENGRAM_JOBS_TICK", _DEFAULTS.tick_s),
        )


_DEFAULTS = JobsSettings()


def _retention(read: Env) -> Retention:
    base = _DEFAULTS.retention
    return Retention(
        history_s=read.duration_or_off("ENGRAM_RETAIN_HISTORY", base.history_s),
        receipts_s=read.duration_or_off("ENGRAM_RETAIN_RECEIPTS", base.receipts_s),
        dead_letters_s=read.duration_or_off("ENGRAM_RETAIN_DEAD_LETTERS", base.dead_letters_s),
        token_reads_s=read.duration_or_off("ENGRAM_RETAIN_TOKEN_READS", base.token_reads_s),
        every_s=read.duration("ENGRAM_PRUNE_EVERY", base.every_s),
    )


def _redaction(read: Env) -> Redaction:
    base = _DEFAULTS.redaction
    listeners = read.items("ENGRAM_FORGET_LISTENERS", base.listeners)
    for name in listeners:
        if name not in BUILTIN_LISTENERS and not re.fullmatch(r"[\w.]+:\w+", name):
            raise ConfigError(
                f"ENGRAM_FORGET_LISTENERS: {name!r} is neither "
                f"{', '.join(BUILTIN_LISTENERS)} nor package.module:callable"
            )
    return Redaction(
        listeners=listeners,
        webhook_url=read.optional("ENGRAM_FORGET_WEBHOOK_URL"),
        webhook_secret=read.optional("ENGRAM_FORGET_WEBHOOK_SECRET"),
        retry_s=_whole_seconds(read.durations("ENGRAM_REDACTION_RETRY", base.retry_s)),
        purge_redis_files=read.switch("ENGRAM_REDIS_PURGE_FILES", base.purge_redis_files),
        reindex_text=read.switch("ENGRAM_REDACTION_REINDEX", base.reindex_text),
        wait_s=read.duration("ENGRAM_REDACTION_WAIT", base.wait_s),
        sweep_after_s=read.duration("ENGRAM_REDACTION_SWEEP_AFTER", base.sweep_after_s),
        max_handovers=read.integer("ENGRAM_REDACTION_MAX_HANDOVERS", base.max_handovers),
    )


def _reembed(read: Env) -> Reembed:
    base = _DEFAULTS.reembed
    return Reembed(
        batch_size=read.integer("ENGRAM_REEMBED_BATCH_SIZE", base.batch_size),
        slice_s=read.duration("ENGRAM_REEMBED_SLICE", base.slice_s),
        # The one duration form, in milliseconds here: ENGRAM_REEMBED_LEASE_TTL=30s.
        lease_ttl_ms=read.duration_ms("ENGRAM_REEMBED_LEASE_TTL", base.lease_ttl_ms, plain=None),
        switch_hold_s=read.duration("ENGRAM_REEMBED_SWITCH_HOLD", base.switch_hold_s),
        resume_after_s=read.duration("ENGRAM_REEMBED_RESUME_AFTER", base.resume_after_s),
        retry_s=_whole_seconds(read.durations("ENGRAM_REEMBED_RETRY", base.retry_s)),
    )


def _whole_seconds(pauses: tuple[float, ...]) -> tuple[int, ...]:
    return tuple(max(1, round(pause)) for pause in pauses)


def parse_duration(value: str, what: str = "duration") -> float | None:
    """A duration given to a command or a form (``--expires 30d``): seconds, or None for
    ``off`` (or ``0``); anything else is an ``InvalidRequestError`` naming ``what``."""
    if is_off(value):
        return None
    try:
        return seconds_of(value)
    except ValueError:
        raise InvalidRequestError(
            f"{what} must be {duration_form(off=True)}, not {value!r}"
        ) from None
