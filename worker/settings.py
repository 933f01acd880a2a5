"""Settings, read once from the environment into a typed object and passed explicitly."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engram.store import LLMConfig
from engram.store.backup import LEDGER
from engram.store.env import Env
from engram.store.ledger import ForgetLedger
from engram.store.masking import MASKED_URL, masked_repr
from engram.worker import defaults


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How a stream worker runs; every worker sharing the streams must agree on ``partitions``."""

    partitions: int = defaults.PARTITIONS
    batch_size: int = defaults.BATCH_SIZE
    block_ms: int = defaults.BLOCK_MS
    linger_ms: int = defaults.LINGER_MS
    lease_ttl_ms: int = defaults.LEASE_TTL_MS
    lease_margin_ms: int = defaults.LEASE_MARGIN_MS
    max_deliveries: int = defaults.MAX_DELIVERIES
    reply_ttl_s: int = defaults.REPLY_TTL_S
    llm_concurrency: int = defaults.LLM_CONCURRENCY
    llm_deadline_s: float = defaults.LLM_DEADLINE_S
    llm_max_held: int = defaults.LLM_MAX_HELD

    def __post_init__(self) -> None:
        if self.linger_ms < 0:
            raise ValueError("linger_ms must not be negative")
        if self.partitions < 1 or self.batch_size < 1 or self.max_deliveries < 1:
            raise ValueError("partitions, batch_size and max_deliveries must be at least 1")
        if self.partitions > defaults.MAX_PARTITIONS:
            raise ValueError(
                f"partitions (ENGRAM_PARTITIONS) must be at most {defaults.MAX_PARTITIONS}"
            )
        if self.llm_concurrency < 1 or self.llm_deadline_s <= 0 or self.llm_max_held < 1:
            raise ValueError(
                "llm_concurrency and llm_max_held must be at least 1, llm_deadline_s positive"
            )
        if not 0 <= self.lease_margin_ms < self.lease_ttl_ms // 2:
            raise ValueError("lease_margin_ms must be below half of lease_ttl_ms")

    @property
    def tick_s(self) -> float:
        """How often a worker beats, renews its leases and rebalances."""
        return min(max(self.lease_ttl_ms / 5000, 0.05), 1.0)


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    database_url: str | None = field(metadata=MASKED_URL)
    redis_url: str | None = field(metadata=MASKED_URL)
    # A streaming replica (or several) of database_url's database, for the reads that
    # allow it (docs/read-replica.md); None: every read on database_url.
    database_read_url: str | None = field(default=None, metadata=MASKED_URL)
    # The one Redis server (never a cluster: RQ cannot use one) the jobs live on: their
    # queues, schedule, pause and inbox. None: redis_url's, when that is no cluster.
    jobs_redis_url: str | None = field(default=None, metadata=MASKED_URL)
    embedder: str = "wordllama"
    # Embedders of your own, by name: "name=package.module:factory,..." (store.registry).
    embedders: str = ""
    workers: int = defaults.UP_WORKERS
    db_pool_size: int = defaults.DB_POOL_SIZE
    worker: WorkerConfig = WorkerConfig()
    # Replicas that must hold an entry before an enqueue returns (WAIT); 0: none.
    wait_replicas: int = 0
    llm: LLMConfig | None = None  # ENGRAM_LLM_URL and the rest (``LLMConfig.from_env``)
    # Where base backups and the WAL archive go (docs/backups.md); None: no archiving.
    backup_dir: Path | None = None
    # How many base backups (``7``) or how old (``14d``, ``36h``) ``engram backup`` keeps.
    backup_keep: str = defaults.BACKUP_KEEP
    # The forget ledger's directory (ENGRAM_FORGET_LEDGER_DIR); None: ``home/ledger``.
    forget_ledger_dir: Path | None = None

    __repr__ = masked_repr

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        read = Env(env)
        backup_dir = read.optional("ENGRAM_BACKUP_DIR")
        ledger_dir = read.optional("ENGRAM_FORGET_LEDGER_DIR")
        return cls(
            home=Path(read.text("ENGRAM_HOME", ".engram")),
            database_url=read.optional("DATABASE_URL"),
            redis_url=read.optional("REDIS_URL"),
            database_read_url=read.optional("DATABASE_READ_URL"),
            jobs_redis_url=read.optional("ENGRAM_JOBS_REDIS_URL"),
            embedder=read.text("ENGRAM_EMBEDDER", _DEFAULTS.embedder),
            embedders=read.text("ENGRAM_EMBEDDERS", _DEFAULTS.embedders),
            workers=read.integer("ENGRAM_WORKERS", defaults.UP_WORKERS),
            db_pool_size=read.integer("ENGRAM_DB_POOL_SIZE", defaults.DB_POOL_SIZE),
            worker=_worker_config(read),
            wait_replicas=read.integer("ENGRAM_WAIT_REPLICAS", _DEFAULTS.wait_replicas),
            llm=LLMConfig.from_env(read.env),
            backup_dir=Path(backup_dir) if backup_dir else None,
            backup_keep=read.text("ENGRAM_BACKUP_KEEP", defaults.BACKUP_KEEP),
            forget_ledger_dir=Path(ledger_dir) if ledger_dir else None,
        )

    @property
    def ledger_dir(self) -> Path:
        """Where the forget ledger is kept (store.ledger): outside the database."""
        return self.forget_ledger_dir or self.home / "ledger"

    def ledger(self) -> ForgetLedger:
        """The forget ledger, appended to beside the backups too when there are any
        (``ENGRAM_BACKUP_DIR/ledger``: the backups carry it, docs/backups.md)."""
        mirror = self.backup_dir / LEDGER if self.backup_dir is not None else None
        return ForgetLedger(self.ledger_dir, mirror=mirror)


