"""Shared helpers for the benchmarks: a scratch PostgreSQL and summary statistics."""

from __future__ import annotations

import json
import re
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import psycopg

from store.server import EmbeddedPostgres


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


def fresh_database(server: EmbeddedPostgres, name: str) -> str:
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.dsn(name)


class MachineCpu:
    """How busy the machine's CPUs were between ``start`` and ``busy`` (Linux: /proc/stat).

    Busy is user, nice, system, irq and softirq time over all time, steal and
    idle included: every process counts (the benchmark's own producers too).
    """

    def __init__(self) -> None:
        self._start = _cpu_ticks()

    def busy(self) -> float | None:
        end = _cpu_ticks()
        if self._start is None or end is None:
            return None
        busy, total = (e - s for s, e in zip(self._start, end, strict=True))
        return busy / total if total else None


def _cpu_ticks() -> tuple[int, int] | None:
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4] - ticks[7], sum(ticks)


def percentile(values: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(values), p))


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
