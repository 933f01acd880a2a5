"""Shared helpers for the benchmarks: a scratch PostgreSQL and summary statistics."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import psycopg

from store.server import EmbeddedPostgres

WORDS = [
    "ada",
    "bob",
    "tea",
    "coffee",
    "london",
    "paris",
    "river",
    "stone",
    "jazz",
    "violin",
    "garden",
    "meeting",
    "report",
    "friday",
    "monday",
    "budget",
    "travel",
    "train",
    "flight",
    "hotel",
    "doctor",
    "dentist",
    "birthday",
    "gift",
    "book",
    "film",
    "song",
    "recipe",
    "pasta",
    "salad",
    "running",
    "cycling",
    "swimming",
    "office",
    "project",
    "deadline",
    "invoice",
    "client",
    "server",
    "deploy",
    "database",
    "backup",
    "holiday",
    "winter",
    "summer",
    "rain",
    "snow",
    "mountain",
    "lake",
    "city",
]


def sentences(n: int, seed: int = 1) -> list[str]:
    """Distinct synthetic sentences over a small vocabulary: clustered in meaning."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(WORDS), size=(n, 6))
    return [f"{' '.join(WORDS[j] for j in row)} {i}." for i, row in enumerate(picks)]


def scratch_postgres() -> EmbeddedPostgres:
    return EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="engram-bench-")))


def fresh_database(server: EmbeddedPostgres, name: str) -> str:
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.dsn(name)


def percentile(values: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(values), p))


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
