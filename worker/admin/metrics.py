"""Prometheus-style counters kept in Redis, and their text rendering.

Workers add to the hash ``engram:metrics`` (one field per sample, the field
name being the sample's name and labels in Prometheus syntax), and to each
interval's counts (``engram:rate:<interval>``, kept an hour) and each minute's
(``engram:minute:<minute>``, kept 25 hours) for the dashboard's charts, in the
pipeline that acknowledges a batch: the counts of
the batches done since the last write, about once a second (``Tally``).
``render`` reads the totals back, adds the live gauges (stream length,
pending, lag per partition, dead letters, live workers) and returns the text
exposition format. The dashboard samples each partition's lag into the
minute's ``engram:lag:<minute>`` (``record_lag``), kept as long. No memory text
goes here.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from engram.store.backup import ArchiveStatus
from engram.store.models.llm import ModelCall
from engram.worker import keys, layout
from engram.worker.consuming.membership import now_ms
from engram.worker.defaults import RATE_INTERVAL_S, RATE_TTL_S

BATCH_BUCKETS = (1, 4, 16, 64, 256, 1024)
MINUTE_S = 60
# A day of history, and an hour more so the oldest minute of a day's window is whole.
HISTORY_TTL_S = 25 * 3_600

_HELP: dict[str, tuple[str, str]] = {
    "ops_committed_total": ("counter", "Operations applied and committed by the workers."),
    "ops_replayed_total": ("counter", "Operations answered from their stored receipt."),
    "ops_failed_total": ("counter", "Operations refused with a typed error, by code."),
    "dead_lettered_total": ("counter", "Entries moved to the dead-letter stream, by reason."),
    "batch_size": ("histogram", "Entries per committed batch."),
    "batch_seconds_total": ("counter", "Time spent committing batches (embedding included)."),
    "commits_fenced_total": ("counter", "Commits the store refused: the partition was lost."),
    "partitions_acquired_total": ("counter", "Partition leases taken."),
    "partitions_lost_total": ("counter", "Partitions a worker lost instead of releasing them."),
    "stream_length": ("gauge", "Entries in a partition stream (acknowledged ones are deleted)."),
    "stream_pending": ("gauge", "Entries delivered to a worker and not yet acknowledged."),
    "stream_lag": ("gauge", "Entries no worker has read yet."),
    "dead_letters": ("gauge", "Entries in the dead-letter stream."),
    "workers_live": ("gauge", "Workers whose heartbeat is recent."),
    "wal_archived_total": ("counter", "WAL files the database server archived (pg_stat_archiver)."),
    "wal_archive_failed_total": (
        "counter",
        "Failed tries to archive a WAL file (pg_stat_archiver); each is tried again.",
    ),
    "wal_archive_failing": (
        "gauge",
        "1 while the last try to archive a WAL file failed: nothing after it is archived.",
    ),
    "llm_calls_total": ("counter", "Model calls made by the workers, by kind."),
    "llm_failures_total": ("counter", "Model calls that failed, by kind and reason."),
    "llm_prompt_tokens_total": ("counter", "Prompt tokens the model reported, by kind."),
    "llm_completion_tokens_total": ("counter", "Completion tokens the model reported, by kind."),
    "llm_seconds_total": ("counter", "Time spent waiting for model calls, by kind."),
    "auth_refused_total": (
        "counter",
        "Requests refused for their credentials (none, a bad, revoked or expired token),"
        " by door and reason.",
    ),
}


@dataclass(slots=True)
class BatchStats:
    entries: int = 0
    committed: int = 0
    replayed: int = 0
    failed: Counter[str] = field(default_factory=Counter)  # by error code
    dead: Counter[str] = field(default_factory=Counter)  # by reason
    seconds: float = 0.0
    model_calls: list[ModelCall] = field(default_factory=list)


RATE_FIELDS = ("committed", "replayed", "failed", "dead")


@dataclass(frozen=True, slots=True)
class Interval:
    """What the workers did in one interval: its start (seconds since the epoch) and counts."""

    start_s: int
    committed: int = 0
    replayed: int = 0
    failed: int = 0
    dead: int = 0

    @property
    def operations(self) -> int:
        return self.committed + self.replayed + self.failed


@dataclass(frozen=True, slots=True)
class StreamState:
    partition: int
    length: int
    pending: int  # delivered to a worker, not yet acknowledged
    lag: int  # not read by any worker yet
    epoch: int = 0  # the layout epoch of the partition (``layout``)


def record_batch(
    pipe: Any, stats: BatchStats, worker_id: str, *, now_s: float | None = None
) -> None:
    """Add a batch's counts, in the caller's pipeline (so they land with its ack)."""
    record_batches(pipe, [(stats, time.time() if now_s is None else now_s)], worker_id)


def record_batches(pipe: Any, batches: Sequence[tuple[BatchStats, float]], worker_id: str) -> None:
    """Add the counts of ``batches`` (each with when it was done, in seconds since the
    epoch), in the caller's pipeline: one command per counter, however many batches."""
    if not batches:
        return
    m, w = keys.METRICS, keys.worker(worker_id)
    counts: Counter[tuple[str, str]] = Counter()
    seconds = 0.0
    _record_intervals(pipe, batches)
    for stats, _ in batches:
        counts[m, "ops_committed_total"] += stats.committed
        counts[m, "ops_replayed_total"] += stats.replayed
        for code, n in stats.failed.items():
            counts[m, f'ops_failed_total{{code="{code}"}}'] += n
        for reason, n in stats.dead.items():
            counts[m, f'dead_lettered_total{{reason="{reason}"}}'] += n
        for le in BATCH_BUCKETS:
            if stats.entries <= le:
                counts[m, f'batch_size_bucket{{le="{le}"}}'] += 1
        counts[m, 'batch_size_bucket{le="+Inf"}'] += 1
        counts[m, "batch_size_sum"] += stats.entries
        counts[m, "batch_size_count"] += 1
        counts[w, "committed"] += stats.committed
        counts[w, "replayed"] += stats.replayed
        seconds += stats.seconds
    for (key, name), n in counts.items():
        pipe.hincrby(key, name, n)
    pipe.hincrbyfloat(m, "batch_seconds_total", round(seconds, 6))
    _record_model_calls(pipe, [call for stats, _ in batches for call in stats.model_calls])


