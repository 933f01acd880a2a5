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
# Sessions one token may hold open at once over HTTP (ENGRAM_MCP_SESSIONS_PER_TOKEN): a
# few agents or restarts' worth. Past it, that token's initialize is refused, no other's.
SESSIONS_PER_TOKEN = 16
# A session with no request for this long is closed and its memory freed
# (ENGRAM_MCP_SESSION_IDLE; the SDK's default is 30 minutes). A client whose session
# was closed opens a new one (its SDK does so on the 404).
SESSION_IDLE_S = 300.0
# Sessions the whole server holds open at once, whatever the tokens (ENGRAM_MCP_MAX_SESSIONS).
MAX_SESSIONS = 1000


@dataclass(frozen=True, slots=True)
class McpSettings:
    wait_s: float = WAIT_S
    sessions_per_token: int = SESSIONS_PER_TOKEN
    session_idle_s: float = SESSION_IDLE_S
    max_sessions: int = MAX_SESSIONS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> McpSettings:
        read = Env(env)
        wait_s = read.duration("ENGRAM_MCP_WAIT_S", WAIT_S, plain="s")
        if not 0 <= wait_s <= MAX_WAIT_S:
            raise ConfigError(f"ENGRAM_MCP_WAIT_S must be from 0 to {MAX_WAIT_S:g} seconds")
        idle_s = read.duration("ENGRAM_MCP_SESSION_IDLE", SESSION_IDLE_S, plain="s")
        if not 0 < idle_s <= 86_400:
            raise ConfigError("ENGRAM_MCP_SESSION_IDLE must be more than 0 and at most a day")
        return cls(
            wait_s=wait_s,
            sessions_per_token=read.integer(
                "ENGRAM_MCP_SESSIONS_PER_TOKEN", SESSIONS_PER_TOKEN, minimum=1
            ),
            session_idle_s=idle_s,
            max_sessions=read.integer("ENGRAM_MCP_MAX_SESSIONS", MAX_SESSIONS, minimum=1),
        )
