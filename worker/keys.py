"""Every Redis key engram's streams use, in one place.

Per-partition keys carry the partition as a Redis Cluster hash tag, so a
partition's stream, closure, lease and fencing counter live in one slot and a
script may touch them together. The partitions of layout epoch 0 (every
deployment before ``engram repartition`` first ran) are tagged ``{N}``; those of
epoch ``E`` > 0 are tagged ``{eE.N}`` (``layout``). Keys that span partitions
(workers, metrics, dead letters, the layout) are read and written with
single-key commands.
"""

from __future__ import annotations

import hashlib

PREFIX = "engram"

# The consumer group every worker reads the partition streams through.
GROUP = "engram-workers"

# XADD here: one entry per operation, field ``op`` (see ``protocol``).
DEAD_LETTERS = f"{PREFIX}:dead"
# ZSET worker id -> last heartbeat (ms since the epoch).
WORKERS = f"{PREFIX}:workers"
# HASH of counters; field names carry Prometheus labels (see ``metrics``).
METRICS = f"{PREFIX}:metrics"
# HASH partition number -> JSON ``{"by", "at_ms", "reason"}``: the partitions no
# worker reads nor claims until they are resumed (``pause``). Producers still XADD.
PAUSED = f"{PREFIX}:paused"
# STRING JSON ``{"by", "at_ms", "reason"}``: who paused the jobs queues and why. The
# pause itself is RQ's own suspension key (``rq:suspended``), which RQ's workers honour.
PAUSED_JOBS = f"{PREFIX}:paused:jobs"
# STRING JSON ``{"epoch", "partitions", "previous"}``: how many partition streams there
# are and which epoch's keys they use (``layout``). Absent: epoch 0 with the configured
# count (``ENGRAM_PARTITIONS``).
LAYOUT = f"{PREFIX}:layout"
# HASH epoch number -> its partition count: the epochs a repartition replaced whose
# keys are not all retired yet (``layout.retire``). Written when a switch begins.
RETIRING = f"{PREFIX}:retiring"


def _tag(partition: int, epoch: int) -> str:
    return f"{{{partition}}}" if epoch == 0 else f"{{e{epoch}.{partition}}}"


def stream(partition: int, epoch: int = 0) -> str:
    """STREAM of the partition's operations; once its epoch is retired (``layout``), a
    STRING saying where to send instead, so that an ``XADD`` to it fails (WRONGTYPE)."""
    return f"{PREFIX}:ops:{_tag(partition, epoch)}"


def closed(partition: int, epoch: int = 0) -> str:
    """STRING, set once by ``engram repartition``: producers add nothing more to the
    partition's stream (their script refuses, in the stream's slot)."""
    return f"{PREFIX}:closed:{_tag(partition, epoch)}"


def lease(partition: int, epoch: int = 0) -> str:
    """STRING ``<worker id> <token>`` with a TTL: who may commit the partition."""
    return f"{PREFIX}:lease:{_tag(partition, epoch)}"


def fence_counter(partition: int, epoch: int = 0) -> str:
    """INCR'd at every acquisition: the fencing token the store checks."""
    return f"{PREFIX}:fence:{_tag(partition, epoch)}"


def fence_name(partition: int, epoch: int = 0) -> str:
    """The name of the partition's fence in PostgreSQL (``engram_fences``)."""
    return f"partition:{partition}" if epoch == 0 else f"partition:e{epoch}.{partition}"


def reply(scope_key: str, operation_id: str) -> str:
    """LIST holding the one reply of an operation (a receipt or an error), with a TTL.

    An operation id identifies an operation within its scope: the key carries a digest
    of the scope's key (``Scope.key``) before the id, so the same id in another scope
    has another reply, and the key names no scope field."""
    return f"{PREFIX}:reply:{scope_tag(scope_key)}:{operation_id}"


def scope_tag(scope_key: str) -> str:
    """A fixed-length digest of a scope's key, for the keys that belong to one scope."""
    return hashlib.sha256(scope_key.encode()).hexdigest()[:32]


def rate(interval: int) -> str:
    """HASH of what the workers did in one interval of ``RATE_INTERVAL_S`` seconds
    (``interval`` = seconds since the epoch // that length): operations committed,
    replayed, failed and dead-lettered. Expires after ``RATE_TTL_S``."""
    return f"{PREFIX}:rate:{interval}"


def minute(number: int) -> str:
    """HASH of what the workers did in one minute (``number`` = seconds since the epoch
    // 60), the fields of ``rate``'s. Expires after ``metrics.HISTORY_TTL_S`` (25 h): the
    overview's last 24 hours, which outlive a restart of the dashboard."""
    return f"{PREFIX}:minute:{number}"


def lag(minute_number: int) -> str:
    """HASH partition -> its lag as the dashboard last sampled it in that minute
    (``minute_number`` as ``minute``'s). Expires after ``metrics.HISTORY_TTL_S``."""
    return f"{PREFIX}:lag:{minute_number}"


def token_rate(token_id: int, kind: str) -> str:
    """STRING: when (ms since the epoch) a scoped token's ``kind`` (reads or writes)
    allowance is whole again, whichever door its requests came by; expires then
    (``web.ratelimit``)."""
    return f"{PREFIX}:token-rate:{token_id}:{kind}"


def worker(worker_id: str) -> str:
    """HASH: a live worker's host, pid, partitions, last beat and counters."""
    return f"{PREFIX}:worker:{worker_id}"


def signin_spent(nonce: str) -> str:
    """STRING set once when the dashboard's one-time sign-in link of this nonce (hex)
    signed someone in (``web.signin``); expires when the link would have."""
    return f"{PREFIX}:signin:spent:{nonce}"