class Tally:
    """The counts of the batches a consumer has not written yet.

    Counters do not depend on a batch's entries: writing them with every batch
    cost a dozen Redis commands a cycle, most of a small cycle's commands. A
    consumer writes them at most every ``flush_s`` (with a cycle's pipeline), and
    whenever it goes idle, lets a partition go or stops: they lag its receipts
    by about ``flush_s`` at most."""

    def __init__(self, flush_s: float) -> None:
        self.flush_s = flush_s
        self._batches: list[tuple[BatchStats, float]] = []
        self._since = time.monotonic()

    def __bool__(self) -> bool:
        return bool(self._batches)

    def add(self, stats: BatchStats) -> None:
        if not self._batches:
            self._since = time.monotonic()
        self._batches.append((stats, time.time()))

    def take(self, *, due_only: bool) -> list[tuple[BatchStats, float]]:
        """The batches to write now (all of them, or none unless ``flush_s`` has passed
        since the first), forgotten here: the caller writes them (``record_batches``)."""
        if due_only and time.monotonic() - self._since < self.flush_s:
            return []
        batches, self._batches = self._batches, []
        return batches


def _record_model_calls(pipe: Any, calls: list[ModelCall]) -> None:
    """Calls, failures, tokens and time per kind of call (and per reason of failure)."""
    m = keys.METRICS
    counts: Counter[str] = Counter()
    for call in calls:
        kind = f'kind="{call.kind}"'
        counts[f"llm_calls_total{{{kind}}}"] += 1
        if call.failure is not None:
            counts[f'llm_failures_total{{{kind},reason="{call.failure}"}}'] += 1
        if call.usage is not None:
            counts[f"llm_prompt_tokens_total{{{kind}}}"] += call.usage.prompt_tokens
            counts[f"llm_completion_tokens_total{{{kind}}}"] += call.usage.completion_tokens
    for name, n in counts.items():
        pipe.hincrby(m, name, n)
    seconds: dict[str, float] = {}
    for call in calls:
        seconds[call.kind] = seconds.get(call.kind, 0.0) + call.seconds
    for kind, total in seconds.items():
        pipe.hincrbyfloat(m, f'llm_seconds_total{{kind="{kind}"}}', round(total, 6))


