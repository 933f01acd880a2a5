"""The one environment reader (``engram.store.env``), and the old forms every
settings reader that used its own still takes."""

from __future__ import annotations

import pytest

from engram.mcp.settings import McpSettings
from engram.store import LLMConfig
from engram.store.env import Env, parse_duration
from engram.store.errors import ConfigError
from engram.web.config import WebConfig
from engram.web.ratelimit import RateLimits
from engram.worker.settings import Settings

V = "ENGRAM_SOMETHING"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("30d", 30 * 86400.0),
        ("1.5m", 90.0),
        (" 2 H ", 7200.0),
        ("0s", 0.0),
    ],
)
def test_a_duration_is_a_number_and_a_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert Env({V: text}).duration(V, 1.0) == seconds
    assert Env({V: text}).duration_ms(V, 1) == round(seconds * 1000)


def test_a_plain_number_is_in_the_variables_own_unit_and_only_where_it_has_one() -> None:
    assert Env({V: "5000"}).duration_ms(V, 1) == 5000  # plain="ms", the *_MS variables
    assert Env({V: "2.5"}).duration(V, 1.0, plain="s") == 2.5
    with pytest.raises(ConfigError, match=f"{V} must be a number and a unit"):
        Env({V: "30"}).duration(V, 1.0)


def test_unset_empty_or_blank_is_the_default() -> None:
    for env in ({}, {V: ""}, {V: "  "}):
        read = Env(env)
        assert read.integer(V, 7) == 7 and read.duration(V, 2.0) == 2.0
        assert read.duration_ms(V, 9) == 9 and read.duration_or_off(V, None) is None
        assert read.durations(V, (1.0,)) == (1.0,) and read.switch(V, True) is True
        assert read.text(V, "d") == (env.get(V) or "d")


def test_off_turns_off_only_what_may_be_turned_off() -> None:
    for off in ("off", "0", "OFF", "none"):
        assert Env({V: off}).duration_or_off(V, 5.0) is None
    assert Env({V: "12h"}).duration_or_off(V, None) == 43200.0
    with pytest.raises(ConfigError, match=V):
        Env({V: "off"}).duration(V, 5.0)


def test_lists() -> None:
    assert Env({V: " a, b ,,c "}).items(V, ("x",)) == ("a", "b", "c")
    assert Env({V: ""}).items(V, ("x",)) == ()  # set and empty: none
    assert Env({}).items(V, ("x",)) == ("x",)
    assert Env({V: "10s, 1m, off"}).durations(V, ()) == (10.0, 60.0)


def test_integers_and_switches() -> None:
    assert Env({V: " 12 "}).integer(V, 1) == 12
    assert Env({V: "3"}).integer(V, 1, minimum=3) == 3
    assert [Env({V: v}).switch(V, False) for v in ("on", "true", "yes", "1")] == [True] * 4
    assert [Env({V: v}).switch(V, True) for v in ("off", "false", "no", "0")] == [False] * 4


