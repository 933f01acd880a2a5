"""Shared helpers for the benchmarks: a scratch PostgreSQL and summary statistics."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg

from engram.store.server import EmbeddedPostgres


def vocabulary() -> list[str]:
    """Real English word pieces from the default embedder's tokenizer, most frequent first."""
    import wordllama

    path = Path(wordllama.__file__).parent / "tokenizers" / "l2_supercat_tokenizer_config.json"
    vocab = json.loads(path.read_text())["model"]["vocab"]
    return [
        word[1:]
        for word, _ in sorted(vocab.items(), key=lambda item: item[1])
        if word.startswith("\u2581") and re.fullmatch(r"[a-z]{3,12}", word[1:])
    ]


def sentences(n: int, seed: int = 1, words: int = 10) -> list[str]:
    """Distinct synthetic sentences whose word frequencies follow Zipf's law, like text."""
    vocab = vocabulary()
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    ranks = rng.choice(len(vocab), size=(n, words), p=weights / weights.sum())
    return [f"{' '.join(vocab[r] for r in row)} {seed}x{i}" for i, row in enumerate(ranks)]


def scratch_postgres() -> EmbeddedPostgres:
    return EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="engram-bench-")))


def discard(server: EmbeddedPostgres) -> None:
    """Stop a ``scratch_postgres`` and delete its folder (a large run leaves gigabytes)."""
    server.stop()
    shutil.rmtree(server.data_dir.parent, ignore_errors=True)


def fresh_database(server: EmbeddedPostgres, name: str) -> str:
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.dsn(name)


@dataclass(frozen=True, slots=True)
class CpuShares:
    """Shares of the machine's CPU time over an interval (all CPUs, idle included)."""

    busy: float  # user, nice, system, irq and softirq: every process counts
    stolen: float  # steal: time the hypervisor ran something else on these CPUs


class MachineCpu:
    """How the machine's CPUs were used between construction and ``shares``
    (Linux: /proc/stat). The benchmark's own producers count as busy too; stolen
    time shows how much of the host another tenant had meanwhile."""

    def __init__(self) -> None:
        self._start = _cpu_ticks()

    def shares(self) -> CpuShares | None:
        end = _cpu_ticks()
        if self._start is None or end is None:
            return None
        busy, stolen, total = (e - s for s, e in zip(self._start, end, strict=True))
        return CpuShares(busy / total, stolen / total) if total else None


def _cpu_ticks() -> tuple[int, int, int] | None:
    """(busy, stolen, all) ticks since boot."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6], ticks[7], sum(ticks)


def percentile(values: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(values), p))


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


class TreeCpu:
    """CPU time (user + system) used by some processes and all their descendants
    between construction and ``seconds`` (Linux: /proc/<pid>/stat through psutil).
    Children that exited meanwhile count too (their reaped time, on the parent),
    so a PostgreSQL server's backends are counted whether they lived or not."""

    def __init__(self, roots: Sequence[int]) -> None:
        self.roots = list(roots)
        self._start = _tree_seconds(self.roots)

    def seconds(self) -> float:
        return _tree_seconds(self.roots) - self._start


def _tree_seconds(roots: Sequence[int]) -> float:
    import psutil  # type: ignore[import-untyped]

    total = 0.0
    for pid in roots:
        try:
            root = psutil.Process(pid)
            times = root.cpu_times()
            total += times.children_user + times.children_system
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
    return total
