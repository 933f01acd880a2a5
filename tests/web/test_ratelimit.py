"""Per-token rate limits through the real doors (``engram web``, its API and ``/mcp``):
a token past its reads or writes of the minute is refused (429 with Retry-After on the
API, a ``rate_limited`` tool error over MCP) and nothing is done, while another token's
requests and the operator's go through; the limits read from the environment."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from engram.store import Operation, Store, WriteResult
from engram.store.errors import ConfigError
from engram.web.ratelimit import RateLimits
from engram.worker import keys
from tests.mcp_support import http_session, ok, refused, run, server_env
from tests.redis_fixtures import FAST
from tests.web_fixtures import EMBEDDER, Served

OPERATOR = "the-operators-dashboard-token-0123"


@pytest.fixture
def served(
    store: Store, dsn: str, redis_url: str, tmp_path: Path, serve_web: Callable[..., Served]
) -> Served:
    env = server_env(
        dsn,
        redis_url,
        tmp_path / "home",
        ENGRAM_DASHBOARD_TOKEN=OPERATOR,
        ENGRAM_TOKEN_READS_PER_MINUTE="3",
        ENGRAM_TOKEN_WRITES_PER_MINUTE="2",
    )
    return serve_web(database_url=dsn, redis_url=redis_url, env=env)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def remembered(store: Store, scope: dict[str, str], text: str) -> str:
    [made] = store.execute([Operation.build("remember", scope, {"text": text})], EMBEDDER)
    assert isinstance(made, WriteResult)
    return made.records[0].id


def entries_added(client: redis.Redis) -> int:
    """Operations ever enqueued on the partition streams (what a refusal leaves as it was)."""
    added = 0
    for p in range(FAST.partitions):
        with contextlib.suppress(redis.ResponseError):  # no such stream: none added
            added += int(client.xinfo_stream(keys.stream(p))["entries-added"])
    return added


def test_a_token_past_its_reads_gets_429_and_another_token_does_not(
    served: Served, store: Store
) -> None:
    ada_rec = remembered(store, {"user_id": "rl-ada"}, "Ada likes tea.")
    bob_rec = remembered(store, {"user_id": "rl-bob"}, "Bob likes coffee.")
    ada, _ = store.tokens.create("rl-ada", {"user_id": "rl-ada"}, by="test")
    bob, _ = store.tokens.create("rl-bob", {"user_id": "rl-bob"}, by="test")

    def get(record: str, headers: dict[str, str]) -> httpx.Response:
        return httpx.get(f"{served.url}/api/v1/records/{record}", headers=headers, timeout=10)

    assert [get(ada_rec, bearer(ada)).status_code for _ in range(3)] == [200, 200, 200]
    over = get(ada_rec, bearer(ada))
    assert over.status_code == 429
    error = over.json()["error"]
    assert error["code"] == "rate_limited" and "Ada likes tea" not in over.text
    assert 1 <= int(over.headers["retry-after"]) <= 20  # 60 s / 3: the next read's turn
    assert error["retry_after_s"] == int(over.headers["retry-after"])
    # Another token's reads are its own; the operator is never limited.
    assert get(bob_rec, bearer(bob)).status_code == 200
    assert all(get(ada_rec, bearer(OPERATOR)).status_code == 200 for _ in range(5))
    # Recall and history count as reads too; ada is still refused.
    recall = httpx.post(
        f"{served.url}/api/v1/recall", headers=bearer(ada), json={"text": "tea"}, timeout=10
    )
    assert recall.status_code == 429
    # Nothing was read for the refused requests: the log holds the three that answered.
    assert len(store.tokens.reads_by_token("rl-ada")) == 3


def test_a_token_past_its_writes_enqueues_nothing_and_mcp_answers_a_tool_error(
    served: Served, store: Store, redis_client: Any
) -> None:
    ada, _ = store.tokens.create("rl-writer", {"user_id": "rl-writer"}, by="test")
    bob, _ = store.tokens.create("rl-other", {"user_id": "rl-other"}, by="test")

    def write(secret: str, text: str) -> httpx.Response:
        body = {"kind": "remember", "request": {"text": text}}
        return httpx.post(
            f"{served.url}/api/v1/operations", headers=bearer(secret), json=body, timeout=10
        )

    assert [write(ada, f"note {n}").status_code for n in range(2)] == [202, 202]
    before = entries_added(redis_client)
    over = write(ada, "one too many")
    assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limited"
    assert int(over.headers["retry-after"]) >= 1
    assert entries_added(redis_client) == before

    async def main() -> None:
        # Over MCP, the same allowance: ada's write is a tool error, bob's is not.
        async with http_session(served.url + "/mcp", ada) as s:
            error = await refused(s, "remember", text="still too many")
            assert error["code"] == "rate_limited" and error["retry_after_s"] >= 1
        async with http_session(served.url + "/mcp", bob) as s:
            assert (await ok(s, "remember", text="bob's note"))["state"] in ("queued", "committed")

    run(main)
    assert entries_added(redis_client) == before + 1  # bob's only


def test_the_limits_are_read_from_the_environment() -> None:
    assert RateLimits.from_env({}) == RateLimits(600, 300)
    limits = RateLimits.from_env(
        {"ENGRAM_TOKEN_READS_PER_MINUTE": "off", "ENGRAM_TOKEN_WRITES_PER_MINUTE": "12"}
    )
    assert limits == RateLimits(None, 12)
    assert RateLimits.from_env({"ENGRAM_TOKEN_WRITES_PER_MINUTE": "0"}).writes_per_minute is None
    for bad in ("-1", "many", "1.5"):
        with pytest.raises(ConfigError):
            RateLimits.from_env({"ENGRAM_TOKEN_READS_PER_MINUTE": bad})
