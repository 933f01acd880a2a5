"""Per-token rate limits: how many reads and how many writes a scoped token may make
in a minute, on the API and over MCP together (``ENGRAM_TOKEN_READS_PER_MINUTE``,
``ENGRAM_TOKEN_WRITES_PER_MINUTE``; ``off`` lifts one). The operator is never limited.

A token may spend its minute's allowance at once, then one more request every
``60 / limit`` seconds (the generic cell rate algorithm: one timestamp per token and
kind, ``keys.token_rate``). Kept in Redis and updated by one script, so every process
serving the token shares it and no two requests race. A token past its limit is
refused with ``RateLimitedError`` (429 with ``Retry-After``: the seconds until it may
ask again) before any work; other tokens' allowances are their own, so it holds no
one else back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import redis

from engram.store.env import Env, is_off
from engram.store.tokens import Grant
from engram.worker import keys

from .errors import RateLimitedError

# What a token may do in a minute by default: well above an agent's pace (a
# conversation's recall and a few writes), well below what would crowd out others.
READS_PER_MINUTE = 600
WRITES_PER_MINUTE = 300
WRITES = frozenset({"remember", "extract", "revise", "retract", "forget"})

# KEYS[1]: the token's timestamp (ms: when its allowance is whole again).
# ARGV: ms between two requests at the limit, the allowance.
# Answers 0 (taken) or the ms to wait. The server's clock: one clock for every process.
TAKE_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local every, allowance = tonumber(ARGV[1]), tonumber(ARGV[2])
local full = tonumber(redis.call('GET', KEYS[1]) or '0')
if full < now then full = now end
local next_full = full + every
local wait = next_full - allowance * every - now
if wait > 0 then return wait end
redis.call('SET', KEYS[1], next_full, 'PX', next_full - now + 1000)
return 0
"""


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Per token and per minute; None: no limit."""

    reads_per_minute: int | None = READS_PER_MINUTE
    writes_per_minute: int | None = WRITES_PER_MINUTE

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RateLimits:
        return cls(
            reads_per_minute=_limit(env, "ENGRAM_TOKEN_READS_PER_MINUTE", READS_PER_MINUTE),
            writes_per_minute=_limit(env, "ENGRAM_TOKEN_WRITES_PER_MINUTE", WRITES_PER_MINUTE),
        )


def _limit(env: Mapping[str, str] | None, name: str, default: int) -> int | None:
    read = Env(env)
    value = read.optional(name)
    if value is not None and is_off(value):
        return None
    return read.integer(name, default, minimum=1)


class Limiter:
    """Counts a token's requests and refuses those past its limit."""

    def __init__(self, client: redis.Redis, limits: RateLimits) -> None:
        self.limits = limits
        self._take = client.register_script(TAKE_SCRIPT)

    def take(self, grant: Grant | None, capability: str) -> None:
        """Count one request of ``grant`` needing ``capability`` (a write's or a read's);
        ``RateLimitedError`` past the limit. None (the operator, stdio): not counted."""
        if grant is None:
            return
        writes = capability in WRITES
        limit = self.limits.writes_per_minute if writes else self.limits.reads_per_minute
        if limit is None:
            return
        kind = "writes" if writes else "reads"
        every_ms = math.ceil(60_000 / limit)
        wait_ms = int(
            self._take(keys=[keys.token_rate(grant.token_id, kind)], args=[every_ms, limit])
        )
        if wait_ms > 0:
            retry_after_s = max(1, math.ceil(wait_ms / 1000))
            raise RateLimitedError(
                f"this token made its {limit} {kind} a minute: try again in {retry_after_s} s"
                f" (ENGRAM_TOKEN_{kind.upper()}_PER_MINUTE)",
                retry_after_s=retry_after_s,
            )
