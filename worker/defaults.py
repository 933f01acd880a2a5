"""The worker's defaults, in one place.

These are read from the environment, once, by ``Settings.from_env``
(``worker.settings``), each from its variable:

- ``PARTITIONS``: ``ENGRAM_PARTITIONS`` (the count of layout epoch 0; once
  ``engram repartition`` has run, the layout in Redis wins);
- ``BATCH_SIZE``: ``ENGRAM_BATCH_SIZE``;
- ``BLOCK_MS``: ``ENGRAM_BLOCK_MS``;
- ``LINGER_MS``: ``ENGRAM_LINGER_MS``;
- ``LEASE_TTL_MS``: ``ENGRAM_LEASE_TTL_MS``;
- ``LEASE_MARGIN_MS``: ``ENGRAM_LEASE_MARGIN_MS`` (unset, it is also at most a
  fifth of the lease TTL);
- ``MAX_DELIVERIES``: ``ENGRAM_MAX_DELIVERIES``;
- ``REPLY_TTL_S``: ``ENGRAM_REPLY_TTL_S``;
- ``DB_POOL_SIZE``: ``ENGRAM_DB_POOL_SIZE``;
- ``UP_WORKERS``: ``ENGRAM_WORKERS``;
- ``LLM_CONCURRENCY``: ``ENGRAM_LLM_CONCURRENCY``;
- ``LLM_DEADLINE_S``: ``ENGRAM_LLM_DEADLINE_S``;
- ``LLM_MAX_HELD``: ``ENGRAM_LLM_MAX_HELD``;
- ``BACKUP_KEEP``: ``ENGRAM_BACKUP_KEEP``.

The others are read by no variable:

- ``STREAM_MAX_LEN`` is only a default: a ``Producer`` (and the dead-letter retry)
  takes ``stream_max_len``;
- ``MAX_PARTITIONS``, ``LINGER_BELOW``, ``STRAY_CHECK_S``, ``BACKOFF_MIN_S``,
  ``BACKOFF_MAX_S``, ``MAX_ENTRY_BYTES``, ``RATE_INTERVAL_S``, ``RATE_TTL_S`` and
  ``METRICS_FLUSH_S`` are fixed: changing one is changing the code.

``tests/test_architecture.py`` checks both lists against this module and against
``Settings.from_env``.
"""

# Partition streams. Changing ENGRAM_PARTITIONS while operations are queued (and no
# layout is in Redis yet) sends a scope's later operations to another stream: drain
# the streams first, or switch online with ``engram repartition`` (``layout``).
PARTITIONS = 16
# The most partition streams a layout may have (``ENGRAM_PARTITIONS``, ``engram
# repartition P``): every worker tick, producer layout and dashboard poll loops over
# them, and a hundred times today's load needs 1,024 (docs/scale-out.md).
MAX_PARTITIONS = 1_024

# Entries read (and committed in one transaction) per partition and batch.
BATCH_SIZE = 256
# How long a partition's blocking read waits for new entries: also the
# longest a stopping worker waits before it can exit.
BLOCK_MS = 500
# Off by default: how long a worker waits, after a read that found fewer than
# LINGER_BELOW entries, for more to arrive before it commits them (one cycle for
# more operations, so less CPU per operation at a light load, and that much
# more latency; docs/benchmarks.md measures both).
LINGER_MS = 0
LINGER_BELOW = 16

# A partition lease lives this long unless renewed (every third of it); a dead
# worker's partitions are taken over after at most about this long.
LEASE_TTL_MS = 5_000
# A worker stops committing for a partition this long before its lease would
# run out, so a lease that is about to be lost is never relied on to the edge.
LEASE_MARGIN_MS = 500

# How often a worker looks for entries of its partitions left pending to another
# consumer (one that read them after its lease ran out) and claims them.
STRAY_CHECK_S = 1.0

# An entry delivered this many times without a commit (its workers crashed or
# lost the partition each time) is dead-lettered instead of tried again.
MAX_DELIVERIES = 5

# Replies (receipts or errors) stay in Redis this long for ``wait``.
REPLY_TTL_S = 3_600

# The producer refuses to enqueue (``QueueFullError``) on a partition stream
# holding this many unprocessed entries, instead of letting Redis trim them.
STREAM_MAX_LEN = 100_000

# Back-off after a PostgreSQL or Redis failure: doubles up to the maximum.
BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 5.0

# Connections a worker process's store pool may open.
DB_POOL_SIZE = 8

# Worker processes ``engram up`` runs.
UP_WORKERS = 2

# The largest ``op`` field a producer may send or a worker will parse.
MAX_ENTRY_BYTES = 8 * 1024 * 1024

# The model phase (reconciliation, extraction with inference; see ``models``):
# model calls a worker runs at once, on as many threads. Each call takes one
# for its whole length, so a worker makes at most this many per model latency.
LLM_CONCURRENCY = 32
# How long an operation's model phase may take, queueing for a thread, the
# candidates' read and every call and retry included, before it fails
# (model_unavailable, reason deadline).
LLM_DEADLINE_S = 30.0
# Operations a partition may hold while they, or one before them in their
# scope, wait for a model; past it, the partition is not read until some go.
LLM_MAX_HELD = 2_048
# The workers count what they do per interval of this many seconds (the
# dashboard's operations/s chart), and keep each interval's counts this long.
RATE_INTERVAL_S = 10
RATE_TTL_S = 3_600
# A worker writes its counters at most this often (and whenever it goes idle or
# stops): they lag its receipts by about this long, and a small cycle pays no
# Redis commands for them.
METRICS_FLUSH_S = 1.0
# The base backups ``engram backup`` keeps (a count, or an age such as 14d or 36h;
# the archived WAL older than the oldest kept goes with the rest).
BACKUP_KEEP = "7"
