"""The MCP server's settings, read once from the environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engram.store.env import Env
from engram.store.errors import ConfigError

# How long a write waits for its receipt before it answers "queued" (ENGRAM_MCP_WAIT_S:
# ``5s``, ``500ms``, or a number of seconds).
WAIT_S = 5.0
# The longest bound that may be set: a client's own request timeout is usually 60 s.
MAX_WAIT_S = 55.0


@dataclass(frozen=True, slots=True)
class McpSettings:
    wait_s: float = WAIT_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> McpSettings:
        wait_s = Env(env).duration("ENGRAM_MCP_WAIT_S", WAIT_S, plain="s")
        if not 0 <= wait_s <= MAX_WAIT_S:
            raise ConfigError(f"ENGRAM_MCP_WAIT_S must be from 0 to {MAX_WAIT_S:g} seconds")
        return cls(wait_s=wait_s)