def _record_intervals(pipe: Any, batches: Sequence[tuple[BatchStats, float]]) -> None:
    """Each interval's counts (the last hour's chart) and each minute's (the last day's)."""
    for length_s, key_of, ttl_s in (
        (RATE_INTERVAL_S, keys.rate, RATE_TTL_S),
        (MINUTE_S, keys.minute, HISTORY_TTL_S),
    ):
        by_number: dict[int, Counter[str]] = {}
        for stats, now_s in batches:
            counts = by_number.setdefault(int(now_s // length_s), Counter())
            counts["committed"] += stats.committed
            counts["replayed"] += stats.replayed
            counts["failed"] += sum(stats.failed.values())
            counts["dead"] += sum(stats.dead.values())
        for number, counts in by_number.items():
            if not any(counts.values()):
                continue
            key = key_of(number)
            for name, n in counts.items():
                if n:
                    pipe.hincrby(key, name, n)
            pipe.expire(key, ttl_s)


def intervals(
    client: redis.Redis, *, window_s: int = 900, now_s: float | None = None
) -> list[Interval]:
    """The intervals of the last ``window_s`` seconds, oldest first, the current one
    (still filling) last; intervals without work count zero."""
    return _read_counts(client, keys.rate, RATE_INTERVAL_S, window_s, now_s)


def _read_counts(
    client: redis.Redis,
    key_of: Callable[[int], str],
    length_s: int,
    window_s: int,
    now_s: float | None,
) -> list[Interval]:
    last = int((time.time() if now_s is None else now_s) // length_s)
    numbers = range(last - max(window_s // length_s, 1) + 1, last + 1)
    pipe = client.pipeline(transaction=False)
    for n in numbers:
        pipe.hmget(key_of(n), list(RATE_FIELDS))
    return [
        Interval(n * length_s, *(int(_s(v)) if v is not None else 0 for v in values))
        for n, values in zip(numbers, pipe.execute(), strict=True)
    ]


def minutes(
    client: redis.Redis, *, window_s: int = 86_400, now_s: float | None = None
) -> list[Interval]:
    """The minutes of the last ``window_s`` seconds, oldest first, the current one last;
    minutes without work count zero. What survives a restart of the dashboard."""
    return _read_counts(client, keys.minute, MINUTE_S, window_s, now_s)


@dataclass(frozen=True, slots=True)
class LagSample:
    """Each partition's lag as last sampled in one minute (``start_s``); a partition
    missing was not sampled (no dashboard was looking)."""

    start_s: int
    lags: dict[int, int]


def record_lag(
    client: redis.Redis,
    states: Sequence[StreamState],
    *,
    now_s: float | None = None,
    pipe: Any = None,
) -> None:
    """Sample every partition's lag into the current minute (the latest sample of a
    minute stands for it), in ``pipe`` if given (else in one round trip of its own)."""
    if not states:
        return
    key = keys.lag(int((time.time() if now_s is None else now_s) // MINUTE_S))
    target = client.pipeline(transaction=False) if pipe is None else pipe
    target.hset(key, mapping={str(s.partition): s.lag for s in states})
    target.expire(key, HISTORY_TTL_S)
    if pipe is None:
        target.execute()


def lag_samples(
    client: redis.Redis, *, window_s: int = 86_400, now_s: float | None = None
) -> list[LagSample]:
    """The sampled minutes of the last ``window_s`` seconds, oldest first."""
    last = int((time.time() if now_s is None else now_s) // MINUTE_S)
    numbers = range(last - max(window_s // MINUTE_S, 1) + 1, last + 1)
    pipe = client.pipeline(transaction=False)
    for n in numbers:
        pipe.hgetall(keys.lag(n))
    return [
        LagSample(n * MINUTE_S, {int(_s(p)): int(_s(v)) for p, v in raw.items()})
        for n, raw in zip(numbers, pipe.execute(), strict=True)
        if raw
    ]


def stream_states(client: redis.Redis, partitions: int) -> list[StreamState]:
    """Length, pending and lag of every partition stream of the layout in Redis (else of
    ``partitions`` partitions): during a switch, the old epoch's then the new one's."""
    epochs = layout.live_epochs(client, partitions)
    pipe = client.pipeline(transaction=False)
    for epoch in epochs:
        for p in range(epoch.partitions):
            pipe.xlen(epoch.stream(p))
    lengths = iter(pipe.execute())
    states = []
    for epoch in epochs:
        for p in range(epoch.partitions):
            length = int(next(lengths))
            pending, lag = _group_state(client, epoch.stream(p), length)
            states.append(StreamState(p, length, pending, lag, epoch.number))
    return states


def record_partition_event(client: Any, worker_id: str, event: str, reason: str = "") -> None:
    """``acquired`` or ``lost`` (with its reason: fenced, lease_expired, crashed)."""
    pipe = client.pipeline(transaction=False)
    if event == "acquired":
        pipe.hincrby(keys.METRICS, "partitions_acquired_total", 1)
    else:
        pipe.hincrby(keys.METRICS, f'partitions_lost_total{{reason="{reason}"}}', 1)
        pipe.hincrby(keys.worker(worker_id), f"lost_{reason}", 1)
    pipe.execute()


def record_refusal(client: Any, door: str, reason: str) -> None:
    """One request refused for its credentials at ``door`` (api, dashboard, mcp), for
    ``reason`` (a word of the web's own, never the request's)."""
    client.hincrby(keys.METRICS, f'auth_refused_total{{door="{door}",reason="{reason}"}}', 1)


def read_counters(client: redis.Redis) -> dict[str, float]:
    raw = client.hgetall(keys.METRICS)
    return {_s(k): float(_s(v)) for k, v in raw.items()}


def render(
    client: redis.Redis,
    *,
    partitions: int,
    lease_ttl_ms: int,
    archiving: ArchiveStatus | None = None,
) -> str:
    """The Prometheus text exposition of the counters and the live gauges (with the
    database's WAL archiving, when it archives)."""
    counters = read_counters(client)
    if "batch_size_count" in counters:  # a histogram lists every bucket, empty ones too
        for le in BATCH_BUCKETS:
            counters.setdefault(f'batch_size_bucket{{le="{le}"}}', 0.0)
    samples: list[tuple[str, float]] = [(f"engram_{k}", v) for k, v in counters.items()]
    for state in stream_states(client, partitions):
        # Epoch 0's series keep the labels they had before any switch.
        p = f'partition="{state.partition}"' + (f',epoch="{state.epoch}"' if state.epoch else "")
        samples += [
            (f"engram_stream_length{{{p}}}", state.length),
            (f"engram_stream_pending{{{p}}}", state.pending),
            (f"engram_stream_lag{{{p}}}", state.lag),
        ]
    pipe = client.pipeline(transaction=False)
    pipe.xlen(keys.DEAD_LETTERS)
    pipe.zcount(keys.WORKERS, now_ms() - lease_ttl_ms, "+inf")
    dead, live = pipe.execute()
    samples += [("engram_dead_letters", dead), ("engram_workers_live", live)]
    if archiving is not None:
        samples += [
            ("engram_wal_archived_total", archiving.archived),
            ("engram_wal_archive_failed_total", archiving.failed),
            ("engram_wal_archive_failing", int(archiving.failing)),
        ]
    return _exposition(samples)


def _group_state(client: redis.Redis, stream: str, length: int) -> tuple[int, int]:
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:  # no stream yet
        return 0, 0
    for g in groups:
        if _s(g.get("name", b"")) == keys.GROUP:
            pending = int(g.get("pending", 0))
            lag = g.get("lag")
            # Acknowledged entries are deleted, so whatever is neither pending
            # nor deleted is unread: the lag, when Redis cannot tell it.
            return pending, int(lag) if lag is not None else max(length - pending, 0)
    return 0, length


def _exposition(samples: list[tuple[str, float]]) -> str:
    by_family: dict[str, list[str]] = {}
    for name, value in sorted(samples, key=_order):
        base = name.split("{", 1)[0].removeprefix("engram_")
        family = base
        for suffix in ("_bucket", "_sum", "_count"):
            if base.endswith(suffix) and base.removesuffix(suffix) in _HELP:
                family = base.removesuffix(suffix)
        text = str(int(value)) if float(value).is_integer() else repr(float(value))
        by_family.setdefault(family, []).append(f"{name} {text}")
    lines = []
    for family, rows in by_family.items():
        kind, help_text = _HELP.get(family, ("untyped", family))
        lines += [f"# HELP engram_{family} {help_text}", f"# TYPE engram_{family} {kind}", *rows]
    return "\n".join(lines) + "\n"


def _order(sample: tuple[str, float]) -> tuple[str, float, str]:
    """By family, buckets by increasing bound (``+Inf`` last), then by name."""
    name = sample[0]
    bound = name.partition('le="')[2].partition('"')[0]
    return name.split("{", 1)[0], float(bound.replace("+Inf", "inf")) if bound else 0.0, name


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
