"""The jobs' settings, from the environment."""

from __future__ import annotations

import pytest

from engram.jobs.settings import JobsSettings, parse_duration
from engram.store.errors import ConfigError, InvalidRequestError


def test_defaults() -> None:
    s = JobsSettings.from_env({})
    assert (s.retention.history_s, s.retention.receipts_s) == (30 * 86400, None)
    assert s.retention.dead_letters_s == 14 * 86400 and s.retention.every_s == 3600
    assert s.redaction.listeners == ("redis", "postgres", "webhook")
    assert s.redaction.retry_s == (10, 60, 300) and s.redaction.reindex_text
    assert (s.reembed.batch_size, s.reembed.slice_s, s.reembed.lease_ttl_ms) == (64, 60, 30_000)


def test_values() -> None:
    s = JobsSettings.from_env(
        {
            "ENGRAM_RETAIN_RECEIPTS": "90d",
            "ENGRAM_RETAIN_HISTORY": "off",
            "ENGRAM_FORGET_LISTENERS": "postgres, my.module:hook",
            "ENGRAM_REDACTION_RETRY": "off",
            "ENGRAM_REEMBED_SLICE": "1.5m",
            "ENGRAM_REEMBED_LEASE_TTL": "1500ms",
            "ENGRAM_REEMBED_RETRY": "500ms,2m",
            "ENGRAM_RETAIN_DEAD_LETTERS": "0",
            "ENGRAM_REDIS_PURGE_FILES": "off",
            "ENGRAM_JOBS_TICK": "0.2s",
        }
    )
    assert s.retention.receipts_s == 90 * 86400 and s.retention.history_s is None
    assert s.redaction.listeners == ("postgres", "my.module:hook")
    assert s.redaction.retry_s == ()
    assert s.reembed.slice_s == 90 and s.reembed.lease_ttl_ms == 1500
    assert s.reembed.retry_s == (1, 120) and s.retention.dead_letters_s is None
    assert not s.redaction.purge_redis_files and s.tick_s == 0.2
    assert JobsSettings.from_env({"ENGRAM_FORGET_LISTENERS": ""}).redaction.listeners == ()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ENGRAM_FORGET_LISTENERS", "redis,carrier-pigeon"),
        ("ENGRAM_RETAIN_HISTORY", "30"),
        ("ENGRAM_RETAIN_HISTORY", "thirty days"),
        ("ENGRAM_PRUNE_EVERY", "-1h"),
        ("ENGRAM_JOBS_TICK", "off"),
        ("ENGRAM_REEMBED_LEASE_TTL", "30"),
        ("ENGRAM_REDACTION_REINDEX", "of"),
    ],
)
def test_bad_values_are_refused(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        JobsSettings.from_env({name: value})


def test_durations() -> None:
    assert parse_duration("45s") == 45 and parse_duration("2h") == 7200
    assert parse_duration("off") is None and parse_duration("0") is None
    assert parse_duration("500ms") == 0.5
    with pytest.raises(InvalidRequestError, match="--expires"):
        parse_duration("soon", "--expires")