# The defaults Settings.from_env falls back on that are not in ``worker.defaults``.
_DEFAULTS = Settings(home=Path(".engram"), database_url=None, redis_url=None)


def _worker_config(read: Env) -> WorkerConfig:
    """``ENGRAM_LEASE_TTL_MS`` and the other ``*_MS`` take ``500ms``, ``5s``..., or a
    plain number of milliseconds as they always did; ``*_S``, a plain number of seconds."""
    lease_ttl_ms = read.duration_ms("ENGRAM_LEASE_TTL_MS", defaults.LEASE_TTL_MS)
    # Unset, the margin is also at most a fifth of the lease, so a short lease keeps one.
    margin_ms = min(defaults.LEASE_MARGIN_MS, lease_ttl_ms // 5)
    return WorkerConfig(
        partitions=read.integer("ENGRAM_PARTITIONS", defaults.PARTITIONS),
        batch_size=read.integer("ENGRAM_BATCH_SIZE", defaults.BATCH_SIZE),
        block_ms=read.duration_ms("ENGRAM_BLOCK_MS", defaults.BLOCK_MS),
        linger_ms=read.duration_ms("ENGRAM_LINGER_MS", defaults.LINGER_MS),
        lease_ttl_ms=lease_ttl_ms,
        lease_margin_ms=read.duration_ms("ENGRAM_LEASE_MARGIN_MS", margin_ms),
        max_deliveries=read.integer("ENGRAM_MAX_DELIVERIES", defaults.MAX_DELIVERIES),
        reply_ttl_s=math.ceil(read.duration("ENGRAM_REPLY_TTL_S", defaults.REPLY_TTL_S, plain="s")),
        llm_concurrency=read.integer("ENGRAM_LLM_CONCURRENCY", defaults.LLM_CONCURRENCY),
        llm_deadline_s=read.duration("ENGRAM_LLM_DEADLINE_S", defaults.LLM_DEADLINE_S, plain="s"),
        llm_max_held=read.integer("ENGRAM_LLM_MAX_HELD", defaults.LLM_MAX_HELD),
    )