@pytest.mark.parametrize(
    ("read", "value", "accepted"),
    [
        (lambda e: e.integer(V, 1), "many", "a whole number"),
        (lambda e: e.integer(V, 1), "1.5", "a whole number"),
        (lambda e: e.integer(V, 1, minimum=1), "0", "at least 1"),
        (lambda e: e.duration(V, 1.0), "thirty days", "a number and a unit"),
        (lambda e: e.duration(V, 1.0), "30 days", "a number and a unit"),
        (lambda e: e.duration(V, 1.0), "-1h", "a number and a unit"),
        (lambda e: e.duration(V, 1.0), "5w", "a number and a unit"),
        (lambda e: e.duration(V, 1.0, plain="s"), "soon", "or a number of seconds"),
        (lambda e: e.duration_ms(V, 1), "-5", "or a number of milliseconds"),
        (lambda e: e.duration_ms(V, 1), "9" * 400, "a number and a unit"),
        (lambda e: e.duration_or_off(V, 1.0), "never", "or off"),
        (lambda e: e.durations(V, ()), "10s,soon", "a number and a unit"),
        (lambda e: e.switch(V, True), "maybe", "on or off"),
    ],
)
def test_a_bad_value_is_a_config_error_naming_the_variable_and_what_it_accepts(
    read: object, value: str, accepted: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        read(Env({V: value}))  # type: ignore[operator]
    assert refused.value.message.startswith(f"{V} must be ")
    assert accepted in refused.value.message and refused.value.code == "not_configured"


# The forms each reader took before there was one reader, and still takes.


# A worker variable, its old plain form, the same in the one duration form.
WORKER_FORMS = [
    ("ENGRAM_LEASE_TTL_MS", "5000", "5s"),
    ("ENGRAM_LEASE_MARGIN_MS", "400", "400ms"),
    ("ENGRAM_BLOCK_MS", "250", "250ms"),
    ("ENGRAM_LINGER_MS", "0", "0ms"),
    ("ENGRAM_REPLY_TTL_S", "60", "1m"),
    ("ENGRAM_LLM_DEADLINE_S", "2.5", "2500ms"),
]


def test_the_workers_millisecond_and_second_variables_keep_their_plain_numbers() -> None:
    old = Settings.from_env({name: plain for name, plain, _ in WORKER_FORMS}).worker
    new = Settings.from_env({name: unit for name, _, unit in WORKER_FORMS}).worker
    assert old == new
    assert (old.lease_ttl_ms, old.lease_margin_ms, old.block_ms) == (5000, 400, 250)
    assert (old.reply_ttl_s, old.llm_deadline_s) == (60, 2.5)
    with pytest.raises(ConfigError, match="ENGRAM_LEASE_TTL_MS"):
        Settings.from_env({"ENGRAM_LEASE_TTL_MS": "five seconds"})


def test_the_model_the_dashboard_and_mcp_keep_their_forms() -> None:
    llm = {"ENGRAM_LLM_URL": "http://127.0.0.1:1/v1", "ENGRAM_LLM_MODEL": "m"}
    config = LLMConfig.from_env({**llm, "ENGRAM_LLM_TIMEOUT_S": "2.5"})
    assert config is not None and config.timeout_s == 2.5
    config = LLMConfig.from_env({**llm, "ENGRAM_LLM_TIMEOUT_S": "1m"})
    assert config is not None and config.timeout_s == 60.0
    with pytest.raises(ConfigError, match="ENGRAM_LLM_TIMEOUT_S"):
        LLMConfig.from_env({**llm, "ENGRAM_LLM_TIMEOUT_S": "soon"})
    token = {"ENGRAM_DASHBOARD_TOKEN": "an-operator-token"}  # a dashboard needs one
    assert (
        WebConfig.from_env({**token, "ENGRAM_WEB_STATEMENT_TIMEOUT": "off"}).statement_timeout_s
        is None
    )
    assert WebConfig.from_env({**token, "ENGRAM_DASHBOARD_PORT": "8800"}).port == 8800
    with pytest.raises(ConfigError, match="ENGRAM_DASHBOARD_PORT"):
        WebConfig.from_env({**token, "ENGRAM_DASHBOARD_PORT": "eighty"})
    for wait in ("2", "2s", "2000ms"):
        assert McpSettings.from_env({"ENGRAM_MCP_WAIT_S": wait}).wait_s == 2.0
    with pytest.raises(ConfigError, match="ENGRAM_MCP_WAIT_S"):
        McpSettings.from_env({"ENGRAM_MCP_WAIT_S": "2 minutes"})
    mcp = McpSettings.from_env(
        {"ENGRAM_MCP_SESSIONS_PER_TOKEN": "4", "ENGRAM_MCP_SESSION_IDLE": "90s"}
    )
    assert (mcp.sessions_per_token, mcp.session_idle_s, mcp.max_sessions) == (4, 90.0, 1000)
    for name, bad in (
        ("ENGRAM_MCP_SESSIONS_PER_TOKEN", "0"),
        ("ENGRAM_MCP_SESSION_IDLE", "0"),
        ("ENGRAM_MCP_SESSION_IDLE", "2d"),
        ("ENGRAM_MCP_MAX_SESSIONS", "none"),
    ):
        with pytest.raises(ConfigError, match=name):
            McpSettings.from_env({name: bad})
    assert WebConfig.from_env({**token, "ENGRAM_TOKEN_READS_PER_MINUTE": "off"}).rate_limits == (
        RateLimits(None, 300)
    )
