"""The MCP server's settings, read once from the environment."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from engram.store.errors import ConfigError

# How long a write waits for its receipt before it answers "queued" (ENGRAM_MCP_WAIT_S).
WAIT_S = 5.0
# The longest bound that may be set: a client's own request timeout is usually 60 s.
MAX_WAIT_S = 55.0


@dataclass(frozen=True, slots=True)
class McpSettings:
    wait_s: float = WAIT_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> McpSettings:
        env = os.environ if env is None else env
        raw = env.get("ENGRAM_MCP_WAIT_S", "").strip()
        if not raw:
            return cls()
        try:
            wait_s = float(raw.removesuffix("s"))
        except ValueError:
            raise ConfigError(f"ENGRAM_MCP_WAIT_S must be seconds, not {raw!r}") from None
        if not math.isfinite(wait_s) or not 0 <= wait_s <= MAX_WAIT_S:
            raise ConfigError(f"ENGRAM_MCP_WAIT_S must be from 0 to {MAX_WAIT_S:g} seconds")
        return cls(wait_s=wait_s)
