"""``engram tokens create|list|revoke``, in this process: the secret printed once, the
list never showing one, a revoked token refused, bad input refused with exit 2."""

from __future__ import annotations

import json
import re

import pytest

from engram.cli import main
from engram.store import Store
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.redis_fixtures import FAST


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, dsn: str, redis_url: str) -> None:
    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    monkeypatch.setenv("COLUMNS", "200")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_create_list_and_revoke(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "tokens", "create", "--scope", '{"user_id": "ada"}', "--name", "agent-ada",
        "--can", "recall,get", "--expires", "30d", "--by", "grace",
    )  # fmt: skip
    assert code == 0, err
    (secret,) = re.findall(r"egt_[A-Za-z0-9_-]{43}", out)
    assert "shown this once" in err
    grant = store.tokens.verify(secret)
    assert grant is not None and grant.scope == {"user_id": "ada"}
    assert grant.can == {"recall", "get"} and grant.expires_at is not None
    code, out, _ = run(capsys, "tokens", "list")
    assert code == 0 and "agent-ada" in out and "live" in out and secret not in out
    code, out, _ = run(capsys, "tokens", "list", "--json")
    (listed,) = [t for t in json.loads(out) if t["name"] == "agent-ada"]
    assert listed["can"] == ["recall", "get"] and listed["created_by"] == "grace"
    assert secret not in out
    code, out, _ = run(capsys, "tokens", "revoke", "agent-ada", "--by", "grace")
    assert code == 0 and "revoked" in out
    assert store.tokens.verify(secret) is None
    assert [a.action for a in store.audit.about("token:agent-ada")] == [
        "token.create",
        "token.revoke",
    ]
    code, out, _ = run(capsys, "tokens", "list", "--json")
    assert next(t for t in json.loads(out) if t["name"] == "agent-ada")["revoked_by"] == "grace"


def test_create_json_prints_the_secret_once(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "tokens", "create", "--scope", '{"user_id": "bob"}', "--name", "agent-bob", "--json"
    )
    assert code == 0
    made = json.loads(out)
    assert made["token"].startswith("egt_") and made["expires_at"] is None
    assert store.tokens.verify(made["token"]) is not None


def test_bad_input_is_refused_and_creates_nothing(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        ("--scope", "{}", "--name", "agent-x"),
        ("--scope", "not json", "--name", "agent-x"),
        ("--scope", '{"user_id": "x"}', "--name", "agent-x", "--can", "recall,sudo"),
        ("--scope", '{"user_id": "x"}', "--name", "agent-x", "--expires", "soon"),
    ):
        code, _, err = run(capsys, "tokens", "create", *argv)
        assert code == 2, argv
    assert store.tokens.get("agent-x") is None
    run(capsys, "tokens", "create", "--scope", '{"user_id": "x"}', "--name", "agent-twice")
    code, _, err = run(
        capsys, "tokens", "create", "--scope", '{"user_id": "y"}', "--name", "agent-twice"
    )
    assert code == 1 and "exists" in err
    code, _, err = run(capsys, "tokens", "revoke", "agent-nobody")
    assert code == 1 and "no token" in err
